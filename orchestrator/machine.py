"""The life of a turn as an explicit state machine, in the style of h11's ``_state.py``: the states,
the triggers, one literal table of the allowed transitions, and one method that applies a trigger
or raises. Nothing else assigns a turn's state.

::

    QUEUED ──admit──▶ STARTING ──begin──▶ RUNNING ──result/timeout/crash──▶ FINISHING ──finished──▶ ENDED
      │                  │                   │                                  ▲
      │                  └─cancel/close/shutdown/output_limit─┐                 │
      │                                      │                ▼                 │
      │                                      └──────────▶ CANCELLING ──result/stopped/timeout/crash
      └──cancel/close/shutdown/refuse/crash──▶ ENDED (never started)

  (STARTING also goes to FINISHING on result, timeout or crash; the table below is the truth.)

- STARTING: the turn has its session and a ``turnId``; it waits for one of ``maxRunningTurns``,
  then the provider prepares (spawns the agent, opens its session). RUNNING: the provider reported it began the work (ACP: prompt sent).
- CANCELLING: a stop was asked (the first *cause* is kept: it decides the final status); the
  provider is asked to stop gracefully, or the turn is cut off at once.
- FINISHING: the provider's outcome is known (``result``), it was cut off (``stopped``), the turn
  timed out (``timeout``) or the bridge failed (``crash``); late stop requests change nothing.
- ENDED: the ``done`` update and the result are out. No trigger is allowed any more, so no turn
  ends twice.

The side effects hang off the transitions in ``orchestrator.turn.Turn.fire``. No I/O here.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``compat``.
"""

from __future__ import annotations

import enum


class TurnState(enum.Enum):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    CANCELLING = "cancelling"
    FINISHING = "finishing"
    ENDED = "ended"


class Trigger(enum.Enum):
    """What happens to a turn, and where each comes from."""

    ADMIT = "admit"  # the session is this turn's (Turn.run); it waits for a bridge-wide slot in STARTING
    BEGIN = "begin"  # the provider began the work: ACP prompt sent (TurnSink.begin)
    CANCEL = "cancel"  # session.cancel (Orchestrator.cancel)
    CLOSE = "close"  # session.close: no grace (Orchestrator.close)
    SHUTDOWN = "shutdown"  # the bridge is stopping: no grace (Orchestrator.__aexit__)
    OUTPUT_LIMIT = "output_limit"  # the output passed maxOutputBytes (Turn._text)
    TIMEOUT = "timeout"  # turnTimeout ran out; the provider was cut off (Turn._finish)
    RESULT = "result"  # the provider returned its outcome (Turn.run)
    STOPPED = "stopped"  # the provider was cut off after a stop was asked (Turn.run)
    CRASH = "crash"  # the bridge failed unexpectedly inside the turn (Turn.run)
    REFUSE = "refuse"  # the provider refused the turn's params before it ran (Orchestrator.run_turn)
    FINISHED = "finished"  # the done update is published and the result built (Turn.run)


S, T = TurnState, Trigger
STOPS = frozenset({T.CANCEL, T.CLOSE, T.SHUTDOWN, T.OUTPUT_LIMIT})
"""Triggers that ask a turn to stop; the first one a turn gets is its *cause*."""

TRANSITIONS: dict[TurnState, dict[Trigger, TurnState]] = {
    S.QUEUED: {
        T.ADMIT: S.STARTING,
        T.CANCEL: S.ENDED,
        T.CLOSE: S.ENDED,
        T.SHUTDOWN: S.ENDED,
        T.CRASH: S.ENDED,
        T.REFUSE: S.ENDED,
    },
    S.STARTING: {
        T.BEGIN: S.RUNNING,
        T.CANCEL: S.CANCELLING,
        T.CLOSE: S.CANCELLING,
        T.SHUTDOWN: S.CANCELLING,
        T.OUTPUT_LIMIT: S.CANCELLING,
        T.RESULT: S.FINISHING,
        T.TIMEOUT: S.FINISHING,
        T.CRASH: S.FINISHING,
    },
    S.RUNNING: {
        T.CANCEL: S.CANCELLING,
        T.CLOSE: S.CANCELLING,
        T.SHUTDOWN: S.CANCELLING,
        T.OUTPUT_LIMIT: S.CANCELLING,
        T.RESULT: S.FINISHING,
        T.TIMEOUT: S.FINISHING,
        T.CRASH: S.FINISHING,
    },
    S.CANCELLING: {
        T.BEGIN: S.CANCELLING,  # the provider got as far as sending its prompt meanwhile
        T.CANCEL: S.CANCELLING,
        T.CLOSE: S.CANCELLING,  # no more grace: cut off now
        T.SHUTDOWN: S.CANCELLING,  # no more grace: cut off now
        T.OUTPUT_LIMIT: S.CANCELLING,
        T.RESULT: S.FINISHING,
        T.STOPPED: S.FINISHING,
        T.TIMEOUT: S.FINISHING,
        T.CRASH: S.FINISHING,
    },
    S.FINISHING: {
        T.CANCEL: S.FINISHING,  # too late: the outcome is known
        T.CLOSE: S.FINISHING,
        T.SHUTDOWN: S.FINISHING,
        T.OUTPUT_LIMIT: S.FINISHING,  # a chunk written behind the result passed the limit
        T.FINISHED: S.ENDED,
    },
    S.ENDED: {},
}


class TurnStateError(RuntimeError):
    """A trigger the turn's state does not allow: a bug in the bridge, never a client's fault."""


class TurnMachine:
    """One turn's state, its stop cause, and whether its output passed the limit.

    Attributes:
        state: the current state.
        cause: the first stop trigger the turn got while it could still stop (None: none).
        finished_by: the trigger that moved it to FINISHING (``result``, ``stopped``, ``timeout``
            or ``crash``), or that ended it while queued.
        output_limited: the output passed ``maxOutputBytes`` (at any point, a late chunk too).
    """

    __slots__ = ("cause", "finished_by", "output_limited", "state")

    def __init__(self) -> None:
        self.state = TurnState.QUEUED
        self.cause: Trigger | None = None
        self.finished_by: Trigger | None = None
        self.output_limited = False

    def allows(self, trigger: Trigger) -> bool:
        return trigger in TRANSITIONS[self.state]

    def fire(self, trigger: Trigger) -> TurnState:
        """Apply ``trigger``; returns the new state.

        Raises:
            TurnStateError: ``trigger`` is not allowed in the current state.
        """
        try:
            new = TRANSITIONS[self.state][trigger]
        except KeyError:
            raise TurnStateError(f"a turn in state {self.state.value} cannot take {trigger.value}") from None
        if trigger is T.OUTPUT_LIMIT:
            self.output_limited = True
        if trigger in STOPS and self.cause is None and self.state in (S.QUEUED, S.STARTING, S.RUNNING):
            self.cause = trigger
        if new is not self.state and new in (S.FINISHING, S.ENDED) and self.finished_by is None:
            self.finished_by = trigger
        self.state = new
        return new
