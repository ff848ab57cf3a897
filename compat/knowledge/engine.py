"""One knowledge turn: fan-out to the selected sources, evidence packing, the answer, the artifact.

Fan-out (field-failures #20): at most ``fanOut`` sources are asked at once, each bounded by
``sourceTimeoutSeconds`` (capability discovery and query together), the whole fan-out by
``budgetSeconds``; a slow or dead source becomes a per-source failure and never holds the others
past its timeout. Results are listed in the order the sources were selected, whatever order they
finished in. Each step is reported as it happens (``StatusEvent`` ``knowledge.<step>``) and kept in
the artifact's ``steps``. In an evidence-only turn each source's query also reads the pages behind
its hits and reranks them (compat.knowledge.reading), within the same per-source timeout, so the
answer quotes whole sentences of the sections that answer best (compat.knowledge.answers).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from compat import tracing
from compat.base import StatusEvent, TextDelta, TurnError, TurnOutcome, TurnSink
from compat.knowledge import answers, reading
from compat.knowledge import diagnostics as diag
from compat.knowledge.errors import SourceError
from compat.knowledge.evidence import Evidence, safe_path
from compat.knowledge.retrieval import Route, excluded_ids, route
from compat.knowledge.runtime import PromptContext, RuntimeClient, RuntimeFailure, build_request, complete
from compat.knowledge.settings import KnowledgeSettings
from compat.knowledge.sources.base import Capabilities, KnowledgeSource
from compat.telemetry import METRICS

if TYPE_CHECKING:
    from compat.knowledge.params import RetrievalIntent

log = logging.getLogger(__name__)
Discover = Callable[[KnowledgeSource], Awaitable[Capabilities]]


class TurnPlan(msgspec.Struct):
    """A validated turn: its mode, the selected sources in order, and their routes when gating
    already ran (``routes`` None: route during the turn). ``owned`` sources close after the turn."""

    mode: str
    sources: list[KnowledgeSource]
    intent: RetrievalIntent | None = None
    routes: list[Route] | None = None
    owned: list[KnowledgeSource] = msgspec.field(default_factory=list)


class TurnInput(msgspec.Struct, frozen=True):
    question: str
    session_id: str
    thread_id: str
    turn_id: str
    history: tuple[tuple[str, str], ...] = ()


class SourceResult(msgspec.Struct):
    source: KnowledgeSource
    payload: dict[str, Any] | None = None
    caps: Capabilities | None = None
    route: Route | None = None
    error: SourceError | None = None
    latency_ms: int = 0
    skipped: bool = False
    texts: dict[str, str] = msgspec.field(default_factory=dict)  # page id -> text read for the answer


class Steps:
    """The trace: steps in artifact order, each also reported live as a status event."""

    def __init__(self, sink: TurnSink) -> None:
        self.sink = sink
        self.items: list[dict[str, Any]] = []

    def report(self, event: str, step: dict[str, Any]) -> dict[str, Any]:
        step.setdefault("timestamp", datetime.now(UTC).isoformat(timespec="milliseconds"))
        self.sink.emit(StatusEvent(f"knowledge.{event}", step.get("detail", ""), dict(step)))
        return step

    def add(self, event: str, step: dict[str, Any]) -> dict[str, Any]:
        self.items.append(self.report(event, step))
        return step


def _ms(start: float) -> int:
    """Milliseconds since ``start``, to the nearest (a step's ``latencyMs``)."""
    return round((time.monotonic() - start) * 1000)


async def _ask(
    source: KnowledgeSource,
    route_fixed: Route | None,
    plan: TurnPlan,
    turn: TurnInput,
    discover: Discover,
    selected: list[str],
) -> SourceResult:
    caps = await discover(source)
    chosen = route_fixed or route(
        plan.intent, caps, source.descriptor, excluded_ids(plan.intent, source.descriptor.id, selected)
    )
    if plan.mode != "evidence-only":
        return SourceResult(source, await source.context(turn.question, chosen.routed), caps, chosen)
    limit = chosen.routed.limit
    asked = msgspec.structs.replace(chosen.routed, limit=reading.pool(source.descriptor, limit))
    payload = await source.context(turn.question, asked)
    hits = reading.hits_of(payload)
    texts = await reading.read_texts(source, hits, reading.reads(source.descriptor))
    if hits:
        payload = {**payload, "evidence": reading.rerank(turn.question, hits, texts)[:limit]}
    return SourceResult(source, payload, caps, chosen, texts=texts)


async def gather(
    plan: TurnPlan,
    turn: TurnInput,
    settings: KnowledgeSettings,
    discover: Discover,
    on_done: Callable[[SourceResult], None],
) -> list[SourceResult]:
    """Ask every selected source (bounded concurrency, per-source timeout, overall budget)."""
    results: list[SourceResult | None] = [None] * len(plan.sources)
    limiter = anyio.CapacityLimiter(settings.fan_out)
    selected = [s.descriptor.id for s in plan.sources]

    async def one(index: int, source: KnowledgeSource) -> None:
        async with limiter:
            start = time.monotonic()
            fixed = plan.routes[index] if plan.routes else None
            result = SourceResult(source, error=SourceError("timeout", "did not answer in time"))
            attributes = {
                "xworkmate.source_type": source.descriptor.protocol,
                "xworkmate.source_id": source.descriptor.id,
            }
            with tracing.span("knowledge.source", attributes) as span:
                with anyio.move_on_after(settings.source_timeout_seconds):
                    try:
                        result = await _ask(source, fixed, plan, turn, discover, selected)
                    except SourceError as exc:
                        result = SourceResult(source, error=exc)
                    except Exception as exc:  # a source bug is that source's failure, not the turn's
                        log.warning("knowledge source %s failed: %s", source.descriptor.id, type(exc).__name__)
                        result = SourceResult(source, error=SourceError("error", "failed unexpectedly"))
                outcome = "ok" if result.error is None else result.error.reason
                tracing.annotate(span, **{"xworkmate.outcome": outcome})
            result.latency_ms = _ms(start)
            METRICS.source_calls.inc(source.descriptor.protocol, outcome)
            results[index] = result
            on_done(result)

    with anyio.move_on_after(settings.budget_seconds):
        async with anyio.create_task_group() as tg:
            for index, source in enumerate(plan.sources):
                tg.start_soon(one, index, source)
    return [
        r or SourceResult(s, skipped=True, error=SourceError("timeout", "was skipped: the budget ran out"))
        for r, s in zip(results, plan.sources, strict=False)
    ]


class KnowledgeTurn:
    """Runs one planned turn and reports to ``sink``."""

    def __init__(
        self,
        plan: TurnPlan,
        turn: TurnInput,
        settings: KnowledgeSettings,
        discover: Discover,
        sink: TurnSink,
        pool: RuntimeClient | None = None,
    ) -> None:
        self.plan, self.turn, self.settings, self.discover = plan, turn, settings, discover
        self.pool = pool  # the runtime's connection pool (the service's), None: one per call
        self.sink = sink
        self.steps = Steps(sink)
        self.evidence = Evidence()
        self.diagnostics: list[dict[str, Any]] = []
        self.source_steps: dict[str, dict[str, Any]] = {}
        self.texts: dict[str, str] = {}  # citation id -> the section text read for an evidence-only answer
        self.usage: dict[str, int] = {}  # the runtime's token usage (delegated turns)

    async def run(self) -> TurnOutcome:
        names = ", ".join(s.descriptor.name for s in self.plan.sources) or "none"
        self.steps.add(
            "plan",
            {
                "id": "bridge-plan",
                "label": "Plan source calls",
                "status": "done",
                "detail": f"Prepared {len(self.plan.sources)} knowledge source(s) for "
                f"{self.plan.mode} answering: {diag.safe_text(names)}.",
            },
        )
        results = await gather(self.plan, self.turn, self.settings, self.discover, self._source_done)
        for result in results:
            self._merge(result)
        answered = sum(1 for r in results if r.payload is not None)
        ev = self.evidence
        detail = (
            f"Prepared {len(ev.citations)} citation(s), {len(ev.nodes)} graph node(s), {len(ev.bundles)} "
            f"source bundle(s) and {len(results) - answered} source failure note(s)."
        )
        self.steps.add(
            "evidence", {"id": "bridge-evidence", "label": "Prepare evidence", "status": "done", "detail": detail}
        )
        if answered == 0:
            return self._fail_closed(len(results))
        if self.plan.mode == "evidence-only":
            return self._finish(self._evidence_only(answered, len(results) - answered))
        return await self._delegate(answered, len(results) - answered)

    # ---- sources --------------------------------------------------------------------------------

    def _source_done(self, result: SourceResult) -> None:
        src = result.source.descriptor
        safe = diag.safe_id(src.id)
        step: dict[str, Any] = {
            "id": f"tool-{safe}",
            "label": f"Call {diag.safe_text(src.name)}",
            "sourceId": src.id,
            "toolName": f"llmwiki_context__{safe}",
            "parentId": "bridge-plan",
            "latencyMs": result.latency_ms,
        }
        if result.error is not None:
            d = (
                diag.skipped(src, self.settings.budget_seconds)
                if result.skipped
                else diag.source_failure(
                    src, result.error, phase="query", timeout_s=self.settings.source_timeout_seconds
                )
            )
            step.update(status="error", error="Source query failed.", detail=d["message"], diagnostic=d)
        else:
            found = len((result.payload or {}).get("evidence") or [])
            step.update(status="done", detail=f"Read {found} evidence item(s) from {diag.safe_text(src.name)}.")
        self.source_steps[src.id] = self.steps.report("source", step)

    def _merge(self, result: SourceResult) -> None:
        src = result.source.descriptor
        if src.id not in self.source_steps:  # skipped by the budget: report it now
            self._source_done(result)
        step = self.source_steps[src.id]
        self.steps.items.append(step)
        if result.payload is None:
            self.diagnostics.append(step["diagnostic"])
            self.evidence.fail(src, step["diagnostic"]["message"], step["diagnostic"]["remediation"])
            return
        caps = result.caps or Capabilities()
        fresh = self.evidence.add(src, result.payload, caps.bundle_view)
        self.texts.update({c["id"]: result.texts[c["pageId"]] for c in fresh if c["pageId"] in result.texts})
        refs = [
            {"id": c["id"], "title": c["title"], **({"path": p} if (p := safe_path(c.get("path"))) else {})}
            for c in fresh[:5]
        ]
        listed = "; ".join(f"{r.get('path', r['id'])} ({r['title']})" for r in refs)
        detail = f"Read {len(fresh)} citation(s) from {src.name}. Evidence: {listed or 'none'}."
        step.update(
            detail=diag.safe_text(detail, diag.DETAIL_CHARS), citationIds=[c["id"] for c in fresh], citationRefs=refs
        )
        if result.route is not None and result.route.diagnostic is not None:
            step["diagnostic"] = result.route.diagnostic
            self.diagnostics.append(result.route.diagnostic)
        if src.protocol != "a2a":
            self._bundle_step(result, caps)

    def _bundle_step(self, result: SourceResult, caps: Capabilities) -> None:
        src = result.source.descriptor
        safe = diag.safe_id(src.id)
        step: dict[str, Any] = {
            "id": f"source-manifest-{safe}",
            "parentId": f"tool-{safe}",
            "sourceId": src.id,
            "label": f"Read {diag.safe_text(src.name)} source bundle",
        }
        if caps.bundle is not None:
            step.update(status="done", detail="Read safe source bundle metadata.")
        else:
            error = caps.error or SourceError("not_found", "has no source bundle")
            d = diag.source_failure(src, error, phase="source-bundle", timeout_s=self.settings.source_timeout_seconds)
            step.update(status="error", error="Source bundle unavailable.", detail=d["message"], diagnostic=d)
        self.steps.add("source_bundle", step)

    # ---- answers --------------------------------------------------------------------------------

    def _emit(self, text: str) -> str:
        if text:
            self.sink.emit(TextDelta(text))
        return text

    def _evidence_only(self, answered: int, failed: int, step_id: str = "bridge-evidence-only-answer") -> str:
        text = answers.evidence_only(self.turn.question, self.evidence.citations, self.texts, answered, failed)
        read = f" read {len(self.texts)} section(s) and" if self.texts else ""
        self.steps.add(
            "answer",
            {
                "id": step_id,
                "label": "Answer from evidence",
                "status": "done",
                "detail": f"The bridge{read} answered with whole sentences of the best sections and their "
                "citation anchors; no runtime was called.",
            },
        )
        return text

    async def _delegate(self, answered: int, failed: int) -> TurnOutcome:
        runtime = self.settings.runtime
        prompt = PromptContext(self.turn.question, self.turn.session_id, self.turn.thread_id, self.turn.turn_id)
        body = build_request(runtime, self.evidence, prompt, self.turn.history)
        self.steps.report(
            "runtime",
            {
                "id": "runtime-chat-completions",
                "label": "Call chat completions",
                "status": "running",
                "detail": "Calling the configured runtime.",
            },
        )
        streamed: list[str] = []
        start = time.monotonic()
        try:
            completion = await complete(runtime, body, lambda t: streamed.append(self._emit(t)), self.pool)
        except RuntimeFailure as exc:
            return self._runtime_failed(exc, "".join(streamed), answered, failed, _ms(start))
        text, self.usage = completion.text, completion.usage
        suffix = self._emit(answers.fallback_anchors(text, len(self.evidence.citations)))
        detail = "The chat completions endpoint returned a grounded markdown answer."
        if suffix:
            detail += " The bridge appended bounded fallback citation anchors because the runtime returned none."
        self.steps.add(
            "runtime",
            {
                "id": "runtime-chat-completions",
                "label": "Call chat completions",
                "status": "done",
                "latencyMs": _ms(start),
                "detail": detail,
            },
        )
        return self._finish(text + suffix, emitted=True)

    def _runtime_failed(
        self, exc: RuntimeFailure, partial: str, answered: int, failed: int, latency: int
    ) -> TurnOutcome:
        runtime = self.settings.runtime
        d = diag.runtime_failure(
            exc.reason,
            http_status=exc.http_status,
            timeout_s=runtime.timeout_seconds,
            model_configured=bool(runtime.model),
        )
        self.diagnostics.append(d)
        self.steps.add(
            "runtime",
            {
                "id": "runtime-chat-completions",
                "label": "Call chat completions",
                "status": "error",
                "latencyMs": latency,
                "error": d["message"],
                "detail": d["message"],
                "diagnostic": d,
            },
        )
        if self.plan.mode == "hybrid":
            fallback = self._evidence_only(answered, failed, "bridge-evidence-only-fallback")
            text = partial + self._emit(("\n\n" if partial else "") + fallback)
            return self._finish(text, emitted=True)
        why = f": {exc.message}" if exc.message else f" ({exc.reason.replace('_', ' ')})"
        error = TurnError(
            "RUNTIME_FAILED",
            f"the knowledge runtime failed{why}; evidence and steps are in the artifact",
            {"reason": exc.reason, **({"httpStatus": exc.http_status} if exc.http_status else {})},
        )
        return self._finish(partial, emitted=True, error=error)

    def _fail_closed(self, failed: int) -> TurnOutcome:
        text = answers.fail_closed(failed) if failed else answers.no_sources()
        self.steps.add(
            "fail_closed",
            {
                "id": "bridge-source-fail-closed",
                "label": "Fail closed",
                "status": "error",
                "detail": "No selected knowledge source returned evidence; the runtime was not called.",
            },
        )
        error = TurnError(
            "KNOWLEDGE_SOURCES_FAILED",
            "every selected knowledge source failed",
            {"failedSources": [s.descriptor.id for s in self.plan.sources]},
        )
        return self._finish(text, error=error)

    def _finish(self, answer: str, *, emitted: bool = False, error: TurnError | None = None) -> TurnOutcome:
        if not emitted:
            self._emit(answer)
        self.steps.add(
            "final",
            {
                "id": "bridge-final-answer",
                "label": "Return artifact",
                "status": "done",
                "detail": "Returned a structured llmwiki_agent_result artifact.",
            },
        )
        artifact = {  # a name and no content: the app keeps it, and writes nothing to disk for it
            "type": "llmwiki_agent_result",
            "name": "llmwiki_agent_result",
            "requestId": self.turn.turn_id,
            "traceId": uuid.uuid4().hex,
            "answer": answer,
            "orchestrationMode": self.plan.mode,
            "citations": self.evidence.citations,
            "graph": {"nodes": self.evidence.nodes, "edges": self.evidence.edges},
            "steps": self.steps.items,
            "sourceBundles": self.evidence.bundles,
            "diagnostics": self.diagnostics,
        }
        status = "failed" if error else "completed"
        stop = "end_turn" if not error else "error"
        return TurnOutcome(status, stop_reason=stop, error=error, artifacts=[artifact], usage=self.usage or None)
