"""An in-memory provider adapter for orchestrator tests: its behaviour is chosen by the prompt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from bridge.rpc.errors import InvalidParams
from compat.base import (
    ProbeResult,
    ProviderInfo,
    StatusEvent,
    TextDelta,
    ThoughtDelta,
    TurnError,
    TurnOutcome,
    TurnRequest,
    TurnSink,
)


class FakeSession:
    upstream_session_id: str | None = None

    def __init__(self, adapter: FakeAdapter) -> None:
        self.adapter = adapter
        self.cancelled = anyio.Event()
        self.closed = False
        self.begun = False
        self.cut_off = 0  # turns whose scope was cancelled under them
        self.turns: list[TurnRequest] = []

    async def run_turn(self, request: TurnRequest, sink: TurnSink) -> TurnOutcome:
        self.sink = sink  # a test may write behind the result with it, as agents do
        try:
            return await self._turn(request, sink)
        except anyio.get_cancelled_exc_class():
            self.cut_off += 1
            raise
        finally:
            self.begun = False

    async def _turn(self, request: TurnRequest, sink: TurnSink) -> TurnOutcome:
        self.cancelled = anyio.Event()
        self.turns.append(request)
        prompt = request.prompt
        if prompt == "slow-start":  # still preparing (as an agent spawning): no graceful stop yet
            self.adapter.starting.set()
            await anyio.sleep_forever()
        if prompt == "raise":
            raise RuntimeError("a bug in an adapter")
        sink.begin()
        self.begun = True
        self.adapter.started.set()
        if prompt == "ask-then-exit":  # the agent dies while the client is asked
            async with anyio.create_task_group() as tg:
                tg.start_soon(sink.ask_permission, {"toolCallId": "t1", "title": "rm"}, [{"optionId": "yes"}])
                await self.adapter.asked.wait()
                tg.cancel_scope.cancel()  # the peer's handler dies with the agent
            return TurnOutcome("failed", error=TurnError("AGENT_EXITED", "agent exited with code 9", {"exitCode": 9}))
        if prompt == "ignore-cancel":
            sink.emit(TextDelta("partial"))
            await anyio.sleep_forever()
        if prompt.startswith("echo "):
            for word in prompt[5:].split():
                sink.emit(TextDelta(word + " "))
            sink.emit(ThoughtDelta("thinking"))
            sink.emit(StatusEvent("available_commands_update"))
            return TurnOutcome("completed", stop_reason="end_turn", usage={"totalTokens": 3})
        if prompt.startswith("write "):  # write each named file (size:<n> makes it n bytes) in the cwd
            for spec in prompt[6:].split():
                name, _, size = spec.partition(":")
                target = Path(request.working_directory) / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(b"x" * int(size) if size else f"made {name}\n".encode())
            return TurnOutcome("completed", stop_reason="end_turn")
        if prompt == "hang":
            sink.emit(TextDelta("partial"))
            await self.cancelled.wait()
            return TurnOutcome("cancelled", stop_reason="cancelled")
        if prompt == "fail":
            sink.emit(TextDelta("before failure"))
            return TurnOutcome("failed", error=TurnError("AGENT_EXITED", "agent exited with code 3", {"exitCode": 3}))
        if prompt.startswith("big "):
            sink.emit(TextDelta("x" * int(prompt[4:])))
            await self.cancelled.wait()
            return TurnOutcome("cancelled", stop_reason="cancelled")
        if prompt == "ask":
            option = await sink.ask_permission(
                {"toolCallId": "t1", "title": "rm"},
                [{"optionId": "yes", "kind": "allow_once"}, {"optionId": "no", "kind": "reject_once"}],
            )
            sink.emit(TextDelta(f"option={option}"))
            return TurnOutcome("completed", stop_reason="end_turn")
        if prompt == "fail-to-close":  # completes; its aclose raises
            return TurnOutcome("completed", stop_reason="end_turn")
        if prompt == "model":
            return TurnOutcome("completed", resolved_model=request.model)
        sink.emit(TextDelta(prompt))
        return TurnOutcome("completed", stop_reason="end_turn")

    def request_cancel(self) -> bool:
        if not self.begun:
            return False  # nothing to cancel gracefully before the work began
        self.cancelled.set()  # the prompts that wait for it return "cancelled"
        return True

    async def aclose(self) -> None:
        self.closed = True
        self.cancelled.set()
        if self.turns and self.turns[-1].prompt == "fail-to-close":
            raise RuntimeError("a bug in an adapter's aclose")


class FakeAdapter:
    def __init__(self, provider_id: str = "fake", available: bool = True) -> None:
        self.info = ProviderInfo(provider_id, provider_id.title(), "acp")
        self._available = available
        self.sessions: list[FakeSession] = []
        self.started = anyio.Event()
        self.starting = anyio.Event()
        self.asked = anyio.Event()
        self.preflighting = anyio.Event()
        self.gate = anyio.Event()  # a turn with the param "gate" waits for it in preflight

    def probe_cheap(self) -> ProbeResult:
        return ProbeResult("ok") if self._available else ProbeResult("not_found", "command not found")

    async def probe_full(self) -> ProbeResult:
        return self.probe_cheap()

    async def preflight(self, params: dict[str, Any]) -> None:
        if params.get("gate"):
            self.preflighting.set()
            await self.gate.wait()
            if params["gate"] == "refuse":
                raise InvalidParams("Invalid params: refused by the provider")

    def open_session(self, session_id: str) -> FakeSession:
        session = FakeSession(self)
        self.sessions.append(session)
        return session

    async def aclose(self) -> None:
        for session in self.sessions:
            await session.aclose()


def updates_of(notes: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    return [params for method, params in notes if method == "session.update"]
