"""Spans, when tracing is on (docs/api.md "Tracing"): the one door every layer uses.

Off unless ``tracing:`` is configured; then ``bridge.tracing`` installs an OpenTelemetry tracer
here. While it is off, :func:`span` is a ``nullcontext`` and nothing of OpenTelemetry is
imported (``opentelemetry-api`` alone is ~18 ms of import, a tenth of the cold start).

The spans: one per request (``rpc <method>``, server kind, the HTTP client's W3C
``traceparent`` as its parent), a ``turn`` child with provider, status and stop reason, and below
it ``agent.start``, ``knowledge.source`` (one per source asked) and ``model.call`` (one per
runtime call). Attributes never hold a prompt, an answer or a secret. Outgoing HTTP requests to
sources and runtimes carry the current ``traceparent`` (:func:`inject`, an httpx request hook).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

_tracer: Any = None


def install(tracer: Any) -> None:
    """Use ``tracer`` (an OpenTelemetry ``Tracer``) from now on; None turns tracing off."""
    global _tracer
    _tracer = tracer


def enabled() -> bool:
    return _tracer is not None


def span(
    name: str, attributes: Mapping[str, Any] | None = None, *, server: bool = False
) -> contextlib.AbstractContextManager[Any]:
    """A span named ``name`` around the block (the current one's child); yields it, or None when
    tracing is off (a shared ``nullcontext``: every request enters one)."""
    if _tracer is None:
        return _NO_SPAN
    return _span(name, attributes, server)


_NO_SPAN = contextlib.nullcontext()


@contextlib.contextmanager
def _span(name: str, attributes: Mapping[str, Any] | None, server: bool) -> Iterator[Any]:
    from opentelemetry.trace import SpanKind

    assert _tracer is not None
    kind = SpanKind.SERVER if server else SpanKind.INTERNAL
    with _tracer.start_as_current_span(name, kind=kind, attributes=dict(attributes or {})) as current:
        yield current


def annotate(current: Any, **attributes: Any) -> None:
    """Set ``attributes`` (None values left out) on ``current``, a span from :func:`span` or None."""
    if current is not None:
        current.set_attributes({k: v for k, v in attributes.items() if v is not None})


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current span's ``traceparent`` (and ``tracestate``) to ``headers``."""
    if _tracer is not None:
        from opentelemetry.propagate import inject as otel_inject

        otel_inject(headers)


@contextlib.contextmanager
def parent_from(headers: Mapping[str, str]) -> Iterator[None]:
    """Make an incoming request's ``traceparent`` the parent of the spans inside the block."""
    if _tracer is None or "traceparent" not in headers:
        yield
        return
    from opentelemetry import context
    from opentelemetry.propagate import extract

    token = context.attach(extract(dict(headers)))
    try:
        yield
    finally:
        context.detach(token)


async def httpx_request_hook(request: Any) -> None:
    """An httpx ``event_hooks["request"]`` entry: the request carries the current trace."""
    inject(request.headers)
