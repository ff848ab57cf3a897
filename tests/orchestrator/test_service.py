"""Orchestrator behaviour over an in-memory adapter: turns, queueing, seq, cancel, limits."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from bridge.rpc.errors import InvalidParams, NotFound, SessionBusy
from compat.settings import Limits, Timeouts
from orchestrator.models import PermissionParams, TurnParams
from orchestrator.registry import ProviderRegistry
from orchestrator.results import CapabilitiesResult, ResolveResult, SessionUpdate, TurnResult
from orchestrator.service import Orchestrator
from tests.helpers import conforms, in_background, wire
from tests.orchestrator.fake_adapter import FakeAdapter, updates_of


@pytest.fixture
async def orch(tmp_path: Path):
    adapters = {"fake": FakeAdapter("fake"), "gone": FakeAdapter("gone", available=False)}
    registry = ProviderRegistry(adapters, set(adapters))
    limits = Limits(max_output_bytes=1000, max_queued_turns=2)
    timeouts = Timeouts(permission_timeout=5)
    async with in_background(Orchestrator(registry, [tmp_path.resolve()], limits, timeouts)) as o:
        yield Wire(o)


class Wire:
    """The orchestrator, with each operation's result as the wire object a client decodes."""

    ASYNC = ("run_turn", "close")
    SYNC = ("resolve", "cancel", "permission", "capabilities")

    def __init__(self, orch: Orchestrator) -> None:
        self.inner = orch

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name in self.ASYNC:

            async def call(*args: Any, **kwargs: Any) -> Any:
                return wire(await attr(*args, **kwargs))

            return call
        if name in self.SYNC:
            return lambda *args, **kwargs: wire(attr(*args, **kwargs))
        return attr


def params(prompt: str, session: str = "s1", **extra: Any) -> TurnParams:
    return TurnParams.model_validate({"sessionId": session, "taskPrompt": prompt, **extra})


class Recorder:
    def __init__(self) -> None:
        self.notes: list[tuple[str, Any]] = []
        self.got = anyio.Event()

    def __call__(self, method: str, params: Any) -> None:
        self.notes.append((method, params))
        self.got.set()

    @property
    def updates(self) -> list[dict[str, Any]]:
        return updates_of(self.notes)


async def test_turn_streams_updates_in_order_and_returns_the_full_output(orch):
    rec = Recorder()
    result = await orch.run_turn(params("echo a b c"), "local", rec, start=True)
    assert result["success"] is True and result["status"] == "completed"
    assert result["output"] == "a b c "
    assert result["resolvedProviderId"] == "fake" and result["turnId"].startswith("turn-")
    ups = rec.updates
    assert ups[0]["type"] == "status" and ups[0]["event"] == "started" and ups[0]["pending"] is True
    assert ups[-1]["type"] == "done" and ups[-1]["event"] == "completed" and ups[-1]["message"] == "a b c "
    assert "".join(u["delta"] for u in ups if u["type"] == "delta") == result["output"]
    assert [u["seq"] for u in ups] == list(range(1, len(ups) + 1))
    assert all(u["sessionId"] == "s1" and u["threadId"] == "s1" and u["turnId"] == result["turnId"] for u in ups)
    assert [u["event"] for u in ups].count("completed") == 1
    assert {u["structuredEvent"]["type"] for u in ups} >= {"text", "thinking", "status"}
    conforms(TurnResult, result)
    for update in ups:
        conforms(SessionUpdate, update)


async def test_seq_continues_across_turns_and_session_start(orch):
    rec = Recorder()
    await orch.run_turn(params("one"), "local", rec, start=True)
    await orch.run_turn(params("two"), "local", rec, start=False)
    await orch.run_turn(params("three"), "local", rec, start=True)
    seqs = [u["seq"] for u in rec.updates]
    assert seqs == list(range(1, len(seqs) + 1))


async def test_provider_failure_is_a_result_that_keeps_streamed_text(orch, caplog):
    rec = Recorder()
    with caplog.at_level("INFO", logger="orchestrator"):
        result = await orch.run_turn(params("fail"), "local", rec, start=True)
    assert any(" ended failed (AGENT_EXITED) in " in r.getMessage() for r in caplog.records)  # the log says why
    assert result["success"] is False and result["status"] == "failed"
    assert result["output"] == "before failure"
    assert result["error"]["code"] == "AGENT_EXITED" and result["error"]["providerId"] == "fake"
    done = rec.updates[-1]
    assert done["type"] == "done" and done["status"] == "failed" and done["errorCode"] == "AGENT_EXITED"


