"""OpenAI-compatible runtimes as they behave in the field: streams that end badly, error frames,
in-band errors, token usage, runtimes that refuse ``stream_options``, and one connection pool for
every model call (issue: "OpenAI-compatible streams end badly")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .helpers import make_service, run
from .servers import ThreadedServer

QUESTION = "Who approves refunds?"


def chunk(text: str | None = None, finish: str | None = None, usage: dict[str, Any] | None = None) -> bytes:
    choices = (
        []
        if text is None and finish is None
        else [{"index": 0, "delta": {"content": text or ""}, "finish_reason": finish}]
    )
    data: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "choices": choices}
    if usage is not None:
        data["usage"] = usage
    return f"data: {json.dumps(data)}\n\n".encode()


@dataclass
class Runtime:
    """``POST /v1/chat/completions`` answering as ``mode`` says; requests and peers recorded."""

    mode: str = "ok"
    requests: list[dict[str, Any]] = field(default_factory=list)
    peers: set[str] = field(default_factory=set)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])

    async def _chat(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.requests.append(body)
        assert request.client is not None
        self.peers.add(f"{request.client.host}:{request.client.port}")
        if self.mode == "refuses-stream-options" and "stream_options" in body:
            error = {"error": {"message": "Unrecognized request argument supplied: stream_options"}}
            return JSONResponse(error, status_code=400)
        if self.mode == "quota":
            return JSONResponse({"error": {"message": "You exceeded your current quota"}}, status_code=429)

        async def events() -> Iterator[bytes]:
            yield chunk("Finance leads approve ")
            if self.mode == "truncated":
                return  # no finish_reason, no [DONE]
            if self.mode == "event-error":
                yield b'event: error\ndata: {"error": {"message": "rate limit reached for requests"}}\n\n'
                return
            if self.mode == "inband-error":
                yield b'data: {"error": {"message": "insufficient_quota: add credits"}}\n\n'
                return
            yield chunk("refunds [1](#citation-1).", finish="stop")
            if "stream_options" in body:
                yield chunk(
                    usage={
                        "prompt_tokens": 120,
                        "completion_tokens": 9,
                        "total_tokens": 129,
                        "prompt_tokens_details": {"cached_tokens": 100},
                    }
                )
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")  # type: ignore[arg-type]


@pytest.fixture
def runtime() -> Iterator[tuple[Runtime, str]]:
    fake = Runtime()
    with ThreadedServer(fake.app()) as server:
        yield fake, server.url + "/v1"


async def delegated(url: str) -> tuple[Any, Any]:
    async with make_service(runtime_url=url) as service:
        return await run(service, QUESTION, orchestrationMode="delegated-runtime")


@pytest.mark.parametrize(
    ("mode", "reason", "words"),
    [
        ("truncated", "truncated", "ended without a finish_reason or [DONE]"),
        ("event-error", "upstream_error", "rate limit reached for requests"),
        ("inband-error", "upstream_error", "insufficient_quota: add credits"),
        ("quota", "http_status", "You exceeded your current quota"),
    ],
)
async def test_a_stream_that_ends_badly_fails_the_turn_with_the_runtimes_words_and_keeps_what_streamed(
    runtime, mode, reason, words
):
    fake, url = runtime
    fake.mode = mode
    outcome, sink = await delegated(url)
    assert outcome.status == "failed" and outcome.error.code == "RUNTIME_FAILED"
    assert outcome.error.data["reason"] == reason and words in outcome.error.message
    if mode != "quota":
        assert "Finance leads approve " in sink.text


async def test_usage_is_asked_for_and_reported_in_the_turns_usage(runtime):
    fake, url = runtime
    outcome, _ = await delegated(url)
    assert outcome.status == "completed"
    assert fake.requests[0]["stream_options"] == {"include_usage": True}
    assert outcome.usage == {"inputTokens": 120, "outputTokens": 9, "totalTokens": 129, "cachedReadTokens": 100}


async def test_a_runtime_that_refuses_stream_options_is_asked_once_more_without_them(runtime):
    fake, url = runtime
    fake.mode = "refuses-stream-options"
    outcome, sink = await delegated(url)
    assert outcome.status == "completed" and "refunds" in sink.text
    assert ["stream_options" in r for r in fake.requests] == [True, False]


async def test_every_model_call_of_a_service_shares_one_connection_pool(runtime):
    fake, url = runtime
    async with make_service(runtime_url=url) as service:
        for _ in range(3):
            outcome, _ = await run(service, QUESTION, orchestrationMode="delegated-runtime")
            assert outcome.status == "completed"
    assert len(fake.requests) == 3 and len(fake.peers) == 1  # one kept-alive connection, not three


async def test_knowledge_turns_from_every_surface_share_one_bound_on_running_turns():
    import anyio

    from compat.knowledge.settings import SourceDescriptor

    from .servers import SlowSources

    slow = SlowSources(delays={"s": 0.3})
    with ThreadedServer(slow.app()) as server:
        sources = [SourceDescriptor(id="s", protocol="llmwiki-http", url=server.url + "/s")]
        async with make_service(sources) as service:
            service.turn_slots = anyio.CapacityLimiter(1)  # MAX_RUNNING_TURNS, made small
            async with anyio.create_task_group() as tg:
                for _ in range(3):  # as the A2A surface and the MCP tool call it: no orchestrator
                    tg.start_soon(run, service, QUESTION)
    assert slow.max_in_flight == 1 and len([c for c in slow.calls if c.endswith("/query")]) == 3
