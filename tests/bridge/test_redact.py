"""The redactor's needle check (``bridge.rpc.redact``) only skips patterns that cannot match: on
every shape of secret, and on caseless variants of the words the case-insensitive patterns look
for, it redacts exactly what running every pattern would."""

from __future__ import annotations

import pytest

from bridge.rpc import redact as redact_module
from bridge.rpc.redact import redact

SAMPLES = [
    "https://alice:hunter22@example.com/path",
    "HTTPS://bob@example.com",
    "Authorization: Bearer abcdef123456",
    "BASIC dXNlcjpwYXNzd29yZA==",
    "key sk-proj-abcdefghijkl and pk-abcdefghij and rk-1234567890",
    "google AIzaSyA1234567890abcdefghijk",
    "github ghp_abcdefghijklmnopqrstuvwx and gho_ABCDEFGHIJKLMNOPQRSTUV",
    "OPENAI_API_KEY=supersecretvalue",
    "api-key: 'abcd1234'",
    "my_token = xyz987",
    "PASSWORD=hunter22; passwd:letmein",
    "ſecret=abcdefgh",  # long s: casefolds to "secret", and (?i) matches it
    "api_\u212aey=abcdefgh",  # Kelvin sign: casefolds to "k"
    "Bas\u0131c dXNlcjpwYXNzd29yZA==",  # dotless i: re's (?i) takes it for "i", casefold keeps it
    "Authorization: BAS\u0130C dXNlcjpwYXNzd29yZA==",  # dotted capital I: casefolds to "i" + U+0307
    "AP\u0130_KEY=abcdefgh",
    "Bearer\u00a0abcdefgh",
    "Read 16 citation(s) from Wiki 0. Evidence: topics/refund-policy.md (Refund approval policy).",
    "",
    "plain text with no secret in it at all, 42 times over",
]


def _every_pattern(text: str) -> str:
    for regex, repl, _needles in redact_module._PATTERNS:
        text = regex.sub(repl, text)
    return text


@pytest.mark.parametrize("text", SAMPLES)
def test_the_needle_check_changes_nothing_the_patterns_would_redact(text: str) -> None:
    assert redact(text) == _every_pattern(text)


def test_each_secret_shape_is_redacted() -> None:
    for text in SAMPLES[:16]:
        assert "[REDACTED]" in redact(text), text
