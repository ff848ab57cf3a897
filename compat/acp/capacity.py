"""The bridge-wide cap on live agent processes, ``limits.maxLiveAgents`` (docs/api.md "Limits";
the hostile-clients issue, finding 4): 200 ``session.start`` calls on distinct ids once left 200
agents alive until their idle timeout, and real agents take 100 MB or more each.

An ``AcpSession`` holds a slot from just before it spawns its agent until the agent is ended.
When a session needs a slot and all are held, the least recently used *idle* holder (no turn
running) ends its agent to make room (it resumes with ``session/load`` on its next turn, when the
agent supports it); when none is idle, the turn waits, reporting ``waiting`` with reason
``capacity``, at most ``timeouts.agentCapacityTimeout`` seconds, then fails ``AGENT_CAPACITY``.
Per-provider caps (``maxConcurrent``) stay beneath it.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

import anyio

from compat.base import TurnSink, WaitingEvent

logger = logging.getLogger(__name__)


class SlotHolder(Protocol):
    """What the cap needs of a session holding a slot (``compat.acp.session.AcpSession``)."""

    @property
    def idle(self) -> bool:
        """No turn is running on it (its agent may be ended to make room)."""
        ...

    async def end_agent(self) -> None:
        """End the agent process now, if still idle (it releases the slot)."""
        ...


class NoAgentCapacity(Exception):
    """Every slot stayed held by a busy session for ``agentCapacityTimeout`` seconds."""


class AgentCapacity:
    """At most ``max_live`` agent processes across every ACP provider.

    Args:
        max_live: ``limits.maxLiveAgents``.
        timeout: ``timeouts.agentCapacityTimeout`` seconds a turn waits for a slot.
    """

    def __init__(self, max_live: int, timeout: float) -> None:
        self.max_live = max_live
        self.timeout = timeout
        self._held: dict[SlotHolder, float] = {}  # holder → when it last took or used its slot
        self._freed = anyio.Event()

    @property
    def live(self) -> int:
        return len(self._held)

    async def acquire(self, holder: SlotHolder, sink: TurnSink) -> None:
        """Take a slot for ``holder`` (at once when it already holds one).

        Raises:
            NoAgentCapacity: none came free within ``timeout`` seconds.
        """
        if holder in self._held:
            self._held[holder] = time.monotonic()
            return
        told = False
        with anyio.move_on_after(self.timeout) as waited:
            while len(self._held) >= self.max_live:
                idle = [h for h in self._held if h.idle]
                if idle:
                    victim = min(idle, key=self._held.__getitem__)
                    logger.info("maxLiveAgents (%d) reached: ending the least recently used idle agent", self.max_live)
                    await victim.end_agent()
                    self._held.pop(victim, None)  # even if ending it failed: it is not counted twice
                    continue
                if not told:
                    sink.emit(WaitingEvent("capacity"))
                    told = True
                self._freed = anyio.Event()
                await self._freed.wait()
        if waited.cancelled_caught:
            raise NoAgentCapacity(f"no agent slot came free in {self.timeout:g} s (maxLiveAgents {self.max_live})")
        if told:
            sink.emit(WaitingEvent(""))
        self._held[holder] = time.monotonic()

    def release(self, holder: SlotHolder) -> None:
        """``holder``'s agent was ended: its slot is free."""
        if self._held.pop(holder, None) is not None:
            self._freed.set()
