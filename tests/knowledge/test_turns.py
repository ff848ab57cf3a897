"""Knowledge turns driven through KnowledgeAdapter.open_session(...).run_turn(...)."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import anyio
import pytest

from compat.base import StatusEvent, TurnEvent
from compat.knowledge.runtime import SYSTEM_PROMPT, conversation
from compat.knowledge.service import KnowledgeService
from compat.knowledge.settings import DEFAULT_DOCS_ROOT
from compat.knowledge.sources.base import RoutedRetrieval
from tests.knowledge.conftest import RecordingSink, artifact_of
from tests.knowledge.helpers import make_service, request, run, session_of, wiki_descriptor

pytestmark = pytest.mark.timeout(30)
GOLDEN = Path(__file__).parent / "golden" / "delegated_request.json"
QUESTION = "What approval do refunds over 500 USD need?"


async def test_the_embedded_default_answers_from_the_docs_with_citations() -> None:
    async with KnowledgeService() as service:
        outcome, sink = await run(service, "how do I set an auth token?")
    artifact = artifact_of(outcome)
    answer = artifact["answer"]
    assert outcome.status == "completed" and outcome.error is None
    assert "".join(sink.deltas) == answer
    assert artifact["orchestrationMode"] == "evidence-only"
    assert artifact["citations"][0]["id"] == "bridge-docs:docs/api/auth-and-origins"
    assert artifact["citations"][0]["title"] == "docs/api.md › Auth and origins"
    assert "\n\n**docs/api.md › Auth and origins**\n\n" in answer  # the heading on its own line
    assert "BRIDGE_AUTH_TOKEN" in answer and "`Bearer <token>`" in answer  # how to set it, how clients send it
    page = (DEFAULT_DOCS_ROOT / "docs/api/auth-and-origins.md").read_text()
    quoted = answer.split("\n\n")[2].removeprefix("- ").removesuffix(" [1](#citation-1)")
    assert quoted in " ".join(page.split())  # whole sentences of the section, as written
    read = next(s for s in artifact["steps"] if s["id"] == "bridge-evidence-only-answer")
    assert "read 8 section(s)" in read["detail"]


async def test_an_evidence_only_turn_reranks_the_pages_it_read() -> None:
    """The lexical rank alone puts Quick start first for this question (it quotes it as an example);
    read and reranked, the section that answers it comes first, and the citations keep 8."""
    async with KnowledgeService() as service:
        outcome, _ = await run(service, "how do I set an auth token?")
        hits = await service.source("bridge-docs").search("how do I set an auth token?", RoutedRetrieval(limit=8))
    citations = artifact_of(outcome)["citations"]
    assert hits[0]["page_id"] != "docs/api/auth-and-origins" and len(citations) == 8
    assert citations[0]["pageId"] == "docs/api/auth-and-origins"


async def test_an_evidence_only_turn_reports_each_step_then_the_answer() -> None:
    async with make_service() as service:
        outcome, sink = await run(service, QUESTION)
    artifact = artifact_of(outcome)
    assert [s.event for s in sink.statuses] == [
        "knowledge.plan",
        "knowledge.source",
        "knowledge.source_bundle",
        "knowledge.evidence",
        "knowledge.answer",
        "knowledge.final",
    ]
    first_delta = next(i for i, e in enumerate(sink.events) if not isinstance(e, StatusEvent))
    assert all(isinstance(e, StatusEvent) for e in sink.events[:first_delta])
    assert set(artifact) == {
        "type",
        "name",
        "requestId",
        "traceId",
        "answer",
        "orchestrationMode",
        "citations",
        "graph",
        "steps",
        "sourceBundles",
        "diagnostics",
    }
    assert artifact["type"] == "llmwiki_agent_result" and artifact["requestId"] == "turn-1"
    assert artifact["name"] and "content" not in artifact  # the desktop app keeps it and writes no file
    assert artifact["citations"][0] == {
        **artifact["citations"][0],
        "id": "acme:ops/billing/refund-policy",
        "path": "ops/billing/refund-policy.md",
        "title": "Refund Policy",
    }
    assert all(n["id"].startswith("acme:") for n in artifact["graph"]["nodes"])
    assert [s["id"] for s in artifact["steps"]] == [
        "bridge-plan",
        "tool-acme",
        "source-manifest-acme",
        "bridge-evidence",
        "bridge-evidence-only-answer",
        "bridge-final-answer",
    ]
    assert artifact["sourceBundles"][0]["sourceId"] == "acme" and artifact["diagnostics"] == []
    assert str(Path(__file__).parents[1]) not in json.dumps(artifact)


async def test_the_delegated_request_matches_the_golden_prompt(runtime) -> None:
    fake, url = runtime
    fake.chunks = ["Refunds over 500 USD need finance lead approval [1](#citation-1)."]
    async with make_service(runtime_url=url) as service:
        session = session_of(service)
        await session.run_turn(
            request("What about refunds?", turn="turn-1", orchestrationMode="delegated-runtime"), RecordingSink()
        )
        outcome = await session.run_turn(
            request(QUESTION, turn="turn-2", orchestrationMode="delegated-runtime"), RecordingSink()
        )
    assert outcome.status == "completed"
    body = fake.requests[1]
    assert body == json.loads(GOLDEN.read_text())  # regenerate only after reviewing a deliberate change
    assert body["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
    prompt = body["messages"][-1]["content"]
    head, _, bundle = prompt.partition("\n\n# LLMWiki evidence bundle\n")
    assert head == f"# User question\n{QUESTION}"
    assert bundle == json.dumps(json.loads(bundle), ensure_ascii=False, separators=(",", ":"))
    assert list(json.loads(bundle)) == [
        "schema",
        "runtimeContract",
        "conversationContext",
        "citationDigest",
        "citations",
        "sources",
        "sourceFailures",
        "mergedGraphSummary",
        "mergedCorpusSummary",
        "citationCount",
    ]
    assert '"nodes"' not in bundle and "sourceBundles" not in bundle


async def test_a_streamed_answer_arrives_as_deltas_and_keeps_its_anchors(runtime) -> None:
    fake, url = runtime
    async with make_service(runtime_url=url) as service:
        outcome, sink = await run(service, QUESTION, orchestrationMode="delegated-runtime")
    assert sink.deltas == fake.chunks
    assert artifact_of(outcome)["answer"] == "".join(fake.chunks)
    assert fake.requests[0]["stream"] is True and "authorization" not in fake.headers[0]


async def test_an_answer_without_anchors_gets_fallback_anchors_as_a_final_delta(runtime) -> None:
    fake, url = runtime
    fake.mode, fake.chunks = "json", ["Refunds over 500 USD need approval."]
    async with make_service(runtime_url=url) as service:
        outcome, sink = await run(service, QUESTION, orchestrationMode="delegated-runtime")
    answer = artifact_of(outcome)["answer"]
    assert sink.deltas[-1].startswith("\n\nEvidence used: [1](#citation-1) [2](#citation-2)")
    assert "".join(sink.deltas) == answer and answer.startswith("Refunds over 500 USD need approval.")


async def test_a_runtime_error_fails_delegated_turns_but_keeps_evidence_and_steps(runtime, monkeypatch) -> None:
    fake, url = runtime
    fake.mode = "error"
    monkeypatch.setenv("TEST_KNOWLEDGE_KEY", "sk-testkey-abcdefghijkl")
    async with make_service(runtime_url=url, api_key_env="TEST_KNOWLEDGE_KEY") as service:
        outcome, sink = await run(service, QUESTION, orchestrationMode="delegated-runtime")
    artifact = artifact_of(outcome)
    assert outcome.status == "failed" and outcome.error.code == "RUNTIME_FAILED"
    assert outcome.error.data == {"reason": "http_status", "httpStatus": 500}
    assert artifact["citations"] and artifact["steps"][-2]["id"] == "runtime-chat-completions"
    assert artifact["steps"][-2]["status"] == "error"
    [diagnostic] = artifact["diagnostics"]
    assert diagnostic["scope"] == "runtime" and diagnostic["retryable"] is True
    text = json.dumps(artifact)
    assert "sk-testkey" not in text and "127.0.0.1" not in text and "secretsecret" not in text
    assert fake.headers[0]["authorization"] == "Bearer sk-testkey-abcdefghijkl"


async def test_hybrid_falls_back_to_the_evidence_only_answer_when_the_runtime_fails(runtime) -> None:
    fake, url = runtime
    fake.mode = "error"
    async with make_service(runtime_url=url) as service:
        outcome, sink = await run(service, QUESTION)  # runtime configured: hybrid is the default
    artifact = artifact_of(outcome)
    assert outcome.status == "completed" and artifact["orchestrationMode"] == "hybrid"
    assert artifact["answer"].startswith("From 1 knowledge source(s)") and "".join(sink.deltas) == artifact["answer"]
    assert [s["id"] for s in artifact["steps"]][-3:] == [
        "runtime-chat-completions",
        "bridge-evidence-only-fallback",
        "bridge-final-answer",
    ]


async def test_a_hung_runtime_times_out(runtime) -> None:
    fake, url = runtime
    fake.mode = "hang"
    started = time.monotonic()
    async with make_service(runtime_url=url, runtime_timeout=0.5) as service:
        outcome, _ = await run(service, QUESTION, orchestrationMode="delegated-runtime")
    assert outcome.error.code == "RUNTIME_FAILED" and outcome.error.data["reason"] == "timeout"
    assert time.monotonic() - started < 5


class RuntimeCalled(RecordingSink):
    def __init__(self) -> None:
        super().__init__()
        self.calling = anyio.Event()

    def emit(self, event: TurnEvent) -> None:
        super().emit(event)
        if isinstance(event, StatusEvent) and event.event == "knowledge.runtime":
            self.calling.set()


async def test_cancel_ends_a_turn_waiting_on_the_runtime(runtime) -> None:
    fake, url = runtime
    fake.mode = "hang"
    async with make_service(runtime_url=url, runtime_timeout=60) as service:
        session, sink, box = session_of(service), RuntimeCalled(), {}

        async def turn(scope: anyio.CancelScope) -> None:
            with scope:
                box["outcome"] = await session.run_turn(request(QUESTION, orchestrationMode="delegated-runtime"), sink)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                scope = anyio.CancelScope()
                tg.start_soon(turn, scope)
                await sink.calling.wait()
                assert session.request_cancel() is False  # no graceful stop: the orchestrator cuts it off
                scope.cancel()
    assert scope.cancelled_caught and "outcome" not in box  # the fan-out and runtime call ended with it


async def test_every_source_failing_fails_closed_without_calling_the_runtime(runtime, tmp_path: Path) -> None:
    fake, url = runtime
    missing = wiki_descriptor(tmp_path / "gone")
    async with make_service([missing], runtime_url=url) as service:
        outcome, sink = await run(service, QUESTION)
    artifact = artifact_of(outcome)
    assert outcome.error.code == "KNOWLEDGE_SOURCES_FAILED" and fake.requests == []
    assert "bridge-source-fail-closed" in [s["id"] for s in artifact["steps"]]
    assert artifact["diagnostics"][0]["phase"] == "query" and str(tmp_path) not in json.dumps(artifact)
    assert "".join(sink.deltas) == artifact["answer"]


def test_history_keeps_the_last_twelve_alternating_messages_cut_at_6000_chars() -> None:
    history = [("system", "ignored"), ("assistant", "orphan")]
    for n in range(10):
        history += [("user", f"q{n}" + "x" * 7000), ("assistant", f"a{n}")]
    history += [("user", "dangling"), ("user", "the question")]
    out = conversation(history, "the question")
    assert len(out) == 12 and out[0]["role"] == "user" and out[-1] == {"role": "assistant", "content": "a9"}
    assert all(a["role"] != b["role"] for a, b in itertools.pairwise(out))
    assert max(len(m["content"]) for m in out) == 6000