async def test_unavailable_explicit_provider_is_never_substituted_and_sends_no_updates(orch):
    rec = Recorder()
    routing = {"routingMode": "auto", "explicitProviderId": "gone"}
    result = await orch.run_turn(params("hi", routing=routing), "local", rec, start=True)
    assert result["status"] == "unavailable" and result["unavailableCode"] == "PROVIDER_UNAVAILABLE"
    assert result["resolvedProviderId"] == "gone" and rec.notes == []
    routing_fields = {
        k: v for k, v in result.items() if k not in ("sessionId", "threadId", "success", "resolvedWorkingDirectory")
    }
    conforms(ResolveResult, routing_fields)


async def test_cancel_ends_the_running_turn_and_queued_turns(orch):
    rec = Recorder()
    results: dict[str, Any] = {}

    async def run(name: str, prompt: str, start: bool) -> None:
        results[name] = await orch.run_turn(params(prompt), "local", rec, start=start)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "first", "hang", True)
        with anyio.fail_after(5):
            while not rec.notes:
                await rec.got.wait()
                rec.got = anyio.Event()
        tg.start_soon(run, "queued", "echo later", False)
        await anyio.wait_all_tasks_blocked()
        assert orch.cancel("s1", "local") == {"accepted": True, "cancelled": True}
    assert results["first"]["status"] == "cancelled" and results["first"]["output"] == "partial"
    assert results["queued"]["status"] == "cancelled" and results["queued"]["turnId"] is None
    assert rec.updates[-1]["type"] == "done" and rec.updates[-1]["status"] == "cancelled"


async def test_start_on_a_running_session_and_a_full_queue_are_busy(orch):
    rec = Recorder()
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(orch.run_turn, params("hang"), "local", rec, start=True))
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(SessionBusy) as busy:
            await orch.run_turn(params("x"), "local", rec, start=True)
        assert busy.value.data["reason"] == "turn_running"
        tg.start_soon(partial(orch.run_turn, params("q1"), "local", rec, start=False))
        tg.start_soon(partial(orch.run_turn, params("q2"), "local", rec, start=False))
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(SessionBusy) as full:
            await orch.run_turn(params("q3"), "local", rec, start=False)
        assert full.value.to_error()["code"] == -32005 and full.value.data["reason"] == "queue_full"
        orch.cancel("s1", "local")


async def test_output_limit_fails_the_turn_and_keeps_output_so_far(orch):
    rec = Recorder()
    result = await orch.run_turn(params("big 5000"), "local", rec, start=True)
    assert result["status"] == "failed" and result["error"]["code"] == "OUTPUT_LIMIT"
    assert len(result["output"]) == 1000
    assert "".join(u["delta"] for u in rec.updates if u["type"] == "delta") == result["output"]


async def test_another_principals_session_is_an_unknown_one(orch):
    await orch.run_turn(params("hi"), "alice", Recorder(), start=True)
    unknown = (orch.cancel("nope", "bob"), await orch.close("nope", "bob"))
    assert (orch.cancel("s1", "bob"), await orch.close("s1", "bob")) == unknown
    assert unknown == ({"accepted": True, "cancelled": False}, {"accepted": True, "closed": False})
    theirs = await orch.run_turn(params("echo mine"), "bob", Recorder(), start=False)  # bob's own s1
    assert theirs["output"] == "mine " and theirs["sessionId"] == "s1"
    assert await orch.close("s1", "alice") == {"accepted": True, "closed": True}
    assert await orch.close("s1", "alice") == {"accepted": True, "closed": False}
    assert await orch.close("s1", "bob") == {"accepted": True, "closed": True}


async def test_permission_ask_round_trip_and_unknown_request(orch):
    rec = Recorder()
    async with anyio.create_task_group() as tg:
        box = {}

        async def run() -> None:
            box["r"] = await orch.run_turn(params("ask"), "local", rec, start=True)

        tg.start_soon(run)
        with anyio.fail_after(5):
            while not [u for u in rec.updates if u["type"] == "permission"]:
                await rec.got.wait()
                rec.got = anyio.Event()
        ask = next(u for u in rec.updates if u["type"] == "permission")
        assert ask["options"][0]["optionId"] == "yes" and ask["requestId"]
        with pytest.raises(InvalidParams):
            orch.permission(PermissionParams(session_id="s1", request_id=ask["requestId"], option_id="maybe"), "local")
        ok = orch.permission(PermissionParams(session_id="s1", request_id=ask["requestId"], option_id="no"), "local")
        assert ok == {"accepted": True}
        with pytest.raises(NotFound):
            orch.permission(PermissionParams(session_id="s1", request_id=ask["requestId"], option_id="no"), "local")
    assert box["r"]["output"] == "option=no"


