"""The knowledge registry's file: registered sources and the runtime connection, on disk.

``<stateDir>/knowledge-registry.json`` holds ``{"version": 1, "sources": [...], "runtime":
{baseUrl, model, apiKey, timeoutSeconds} | null}``. It carries an API key, so it is written with
owner-only permissions (0600, in a folder made 0700) and replaced atomically (a temporary file in
the same folder, fsync, rename): a crash leaves the old file or the new one, never half of one.
Sources are kept raw here and validated by ``compat.knowledge.registry`` on load, so one entry
that no longer passes the policy does not lose the others.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path
from typing import Any

import msgspec

log = logging.getLogger(__name__)

REGISTRY_FILE = "knowledge-registry.json"
FILE_VERSION = 1
FILE_MODE = 0o600
DIR_MODE = 0o700
MAX_FILE_BYTES = 4 * 1024 * 1024


class RuntimeConnection(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The registered OpenAI-compatible runtime; ``api_key`` never leaves the bridge."""

    base_url: str
    model: str
    api_key: str = ""
    timeout_seconds: float = 60.0


class RegistryData(msgspec.Struct, kw_only=True, rename="camel"):
    version: int = FILE_VERSION
    sources: list[dict[str, Any]] = msgspec.field(default_factory=list)
    runtime: RuntimeConnection | None = None


class RegistryFile:
    """Reads and writes one registry file.

    Args:
        path: the file (its folder is made on the first write).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> RegistryData:
        """The stored registry; empty when there is no file. A file that cannot be read as a
        registry is moved aside to ``<name>.bad`` (logged) and the registry starts empty."""
        try:
            with open(self.path, "rb") as f:
                if stat.S_IMODE(os.fstat(f.fileno()).st_mode) & 0o077:
                    log.warning("%s was readable by others; it is now owner-only", self.path)
                    os.fchmod(f.fileno(), FILE_MODE)
                raw = f.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return RegistryData()
        try:
            if len(raw) > MAX_FILE_BYTES:
                raise ValueError("too large")
            data = msgspec.json.decode(raw, type=RegistryData)
            if data.version != FILE_VERSION:
                raise ValueError(f"version {data.version}")
            return data
        except (msgspec.DecodeError, ValueError) as exc:
            bad = self.path.with_name(self.path.name + ".bad")
            log.warning("the knowledge registry %s is unreadable (%s); moved to %s", self.path, exc, bad.name)
            os.replace(self.path, bad)
            return RegistryData()

    def save(self, data: RegistryData) -> None:
        """Write ``data`` atomically, owner-only.

        Raises:
            OSError: the folder or file cannot be written (the old file stays as it was).
        """
        folder = self.path.parent
        folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        tmp = folder / f".{self.path.name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), FILE_MODE)  # O_CREAT's mode is only for a new file
                f.write(msgspec.json.encode(data))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
