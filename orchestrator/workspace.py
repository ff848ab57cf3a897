"""Workspace policy: where turns may run and which files they may attach (docs/api.md
"session.start": ``workingDirectory`` and ``attachments`` resolve, symlinks followed, inside the
workspace roots), and the remote workspaces of clients on other machines ("Remote workspaces").

Must not import: ``bridge`` (except ``bridge.rpc``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.rpc.errors import InvalidParams, LimitReached
from compat.base import Attachment

if TYPE_CHECKING:  # pydantic: the params models are imported on first use (compat.settings)
    from orchestrator.models import AttachmentParam

log = logging.getLogger(__name__)
_MAX_SHOWN = 600  # characters of a client's path quoted back in an error
SIZE_WALK_ENTRIES = 200_000  # entries a size check reads at most (then the folder counts as full)


class Workspace:
    """The workspace roots, the remote workspaces, and the checks every turn's paths pass.

    Args:
        roots: resolved absolute folders (``workspaceRoots``).
        remote_root: where remote workspaces live (``remoteWorkspaceRoot``, resolved); a path
            inside it is never a turn's working directory unless it is the caller's own folder.
        remote: ``remoteWorkspaces``: a ``workingDirectory`` outside every root runs the turn in
            the caller's remote folder instead of being refused.
        remote_max_bytes: ``limits.maxRemoteWorkspaceBytes``, checked before each turn there.
    """

    def __init__(
        self,
        roots: Sequence[Path],
        *,
        remote_root: Path | None = None,
        remote: bool = False,
        remote_max_bytes: int = 1 << 30,
    ) -> None:
        self.roots = list(roots)
        self.remote_root = remote_root
        self.remote = remote and remote_root is not None
        self.remote_max_bytes = remote_max_bytes

    def warn_missing(self) -> None:
        for root in self.roots:
            if not root.is_dir():
                log.warning("workspace root %s does not exist: turns cannot run there", root)
        if self.remote and self.remote_root is not None and self.contains(self.remote_root):
            log.warning(
                "remote workspaces are under workspace root %s: the bridge keeps clients out of each "
                "other's folders, but agents run as this user and can read them; set remoteWorkspaceRoot "
                "outside workspaceRoots (or run one bridge per user) for isolation",
                next(r for r in self.roots if _within(self.remote_root, r)),
            )

    def working_directory(self, requested: str | None, principal: str = "local", session_id: str = "") -> str:
        """The resolved directory a turn runs in (default: the first root that exists).

        A path outside every root is refused with one message whether or not it exists (no
        existence oracle); with remote workspaces on, it runs the turn in the caller's remote
        folder (:meth:`remote_folder`, created on first use).

        Raises:
            InvalidParams: -32602 (``field: workingDirectory``), outside the roots (or another
                principal's or session's remote folder), inside a root but not an existing
                directory, or no root exists.
        """
        if requested is None:
            for root in self.roots:
                if root.is_dir():
                    return str(root)
            raise InvalidParams("no workspace root exists; create one or fix workspaceRoots", field="workingDirectory")
        real = _resolve(requested, "workingDirectory")
        outside = InvalidParams(
            f"workingDirectory is outside the workspace roots: {requested}"[:_MAX_SHOWN], field="workingDirectory"
        )
        if self.remote_root is not None and _within(real, self.remote_root):
            own = self.remote_folder(principal, session_id)
            if self.remote and _within(real, own) and real.is_dir():
                return str(real)  # its own remote folder (the app sends it back as a hint)
            raise outside
        if self.contains(real):
            if not real.is_dir():
                raise InvalidParams(
                    f"workingDirectory is not an existing directory: {requested}"[:_MAX_SHOWN], field="workingDirectory"
                )
            return str(real)
        if self.remote:  # created once the turn is admitted (prepare_remote)
            return str(self.remote_folder(principal, session_id))
        raise outside

    def remote_folder(self, principal: str, session_id: str) -> Path:
        """The remote folder of ``(principal, session_id)``: its name is a hash of both, never
        client text. Raises AssertionError without a ``remote_root``."""
        assert self.remote_root is not None
        digest = hashlib.sha256(f"{principal}\0{session_id}".encode("utf-8", "surrogatepass")).hexdigest()
        return self.remote_root / digest[:32]

    def is_remote(self, path: str) -> bool:
        """Whether ``path`` (a turn's resolved working directory) is in a remote workspace."""
        return self.remote_root is not None and _within(Path(path), self.remote_root)

    def below_a_root(self, path: str) -> bool:
        """Whether ``path`` lies inside a root and is not a root itself (``returnArtifacts`` never
        lists a whole root such as the home directory)."""
        real = Path(path)
        return any(root in real.parents for root in self.roots)

    def prepare_remote(self, path: str) -> None:
        """Create the remote folder ``path`` (mode 0700) when it does not exist, and refuse a turn
        there once it holds ``remote_max_bytes`` or more (blocking: it walks the folder, without
        following links, at most :data:`SIZE_WALK_ENTRIES` entries).

        Raises:
            LimitReached: -32006 with ``data.limit: "maxRemoteWorkspaceBytes"``.
        """
        Path(path).mkdir(mode=0o700, parents=True, exist_ok=True)
        used = folder_bytes(Path(path), stop_at=self.remote_max_bytes)
        if used >= self.remote_max_bytes:
            raise LimitReached(
                f"the session's remote workspace is full ({self.remote_max_bytes} bytes): close the session to free it",
                limit="maxRemoteWorkspaceBytes",
                value=self.remote_max_bytes,
            )

    def remove_remote(self, principal: str, session_id: str) -> None:
        """Remove the remote folder of ``(principal, session_id)``, if any (blocking)."""
        if self.remote_root is None:
            return
        folder = self.remote_folder(principal, session_id)
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder, ignore_errors=True)

    def usable_attachments(
        self, items: Sequence[AttachmentParam], principal: str = "local", session_id: str = ""
    ) -> dict[int, Attachment]:
        """The entries whose path is usable on this host (it resolves, symlinks followed, to an
        existing file or folder inside a root, and not into another principal's or session's
        remote folder), by index; the others need an inline copy (``orchestrator.attachments``)."""
        out = {}
        own = self.remote_folder(principal, session_id) if self.remote_root is not None else None
        for index, item in enumerate(items):
            if not item.path:
                continue
            try:
                real = Path(os.path.expanduser(item.path)).resolve()
            except (ValueError, OSError):
                continue  # NUL bytes, over-long: not usable here
            if self.remote_root is not None and _within(real, self.remote_root):
                if own is None or not _within(real, own) or not real.exists():
                    continue
            elif not self.contains(real) or not real.exists():
                continue
            out[index] = Attachment(item.name or real.name, str(real), item.description)
        return out

    def contains(self, path: Path) -> bool:
        return any(path == root or root in path.parents for root in self.roots)


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def folder_bytes(folder: Path, stop_at: int) -> int:
    """The bytes of the files under ``folder`` (links not followed), counting stops once
    ``stop_at`` is reached or :data:`SIZE_WALK_ENTRIES` entries were read (then ``stop_at``)."""
    total, seen, stack = 0, 0, [folder]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > SIZE_WALK_ENTRIES:
                return stop_at
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
            if total >= stop_at:
                return total
    return total


def _resolve(path: str, field: str) -> Path:
    """``realpath`` of a client path; NUL bytes and over-long paths are -32602, not crashes."""
    try:
        return Path(os.path.expanduser(path)).resolve()
    except (ValueError, OSError) as exc:
        raise InvalidParams(f"{field} is not a usable path", field=field) from exc