async def test_working_directory_must_be_an_existing_directory_inside_the_roots(orch, tmp_path):
    with pytest.raises(InvalidParams):
        await orch.run_turn(params("hi", workingDirectory="/etc"), "local", Recorder(), start=True)
    with pytest.raises(InvalidParams):
        await orch.run_turn(params("hi", workingDirectory=str(tmp_path / "nope")), "local", Recorder(), start=True)
    (tmp_path / "sub").mkdir()
    result = await orch.run_turn(params("hi", workingDirectory=str(tmp_path / "sub")), "local", Recorder(), start=True)
    assert result["success"] is True


async def test_attachments_must_resolve_inside_the_roots(orch, tmp_path):
    outside = {"name": "p", "path": "/etc/passwd"}
    with pytest.raises(InvalidParams):
        await orch.run_turn(params("hi", attachments=[outside]), "local", Recorder(), start=True)
    link = tmp_path / "link"
    link.symlink_to("/etc/passwd")
    with pytest.raises(InvalidParams):
        await orch.run_turn(params("hi", attachments=[{"path": str(link)}]), "local", Recorder(), start=True)


async def test_capabilities_lists_providers_and_probe_summary(orch):
    caps = orch.capabilities()
    assert [p["providerId"] for p in caps["providerCatalog"]] == ["fake", "gone"]
    gone = caps["providerCatalog"][1]
    assert gone["enabled"] is False and gone["unavailableReason"]
    assert caps["availableExecutionTargets"] == ["agent"]
    assert caps["capabilities"]["single_agent"] is True
    assert {p["status"] for p in caps["providerProbeSummary"]} == {"ok", "not_found"}
    conforms(CapabilitiesResult, caps)


async def test_unknown_provider_message_lists_the_configured_ones(orch):
    routing = {"routingMode": "explicit", "explicitProviderId": "nope"}
    result = await orch.run_turn(params("hi", routing=routing), "local", Recorder(), start=True)
    assert result["unavailableCode"] == "PROVIDER_UNAVAILABLE"
    assert "unknown provider: nope" in result["unavailableMessage"] and "fake" in result["unavailableMessage"]


async def test_missing_working_directory_is_named(orch, tmp_path):
    with pytest.raises(InvalidParams) as err:
        await orch.run_turn(params("hi", workingDirectory=str(tmp_path / "gone")), "local", Recorder(), start=True)
    assert "gone" in err.value.message


async def test_cancel_reaches_a_turn_that_has_not_started_its_provider_turn(orch):
    gate = anyio.Event()
    original = orch.registry.wait_probe

    async def slow_probe(provider_id: str, timeout: float) -> None:
        await gate.wait()

    orch.registry.wait_probe = slow_probe
    rec = Recorder()
    box: dict[str, Any] = {}

    async def run() -> None:
        box["r"] = await orch.run_turn(params("echo never"), "local", rec, start=True)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await anyio.wait_all_tasks_blocked()
        assert orch.cancel("s1", "local") == {"accepted": True, "cancelled": True}
        gate.set()
    orch.registry.wait_probe = original
    # it had started (waiting for its provider's probe is part of starting): started, then done
    assert box["r"]["status"] == "cancelled" and [u["type"] for u in rec.updates] == ["status", "done"]


async def test_idle_sessions_are_evicted_to_make_room(tmp_path):
    adapters = {"fake": FakeAdapter("fake")}
    limits = Limits(max_sessions=2)
    async with in_background(
        Orchestrator(ProviderRegistry(adapters, {"fake"}), [tmp_path.resolve()], limits, Timeouts())
    ) as inner:
        o = Wire(inner)
        for name in ("a", "b"):
            await o.run_turn(params("hi", session=name), "alice", Recorder(), start=True)
        result = await o.run_turn(params("hi", session="c"), "bob", Recorder(), start=True)
        assert result["success"] is True
        assert await o.close("a", "alice") == {"accepted": True, "closed": False}  # the oldest went


