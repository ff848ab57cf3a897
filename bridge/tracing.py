"""``tracing:``: set up OpenTelemetry (the official SDK) and install its tracer in
``compat.tracing`` (docs/api.md "Tracing"). Imported only when tracing is configured.
"""

from __future__ import annotations

from typing import Any

from bridge.config import ConfigError, TracingSettings
from compat import tracing


def start(settings: TracingSettings, exporter: Any = None) -> Any:
    """Install a tracer exporting to ``settings.otlp_endpoint`` (OTLP over HTTP), or to
    ``exporter`` (tests: an in-memory exporter). Returns the provider; ``shutdown()`` it at exit.

    Raises:
        ConfigError: the OpenTelemetry SDK is not installed (``pip install xworkmate-bridge[tracing]``).
    """
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError as exc:
        raise ConfigError(
            "tracing: the OpenTelemetry SDK is not installed (pip install 'xworkmate-bridge[tracing]')"
        ) from exc
    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif settings.otlp_endpoint:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]  # the [tracing] extra
                OTLPSpanExporter,
            )
        except ImportError as exc:
            raise ConfigError(
                "tracing.otlpEndpoint: install 'xworkmate-bridge[tracing]' for the OTLP exporter"
            ) from exc
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otlp_endpoint)))
    tracing.install(provider.get_tracer("xworkmate-bridge"))
    return provider


def stop(provider: Any) -> None:
    tracing.install(None)
    provider.shutdown()
