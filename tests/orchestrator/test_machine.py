"""``orchestrator.machine``: the turn state machine's table, one test per transition, every pair the
table leaves out refused, and the stop cause and end it records. No event loop: states in,
states out."""

from __future__ import annotations

import pytest

from orchestrator.machine import STOPS, TRANSITIONS, Trigger, TurnMachine, TurnState, TurnStateError

S, T = TurnState, Trigger

PATHS: dict[TurnState, list[Trigger]] = {  # a way to reach each state from QUEUED
    S.QUEUED: [],
    S.STARTING: [T.ADMIT],
    S.RUNNING: [T.ADMIT, T.BEGIN],
    S.CANCELLING: [T.ADMIT, T.BEGIN, T.CANCEL],
    S.FINISHING: [T.ADMIT, T.BEGIN, T.RESULT],
    S.ENDED: [T.ADMIT, T.BEGIN, T.RESULT, T.FINISHED],
}
ALLOWED = [(state, trigger, new) for state, row in TRANSITIONS.items() for trigger, new in row.items()]
REFUSED = [(state, trigger) for state in S for trigger in T if trigger not in TRANSITIONS[state]]


def at(state: TurnState) -> TurnMachine:
    machine = TurnMachine()
    for trigger in PATHS[state]:
        machine.fire(trigger)
    assert machine.state is state
    return machine


@pytest.mark.parametrize(("state", "trigger", "new"), ALLOWED, ids=lambda v: getattr(v, "value", v))
def test_each_transition_of_the_table(state: TurnState, trigger: Trigger, new: TurnState) -> None:
    machine = at(state)
    assert machine.fire(trigger) is new
    assert machine.state is new


@pytest.mark.parametrize(("state", "trigger"), REFUSED, ids=lambda v: v.value)
def test_a_trigger_the_table_leaves_out_is_a_bug_that_raises(state: TurnState, trigger: Trigger) -> None:
    machine = at(state)
    with pytest.raises(TurnStateError, match=f"{state.value}.*{trigger.value}"):
        machine.fire(trigger)
    assert machine.state is state  # a refused trigger changes nothing


def test_every_state_is_reachable_and_only_ended_is_final() -> None:
    assert set(PATHS) == set(S) == set(TRANSITIONS)
    assert [state for state, row in TRANSITIONS.items() if not row] == [S.ENDED]


def test_no_turn_ends_twice() -> None:
    machine = at(S.ENDED)
    for trigger in T:
        with pytest.raises(TurnStateError):
            machine.fire(trigger)


@pytest.mark.parametrize("first", sorted(STOPS, key=lambda t: t.value), ids=lambda t: t.value)
def test_the_first_stop_is_the_cause_and_later_ones_do_not_replace_it(first: Trigger) -> None:
    machine = at(S.RUNNING)
    machine.fire(first)
    for later in STOPS - {first}:
        machine.fire(later)
    assert machine.cause is first and machine.state is S.CANCELLING


def test_a_stop_after_the_outcome_is_known_changes_neither_state_nor_cause() -> None:
    machine = at(S.FINISHING)
    for trigger in (T.CANCEL, T.CLOSE, T.SHUTDOWN):
        assert machine.fire(trigger) is S.FINISHING
    assert machine.cause is None and machine.finished_by is T.RESULT


def test_a_chunk_behind_the_result_that_passes_the_limit_is_recorded() -> None:
    machine = at(S.FINISHING)
    machine.fire(T.OUTPUT_LIMIT)
    assert machine.output_limited and machine.cause is None


@pytest.mark.parametrize(
    ("path", "finished_by", "cause"),
    [
        ([T.ADMIT, T.BEGIN, T.RESULT], T.RESULT, None),
        ([T.ADMIT, T.BEGIN, T.TIMEOUT], T.TIMEOUT, None),
        ([T.ADMIT, T.BEGIN, T.CRASH], T.CRASH, None),
        ([T.ADMIT, T.BEGIN, T.CANCEL, T.STOPPED], T.STOPPED, T.CANCEL),
        ([T.ADMIT, T.BEGIN, T.OUTPUT_LIMIT, T.RESULT], T.RESULT, T.OUTPUT_LIMIT),
        ([T.ADMIT, T.CLOSE, T.STOPPED], T.STOPPED, T.CLOSE),  # closed while starting
        ([T.CANCEL], T.CANCEL, T.CANCEL),  # cancelled while queued: it never started
        ([T.SHUTDOWN], T.SHUTDOWN, T.SHUTDOWN),
    ],
    ids=lambda v: "-".join(t.value for t in v) if isinstance(v, list) else getattr(v, "value", str(v)),
)
def test_the_machine_records_how_the_turn_ended(
    path: list[Trigger], finished_by: Trigger, cause: Trigger | None
) -> None:
    machine = TurnMachine()
    for trigger in path:
        machine.fire(trigger)
    assert machine.finished_by is finished_by and machine.cause is cause
