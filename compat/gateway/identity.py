"""The bridge's device identity at the gateway: an Ed25519 key (``cryptography``), and the device
tokens the gateway issued to it.

* ``device.id`` is the SHA-256 (hex) of the raw 32-byte public key; ``publicKey`` and
  ``signature`` are base64url without padding (the gateway's ``device-identity`` format).
* The key lives in a PEM (PKCS #8) file; one that does not exist is generated and written with
  owner-only permissions (0600, in a 0700 folder). A key file that others can read is refused.
* Device tokens are kept in ``<key file>.tokens.json`` (0600), one per gateway URL and role.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

log = logging.getLogger(__name__)


class IdentityError(Exception):
    """The identity file cannot be used (the message names the file and why)."""


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class DeviceIdentity:
    """An Ed25519 device identity: ``device_id``, ``public_key`` (base64url) and :meth:`sign`."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.device_id = hashlib.sha256(raw).hexdigest()
        self.public_key = b64url(raw)

    def sign(self, payload: str) -> str:
        """The base64url Ed25519 signature of the UTF-8 ``payload``."""
        return b64url(self._key.sign(payload.encode("utf-8")))

    @classmethod
    def load_or_create(cls, path: Path) -> DeviceIdentity:
        """The identity in ``path``, generated and written (0600) when the file does not exist.

        Raises:
            IdentityError: the file is not an Ed25519 PEM key, others may read it, or it cannot
                be written.
        """
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return cls._create(path)
        except OSError as exc:
            raise IdentityError(f"gateway.identityFile {path}: {exc.strerror}") from None
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise IdentityError(
                f"gateway.identityFile {path}: other users may read this private key (mode {oct(mode & 0o777)}); "
                "run chmod 600 on it"
            )
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise IdentityError(
                f"gateway.identityFile {path}: not a PEM private key without a password ({exc})"
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise IdentityError(f"gateway.identityFile {path}: not an Ed25519 key")
        return cls(key)

    @classmethod
    def _create(cls, path: Path) -> DeviceIdentity:
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        try:
            _write_private(path, pem)
        except OSError as exc:
            raise IdentityError(f"gateway.identityFile {path}: cannot write a new identity: {exc.strerror}") from None
        log.info("gateway: created a new device identity in %s", path)
        return cls(key)


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, readable by the owner only (folder 0700)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")  # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def credential_tag(credential: str) -> str:
    """Names a shared credential without holding it: 16 hex digits of its SHA-256 ("" for none)."""
    return hashlib.sha256(credential.encode()).hexdigest()[:16] if credential else ""


class DeviceTokens:
    """The device tokens the gateway issued, per gateway URL and role (a JSON file, 0600).

    A file that cannot be read or parsed counts as empty (the bridge then authenticates with the
    shared credential and stores the next token it is given).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text("utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, url: str, role: str, credential: str = "") -> str:
        """The device token issued while ``credential`` (the shared token or password) was
        configured; "" when there is none, or it was issued under another credential (an
        operator who changes ``gateway.token`` gets the new one used, and refused if wrong)."""
        entry = self._read().get(f"{url}|{role}")
        if not isinstance(entry, dict) or entry.get("credential", "") != credential_tag(credential):
            return ""
        token = entry.get("deviceToken")
        return token if isinstance(token, str) else ""

    def put(self, url: str, role: str, token: str, scopes: list[str], credential: str = "") -> None:
        data = self._read()
        data[f"{url}|{role}"] = {"deviceToken": token, "scopes": scopes, "credential": credential_tag(credential)}
        self._write(data)

    def drop(self, url: str, role: str) -> None:
        data = self._read()
        if data.pop(f"{url}|{role}", None) is not None:
            self._write(data)

    def _write(self, data: dict[str, Any]) -> None:
        try:
            _write_private(self.path, json.dumps(data, indent=1).encode())
        except OSError as exc:
            log.warning("gateway: cannot store the device token in %s: %s", self.path, exc.strerror)
