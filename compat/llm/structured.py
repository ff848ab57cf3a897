"""Structured output: read the JSON value out of a model's reply and check it against a schema.

Parsing accepts the whole reply as JSON, or the first fenced code block (```json … ```) in it.
Validation uses the ``jsonschema`` package (the dialect the schema's ``$schema`` names, else
Draft 2020-12) off the event loop, bounded in time (``VALIDATE_SECONDS``) and in size
(``MAX_SCHEMA_BYTES`` of schema, ``MAX_SCHEMA_DEPTH`` levels); a reference to anything outside
the schema is refused rather than fetched. Both the schema's own check and the reply's run in a
worker process (``anyio.to_process``), killed when the bound passes: a pattern that backtracks
catastrophically (Python's ``re`` cannot be interrupted) or ``anyOf`` references that branch
exponentially would otherwise keep a thread busy for good.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import anyio

from bridge.rpc.errors import InvalidParams

MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32
VALIDATE_SECONDS = 5.0
_REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")
_FENCE = re.compile(r"```[ \t]*(?:json|JSON|json5)?[ \t]*\r?\n(.*?)\r?\n?```", re.DOTALL)


class OutputInvalid(ValueError):
    """The reply is not JSON, or not JSON the schema accepts; ``str()`` says which and where."""


async def check_schema(schema: dict[str, Any], limiter: anyio.CapacityLimiter) -> None:
    """Refuse a schema the bridge will not validate with. The size, depth and reference checks
    run here; the meta-schema check in the worker process, bounded by ``VALIDATE_SECONDS`` (a
    schema can be built to make it slow).

    Raises:
        InvalidParams: -32602 at ``jsonSchema``: larger than ``MAX_SCHEMA_BYTES``, nested deeper
            than ``MAX_SCHEMA_DEPTH``, a reference outside itself (``$ref``, ``$dynamicRef``,
            ``$recursiveRef``), not a valid JSON Schema, or too slow to check.
    """
    if len(json.dumps(schema, separators=(",", ":"))) > MAX_SCHEMA_BYTES:
        raise InvalidParams(f"jsonSchema is larger than {MAX_SCHEMA_BYTES} bytes", field="jsonSchema")
    if _depth(schema) > MAX_SCHEMA_DEPTH:
        raise InvalidParams(f"jsonSchema is nested deeper than {MAX_SCHEMA_DEPTH} levels", field="jsonSchema")
    if ref := _remote_ref(schema):
        raise InvalidParams(f"jsonSchema refers outside itself ({ref[:200]}); inline it", field="jsonSchema")
    try:
        with anyio.fail_after(VALIDATE_SECONDS):
            problem = await anyio.to_process.run_sync(_check, schema, cancellable=True, limiter=limiter)
    except TimeoutError:
        problem = f"checking it took longer than {VALIDATE_SECONDS:g} s"
    if problem:
        raise InvalidParams(f"jsonSchema is not a valid JSON Schema: {problem}", field="jsonSchema")


def _check(schema: dict[str, Any]) -> str | None:
    """In the worker process: the meta-schema's verdict on ``schema``, or None."""
    from jsonschema import Draft202012Validator, SchemaError, validators

    try:
        validators.validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        return exc.message[:300]
    except RecursionError:
        return "it nests or refers to itself too deeply"
    return None


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_SCHEMA_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level)
    return level


def _remote_ref(value: Any) -> str | None:
    if isinstance(value, dict):
        for key in _REF_KEYS:
            ref = value.get(key)
            if isinstance(ref, str) and not ref.startswith("#"):
                return f"{key} {ref}"
        return next((r for v in value.values() if (r := _remote_ref(v))), None)
    if isinstance(value, list):
        return next((r for v in value if (r := _remote_ref(v))), None)
    return None


def parse_reply(text: str) -> Any:
    """The JSON value of a reply: the whole text, else its first fenced code block.

    Raises:
        OutputInvalid: neither is JSON.
    """
    stripped = text.strip()
    try:
        return json.loads(stripped)
    except ValueError as exc:
        first = exc
    if match := _FENCE.search(text):
        try:
            return json.loads(match.group(1))
        except ValueError as exc:
            raise OutputInvalid(f"the reply's code block is not JSON: {exc}") from exc
    raise OutputInvalid(f"the reply is not JSON: {first}")


def _validate(schema: dict[str, Any], value: Any) -> str | None:
    """In the worker process: why ``value`` does not match ``schema``, or None. The empty
    ``referencing.Registry`` resolves nothing outside the schema: no reference is ever fetched."""
    from jsonschema import Draft202012Validator, exceptions, validators
    from referencing import Registry

    cls = validators.validator_for(schema, default=Draft202012Validator)
    try:
        error = exceptions.best_match(cls(schema, registry=Registry()).iter_errors(value))
    except RecursionError:
        return "the schema refers to itself without end"
    except Exception as exc:  # an unresolvable reference, a bad keyword value
        return f"the schema cannot be applied: {type(exc).__name__}"
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(root)"
    return f"the reply does not match the schema at {where}: {error.message[:300]}"


async def validate(schema: dict[str, Any], value: Any, limiter: anyio.CapacityLimiter) -> None:
    """Check ``value`` against ``schema`` (already passed :func:`check_schema`) in a worker
    process, killed when ``VALIDATE_SECONDS`` pass; ``limiter`` bounds the checks at once.

    Raises:
        OutputInvalid: the value does not validate, or the check took longer than
            ``VALIDATE_SECONDS``.
    """
    try:
        with anyio.fail_after(VALIDATE_SECONDS):
            problem = await anyio.to_process.run_sync(_validate, schema, value, cancellable=True, limiter=limiter)
    except TimeoutError:
        raise OutputInvalid(f"checking the reply against the schema took longer than {VALIDATE_SECONDS:g} s") from None
    if problem:
        raise OutputInvalid(problem)
