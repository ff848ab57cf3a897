"""One redactor for every client-visible error, diagnostic and log line.

It removes bearer tokens, API keys, credentials in URLs, and any secret the bridge registered
(its own auth tokens, provider ``env`` values). Pure functions, no I/O.

Must not import anything outside the standard library.
"""

from __future__ import annotations

import re
import threading

_MASK = "[REDACTED]"
_PATTERNS = (
    # (pattern, replacement, needles): a pattern runs only on text that holds one of its needles
    # (casefolded). The regexes are slow on long text (80 µs for a 450-character step detail,
    # several per knowledge turn); most text holds no needle at all.
    # scheme://user:pass@host → scheme://[REDACTED]@host
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+(?::[^/\s@]*)?@"), r"\1" + _MASK + "@", ("@",)),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{6,}"), r"\1 " + _MASK, ("bearer", "basic")),
    (re.compile(r"\b(sk|pk|rk)-[A-Za-z0-9_-]{8,}"), _MASK, ("sk-", "pk-", "rk-")),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{20,}"), _MASK, ("aiza",)),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), _MASK, ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
    (
        re.compile(
            r"(?i)\b([A-Z0-9_]*(?:api[_-]?key|token|secret|password|passwd)[A-Z0-9_]*)"
            r"(\s*[=:]\s*[\"']?)([^\s\"',;&]{4,})"
        ),
        r"\1\2" + _MASK,
        ("key", "token", "secret", "passw"),
    ),
)

_secrets: set[str] = set()
_lock = threading.Lock()
_secret_re: re.Pattern[str] | None = None


def register_secret(value: str | None) -> None:
    """Add a literal value (min. 4 characters) that must never appear in any output."""
    global _secret_re
    if not value or len(value) < 4:
        return
    with _lock:
        if value in _secrets:
            return
        _secrets.add(value)
        ordered = sorted(_secrets, key=len, reverse=True)
        _secret_re = re.compile("|".join(re.escape(s) for s in ordered))


_SECRET_NAME = re.compile(r"(?i)key|token|secret|passw|credential|auth")


CONFIG_SECRET_CHARS = 8
"""A value the configuration injects into a child's environment is a secret from this length."""


def register_env_secrets(env: dict[str, str], *, from_config: bool = True) -> None:
    """Register environment values a child gets as secrets.

    Args:
        env: ``{name: value}``.
        from_config: the values come from the configuration (a provider's or profile's ``env``):
            each of :data:`CONFIG_SECRET_CHARS` characters or more is a secret whatever its
            variable's name (an operator's key is not always in ``*_API_KEY``). Otherwise
            (passed through from the bridge's environment) only those of variables whose names
            look secret (``*KEY*``, ``*TOKEN*`` …): paths and flags stay readable.
    """
    for name, value in env.items():
        if _SECRET_NAME.search(name) or (from_config and len(value) >= CONFIG_SECRET_CHARS):
            register_secret(value)


def redact(text: str) -> str:
    """Return ``text`` with every known secret shape replaced by ``[REDACTED]``."""
    if not text:
        return text
    pattern = _secret_re
    if pattern is not None:
        text = pattern.sub(_MASK, text)
    # caseless as the (?i) patterns match: "ſ" folds to "s"; re also takes "ı" and "İ" for
    # "i", which casefold keeps as "ı" and turns into "i" + U+0307
    folded = text.casefold().replace("\u0131", "i").replace("i\u0307", "i")
    for regex, repl, needles in _PATTERNS:
        if any(needle in folded for needle in needles):
            text = regex.sub(repl, text)
    return text
