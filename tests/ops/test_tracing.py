"""Tracing (OpenTelemetry, in-memory exporter): a request span parented by the client's
``traceparent``, a turn span below it, and knowledge-source and model-call spans below the turn;
the runtime's HTTP request carries the trace; no prompt in any attribute."""

from __future__ import annotations

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bridge import tracing as bridge_tracing
from bridge.cli import build_app
from bridge.config import BridgeConfig, TracingSettings
from compat.settings import convert
from tests.fakes.fake_llm import FakeLLM
from tests.helpers import real_server

pytestmark = pytest.mark.timeout(90)
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
PROMPT = "how do I set an auth token? secret-prompt-words"


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = bridge_tracing.start(TracingSettings(), exporter=exporter)
    yield exporter
    bridge_tracing.stop(provider)


async def test_a_turns_span_tree_and_the_trace_reaching_the_runtime(tmp_path, spans):
    with FakeLLM(reply="Set it with authTokens.") as llm:
        runtime = {"baseUrl": f"{llm.base_url}/v1", "model": "mock-model"}
        config = convert({"stateDir": str(tmp_path / "s"), "knowledge": {"runtime": runtime}}, BridgeConfig)
        routing = {"routingMode": "explicit", "explicitExecutionTarget": "agent", "explicitProviderId": "knowledge"}
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "session.start",
            "params": {
                "sessionId": "t-1",
                "taskPrompt": PROMPT,
                "routing": routing,
                "orchestrationMode": "delegated-runtime",
            },
        }
        async with real_server(config, build_app(config)) as port:
            async with httpx.AsyncClient() as client:
                reply = await client.post(
                    f"http://127.0.0.1:{port}/acp/rpc",
                    json=body,
                    headers={"traceparent": f"00-{TRACE}-{PARENT}-01"},
                    timeout=60,
                )
        assert reply.json()["result"]["success"] is True
        sent = [r for r in llm.requests if r.path == "/v1/chat/completions"]
    finished = {s.name: s for s in spans.get_finished_spans()}
    request, turn = finished["rpc session.start"], finished["turn"]
    source, model = finished["knowledge.source"], finished["model.call"]
    assert format(request.context.trace_id, "032x") == TRACE and format(request.parent.span_id, "016x") == PARENT
    assert turn.parent.span_id == request.context.span_id
    assert source.parent.span_id == turn.context.span_id and model.parent.span_id == turn.context.span_id
    assert turn.attributes["xworkmate.provider"] == "knowledge" and turn.attributes["xworkmate.status"] == "completed"
    assert source.attributes["xworkmate.source_type"] == "local-wiki"
    assert model.attributes["gen_ai.request.model"] == "mock-model"
    assert sent and sent[-1].headers["traceparent"].split("-")[1] == TRACE
    for span in spans.get_finished_spans():
        assert not any("secret-prompt-words" in str(v) for v in span.attributes.values())


async def test_the_trace_reaches_an_http_knowledge_source(tmp_path, spans):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from tests.knowledge.servers import ThreadedServer

    seen: list[str] = []

    async def handle(request: Request) -> JSONResponse:
        seen.append(request.headers.get("traceparent", ""))
        if request.path_params["endpoint"] != "query":
            return JSONResponse({"detail": "not here"}, status_code=404)
        evidence = [{"page_id": "p", "title": "Tokens", "path": "t.md", "score": 1.0, "snippet": "Set a token."}]
        return JSONResponse(
            {"wiki_title": "w", "evidence": evidence, "orientation": [], "graph": {"nodes": [], "edges": []}}
        )

    app = Starlette(routes=[Route("/src/{endpoint:path}", handle, methods=["GET", "POST"])])
    with ThreadedServer(app) as server:
        raw = {
            "stateDir": str(tmp_path / "s"),
            "knowledgeSources": [{"id": "remote", "protocol": "llmwiki-http", "url": f"{server.url}/src"}],
        }
        config = convert(raw, BridgeConfig)
        routing = {"routingMode": "explicit", "explicitExecutionTarget": "agent", "explicitProviderId": "knowledge"}
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "session.start",
            "params": {"sessionId": "t-2", "taskPrompt": "token?", "routing": routing},
        }
        async with real_server(config, build_app(config)) as port:
            async with httpx.AsyncClient() as client:
                await client.post(
                    f"http://127.0.0.1:{port}/acp/rpc",
                    json=body,
                    headers={"traceparent": f"00-{TRACE}-{PARENT}-01"},
                    timeout=60,
                )
    assert seen and all(h.split("-")[1] == TRACE for h in seen if h)
    assert any(h.split("-")[1] == TRACE for h in seen if h)