async def test_paths_with_nul_bytes_are_invalid_params(orch, tmp_path):
    with pytest.raises(InvalidParams):
        await orch.run_turn(params("hi", workingDirectory=f"{tmp_path}/\x00x"), "local", Recorder(), start=True)
    with pytest.raises(InvalidParams):
        await orch.run_turn(params("hi", attachments=[{"path": f"{tmp_path}/\x00"}]), "local", Recorder(), start=True)


async def test_non_string_routing_fields_are_invalid_params_not_auto_routing(orch):
    with pytest.raises(InvalidParams):
        await orch.run_turn(params("hi", routing={"explicitProviderId": ["fake"]}), "local", Recorder(), start=True)


def test_routing_reads_a_bounded_prefix_and_skill_list():
    from orchestrator.routing import MAX_AVAILABLE_SKILLS, ROUTING_PROMPT_CHARS, RoutingInput

    skills = [{"id": f"skill-{i}", "label": f"Skill {i}"} for i in range(2000)]
    inp = RoutingInput.from_params("x " * 1_500_000, {"availableSkills": skills})
    # routing work is bounded by these caps (was 54 s on the event loop for this input)
    assert len(inp.prompt) == ROUTING_PROMPT_CHARS and len(inp.available_skills) == MAX_AVAILABLE_SKILLS


def test_update_log_memory_is_bounded():
    from orchestrator.sessions import UpdateLog

    log = UpdateLog()
    for _ in range(100):
        log.append({"type": "thought", "delta": "x" * 262144})
    assert log._bytes <= 128 * 1024 + 262144 + 256 and log.last_seq == 100


def test_update_log_holds_what_it_counts_not_the_encoders_working_buffers():
    """The kept updates occupy about their encoded length: orjson returns small results in a
    4 KiB buffer it does not shrink, which made 256 chunk updates of ~150 bytes hold 1 MiB."""
    import tracemalloc

    from orchestrator.sessions import UpdateLog

    log = UpdateLog(capacity=256)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(256):
            log.append({"sessionId": "s1", "turnId": "t1", "type": "delta", "delta": f"chunk {i:04d} " + "x" * 64})
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert log._bytes < 256 * 200
    assert held < 3 * log._bytes  # the bytes themselves plus the deque's tuples; was ~25x


def test_update_log_replays_what_it_kept_after_the_given_seq():
    from orchestrator.sessions import UpdateLog

    log = UpdateLog(capacity=3)
    for i in range(5):
        log.append({"type": "delta", "delta": f"d{i}", "n": {"i": i}})
    replayed: list[dict] = [orjson.loads(body) for _seq, body in log.kept_after(3)]
    log.attach("a", replayed.append, "subscribe")
    log.append({"type": "done"})
    assert replayed == [
        {"type": "delta", "delta": "d3", "n": {"i": 3}, "seq": 4},
        {"type": "delta", "delta": "d4", "n": {"i": 4}, "seq": 5},
        {"type": "done", "seq": 6},
    ]


def test_update_log_keeps_the_newest_update_even_when_it_alone_exceeds_the_byte_bound():
    from orchestrator.sessions import UpdateLog

    log = UpdateLog(max_bytes=1024)
    log.append({"type": "delta", "delta": "small"})
    log.append({"type": "tool_call_update", "rawOutput": "x" * 4096})
    replayed = [orjson.loads(body) for _seq, body in log.kept_after(0)]
    assert [u["seq"] for u in replayed] == [2] and replayed[0]["rawOutput"] == "x" * 4096


async def test_auto_routing_passes_over_an_agent_known_to_need_authentication(tmp_path):
    from orchestrator.models import ResolveParams

    adapters = {"first": FakeAdapter("first"), "second": FakeAdapter("second")}
    registry = ProviderRegistry(adapters, set(adapters))
    async with in_background(Orchestrator(registry, [tmp_path.resolve()], Limits(), Timeouts())) as orch:

        def resolved(routing: dict[str, Any] | None = None) -> str:
            return orch.resolve(
                ResolveParams.model_validate({"taskPrompt": "fix the bug", "routing": routing})
            ).resolved_provider_id

        assert resolved() == "first"
        registry.note_turn("first", "failed", "AGENT_AUTH_REQUIRED", "login first")
        assert resolved() == "second"  # auto routing prefers the agent that can run
        explicit = {"routingMode": "explicit", "explicitExecutionTarget": "agent", "explicitProviderId": "first"}
        assert resolved(explicit) == "first"  # still reachable by name, to report how to log in
        registry.note_turn("second", "failed", "AGENT_AUTH_REQUIRED", "login too")
        assert resolved() == "first"  # none ready: the first one, whose turn explains
