"""What a child is given and what the bridge keeps of what it says: its allow-listed environment,
and the bounded, redacted tail of its stderr (field-failures.md #13).

Secrets in stderr: the tail is redacted as a whole and only then cut to the size a client sees,
and every cut starts on a line boundary (:func:`cut_tail`), so no part of a secret that a cut
would split is ever shown.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from bridge.rpc.redact import redact, register_env_secrets

ENV_ALLOW = (
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "TZ",
    "TMPDIR",
    "SSL_CERT_FILE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
)
ENV_ALLOW_PREFIXES = ("LC_", "XDG_")
ENV_NEVER = frozenset({"BRIDGE_AUTH_TOKEN"})
"""Never handed to a child, even when an operator lists it: it would let the agent drive us."""
_BLANK = re.compile(r"\s")


def child_env(
    env: Mapping[str, str] | None = None,
    passthrough: Sequence[str] = (),
    *,
    parent: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Build a child environment from an allow-list instead of inheriting ours.

    Args:
        env: Provider ``env`` values; they win over inherited ones. Values under secret-looking
            names are registered with the redactor.
        passthrough: Extra variable names copied from ``parent`` (provider ``envPassthrough``).
        parent: The environment to copy from; defaults to ``os.environ``.

    Returns:
        The allow-listed variables, the passthrough names and ``env``, minus :data:`ENV_NEVER`.
    """
    parent = os.environ if parent is None else parent
    out = {name: value for name, value in parent.items() if name in ENV_ALLOW or name.startswith(ENV_ALLOW_PREFIXES)}
    for name in passthrough:
        if name in parent:
            out[name] = parent[name]
    out.update(env or {})
    # Configured values of 8 characters or more are secrets whatever their names; passed-through
    # ones only under secret-looking names (registering every path would redact it everywhere).
    register_env_secrets({name: parent[name] for name in passthrough if name in parent}, from_config=False)
    register_env_secrets(dict(env or {}))
    for name in ENV_NEVER:
        out.pop(name, None)
    return out


def cut_tail(text: str, max_bytes: int) -> str:
    """The end of ``text`` in at most ``max_bytes`` UTF-8 bytes, starting on a line boundary.

    The first, partial line of the cut is dropped (when the cut holds no newline: up to the first
    whitespace, and with none, everything), so a secret the cut would split never shows in part.
    Redact ``text`` before cutting it.
    """
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    if max_bytes <= 0:
        return ""
    kept = data[-max_bytes:].decode("utf-8", "ignore")  # "ignore": a split first character
    if data[-max_bytes - 1 : -max_bytes] == b"\n":
        return kept  # the cut fell on a line boundary
    return _drop_partial_head(kept)


def _drop_partial_head(text: str) -> str:
    newline = text.find("\n")
    if newline >= 0:
        return text[newline + 1 :]
    blank = _BLANK.search(text)
    return text[blank.end() :] if blank else ""


class StderrTail:
    """The last ``max_bytes`` of a child's stderr.

    Args:
        max_bytes: how much to keep (``Limits.stderr_tail_bytes``).
    """

    __slots__ = ("_cut", "_data", "_max", "total")

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._data = bytearray()
        self._cut = False  # bytes were dropped: the first kept line may be partial
        self.total = 0
        """Bytes received in all."""

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self._data += chunk
        excess = len(self._data) - self._max
        if excess > 0:
            self._cut = self._data[excess - 1] != 0x0A  # not cut on a line boundary
            del self._data[:excess]

    def text(self, max_bytes: int | None = None) -> str:
        """The kept tail, redacted, in at most ``max_bytes`` UTF-8 bytes (default: all kept)."""
        text = self._data.decode("utf-8", "replace")
        if self._cut:
            text = _drop_partial_head(text)
        text = redact(text)
        return text if max_bytes is None else cut_tail(text, max_bytes)
