"""``KnowledgeAdapter``: the ``knowledge`` provider family behind ``compat.base.ProviderAdapter``.

A provider ``providers.<id>: {type: knowledge, sources?: [ids]}`` answers from the shared
``KnowledgeService``'s sources (all enabled ones by default). Each bridge session gets a
``KnowledgeSession`` that keeps the conversation (for the delegated runtime's history) and runs
one turn at a time; ``cancel`` ends the running turn's fan-out and runtime call at once.

The orchestrator calls ``preflight(params)`` before admitting a knowledge turn, so a bad
``orchestrationMode``, ``retrieval`` or ``knowledgeSources`` is a -32602 with no turn.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from compat.base import ProbeResult, ProviderInfo, TurnOutcome, TurnRequest, TurnSink
from compat.knowledge.engine import TurnInput
from compat.knowledge.service import KnowledgeService

HISTORY_KEPT = 24  # messages; the runtime sends at most the last 12 of them


class KnowledgeSession:
    """One bridge session's conversation with a knowledge provider."""

    def __init__(self, adapter: KnowledgeAdapter, session_id: str) -> None:
        self._adapter = adapter
        self.session_id = session_id
        self.history: deque[tuple[str, str]] = deque(maxlen=HISTORY_KEPT)

    @property
    def upstream_session_id(self) -> str | None:
        return None

    async def run_turn(self, request: TurnRequest, sink: TurnSink) -> TurnOutcome:
        """Run one knowledge turn; never raises for params, source or runtime failures. Cut off (a
        cancel), its fan-out and runtime call end with it."""
        turn = TurnInput(request.prompt, request.session_id, request.thread_id, request.turn_id, tuple(self.history))
        sink.begin()
        outcome = await self._adapter.service.run_turn(request.extra, turn, sink, self._adapter.sources)
        answer = _answer(outcome)
        self.history.append(("user", request.prompt))
        if answer:
            self.history.append(("assistant", answer))
        return outcome

    def restore_history(self, history: Sequence[tuple[str, str]]) -> None:
        """``KeepsHistory``: the stored conversation after a restart (the sources are asked the
        message alone; prepended to it, the history pulled retrieval off the question)."""
        self.history.extend(history)

    def request_cancel(self) -> bool:
        """No graceful stop: a cancel cuts the turn off at once."""
        return False

    async def aclose(self) -> None:
        return None


def _answer(outcome: TurnOutcome) -> str:
    artifacts = outcome.artifacts or [{}]
    return str(artifacts[0].get("answer") or "")


class KnowledgeAdapter:
    """A ``knowledge`` provider.

    Args:
        provider_id: the ``providers.<id>`` key.
        service: the bridge's shared ``KnowledgeService`` (not closed by the adapter).
        label: the catalog label (default "Knowledge").
        sources: the provider's ``sources`` (ids); None means every enabled source.

    Raises:
        ValueError: ``sources`` names a source that is not configured.
    """

    def __init__(
        self,
        provider_id: str,
        service: KnowledgeService,
        *,
        label: str | None = None,
        sources: Sequence[str] | None = None,
    ) -> None:
        unknown = [s for s in sources or () if s not in service.descriptors]
        if unknown:
            raise ValueError(f"providers.{provider_id}.sources: unknown knowledge source(s) {', '.join(unknown)}")
        self.service = service
        self.sources = list(sources) if sources is not None else None
        self.info = ProviderInfo(provider_id, label or "Knowledge", "knowledge", ("agent",))

    def probe_cheap(self) -> ProbeResult:
        """Available when at least one source is selectable (configured or from requests)."""
        if self.service.enabled(self.sources) or self.service.settings.request_sources.enabled:
            return ProbeResult("ok")
        return ProbeResult("error", "no enabled knowledge source")

    async def probe_full(self) -> ProbeResult:
        """Available unless every configured source fails discovery (a dead remote source alone
        does not make the provider unavailable)."""
        cheap = self.probe_cheap()
        descriptors = self.service.enabled(self.sources)
        if not cheap.available or not descriptors:
            return cheap
        listing = await self.service.list_sources(probe=True)
        ready = [e for e in listing["sources"] if e["ready"] and e["id"] in {d.id for d in descriptors}]
        return ProbeResult("ok") if ready else ProbeResult("error", "no knowledge source answered")

    async def preflight(self, params: dict[str, Any]) -> None:
        """Reject a turn that cannot run (call before admitting it).

        Args:
            params: the ``session.start`` / ``session.message`` params that are not core fields
                (``TurnParams.extra_params()``).

        Raises:
            InvalidParams: -32602 (``orchestrationMode``, ``retrieval``, ``knowledgeSources``).
            RetrievalModeUnsupported: -32602 with ``data.code`` ``RETRIEVAL_MODE_UNSUPPORTED``.
        """
        await self.service.preflight(params, self.sources)

    def open_session(self, session_id: str) -> KnowledgeSession:
        return KnowledgeSession(self, session_id)

    async def aclose(self) -> None:
        return None
