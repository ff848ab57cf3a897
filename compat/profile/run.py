"""One run of an exec profile's process: how it is read, how the run ends and what the turn's
outcome and output are.

The process runs in its own process group (``compat.process``). stdout is read live as bounded
lines and fed to a parser (``compat.profile.protocol``); stderr is always drained into a bounded
tail; the message, when the child gets it on stdin, is written and stdin is then closed
(field-failures #13, #14). The run ends at the first of: the leader exited (what the pipes held by
then is read; a grandchild holding stdout does not hold the turn, #15), the profile's timeout, an
output limit, or the turn being cut off by the orchestrator (a cancel). Then the whole group is
ended (SIGTERM, SIGKILL after ``cancelGrace``), so nothing the profile started outlives its turn.

Output rules (every provider's: the turn's ``TextDelta`` texts concatenated are its ``output``):

* Partials are sent as deltas at once (dropped when ``streaming`` is off).
* On success the body (the other stdout lines, joined with ``\\n``) is sent as one delta at exit,
  except for what was already streamed: a body that begins with the streamed text sends only the
  rest (a profile that streams and then prints the whole reply is not sent twice); a body that
  differs is sent after a newline. Claude's final ``result`` text is sent only when nothing was
  streamed. With ``include_stderr_in_reply`` the stderr tail follows (``\\n--- stderr ---\\n``).
* On failure (``PROFILE_ERROR``, ``PROFILE_EXIT``) with ``send_error_reply`` the error text is sent
  as the last delta; on timeout and cancel the streamed text stays and nothing is added.
* Everything emitted is bounded by ``maxOutputBytes`` and the body held in memory too; past it the
  turn fails ``OUTPUT_LIMIT`` with the output so far. So does a stdout line longer than
  ``maxAgentLineBytes``: it cannot be held, so the run ends there.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import logging
import math
import signal
from typing import Literal

import anyio
import msgspec

from bridge.rpc.codec import cut_utf8, utf8_len
from bridge.rpc.redact import redact
from compat.base import TextDelta, TurnError, TurnOutcome, TurnSink
from compat.process.child import AgentProcess
from compat.process.lines import LineTooLong
from compat.process.spawn import SpawnError, spawn
from compat.profile.protocol import (
    Body,
    ClaudeStreamParser,
    ExecLineParser,
    ParsedEvent,
    Partial,
    ProfileFailed,
    SessionReport,
)
from compat.settings import Limits

logger = logging.getLogger(__name__)

End = Literal["exit", "timeout", "limit", "line"]
STDERR_HINT = "its stderr is in the bridge's log; set include_stderr_in_reply: true to see it here"


class Launch(msgspec.Struct, frozen=True):
    """How to start one turn's process."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    stdin: bytes | None  # written then closed; None: /dev/null
    parser: ExecLineParser | ClaudeStreamParser
    streaming: bool
    timeout: float | None  # seconds; None: the turn's own deadline (turnTimeout) bounds the run
    send_error_reply: bool
    include_stderr: bool
    name: str = "profile"  # the profile's id, for the log


class ProfileRun:
    """One process run for one turn.

    Args:
        sink: the turn's sink.
        limits: ``maxOutputBytes``, ``maxAgentLineBytes``, ``stderrTailBytes``, …
        grace: seconds between SIGTERM and SIGKILL when the run ends (``cancelGrace``).
        session_id: the upstream session reported by the previous turn, if any.
    """

    def __init__(self, sink: TurnSink, limits: Limits, grace: float, session_id: str | None = None) -> None:
        self.sink = sink
        self.session_id = session_id  # the upstream session: the last one reported wins
        self.process: AgentProcess | None = None
        self._limits = limits
        self._grace = grace
        self._launch: Launch | None = None
        self._end: End | None = None
        self._stop: anyio.CancelScope | None = None  # the reading, cut short by a limit
        self._streamed: list[str] = []
        self._emitted_bytes = 0
        self._body: list[str] = []
        self._body_bytes = 0
        self._final: str | None = None
        self._failure: str | None = None

    def failed(self, error: TurnError, *, send_error_reply: bool) -> TurnOutcome:
        """End the turn ``failed``; with ``send_error_reply`` the error text is the last delta."""
        if send_error_reply:
            reply = error.message
            body = "\n".join(self._body)
            if error.code == "PROFILE_EXIT" and body:
                reply += f"\n--- stdout ---\n{redact(body)}"  # part of the error, not the answer: redacted like stderr
            streamed = "".join(self._streamed)
            self._emit(("" if not streamed or streamed.endswith("\n") else "\n") + reply)
        return self._with_session(TurnOutcome("failed", error=error))

    # ---- the run ----------------------------------------------------------------------------------

    async def run(self, launch: Launch) -> TurnOutcome:
        """Start the process, read it to its end, end its group; never raises for its failures
        (a cut-off turn's cancellation propagates, after the group is ended)."""
        self._launch = launch
        try:  # a cancel while the start waits its turn starts nothing; a begun start is handed back
            self.process = await spawn(
                launch.argv,
                cwd=launch.cwd,
                env=launch.env,
                max_line_bytes=self._limits.max_agent_line_bytes,
                stderr_tail_bytes=self._limits.stderr_tail_bytes,
                stdin_pipe=launch.stdin is not None,
            )
        except SpawnError as exc:
            data = {"command": exc.command, "reason": exc.reason}
            error = TurnError("PROFILE_ERROR", redact(str(exc)), data)
            return self.failed(error, send_error_reply=launch.send_error_reply)
        proc = self.process
        assert proc is not None
        try:  # entered before the next checkpoint: a cancel from here on still ends the group
            with anyio.move_on_after(launch.timeout):
                await self._read(proc, launch)
            if self._end is None:
                self._end = "timeout"
        finally:
            await proc.terminate(self._grace)
        return self._outcome(proc, launch)

    async def _read(self, proc: AgentProcess, launch: Launch) -> None:
        if launch.stdin is not None:
            proc.write(launch.stdin)
            proc.close_stdin()  # once written: a child reading to EOF goes on (#14)
        self.sink.begin()
        try:
            with anyio.CancelScope() as self._stop:
                await proc.run(self._on_line)
        except LineTooLong:
            self._finish("line")
        finally:
            for event in launch.parser.finish():
                self._apply(event, launch)
        if self._end is None:
            if proc.returncode is None:  # stdout closed, the leader still runs: wait for its exit
                await proc.wait(math.inf)
            self._finish("exit")

    def _on_line(self, line: bytes) -> None:
        assert self._launch is not None
        for event in self._launch.parser.feed(line):
            self._apply(event, self._launch)

    def _finish(self, why: End) -> None:
        if self._end is None:
            self._end = why
        if why in ("limit", "line") and self._stop is not None:
            self._stop.cancel()

    # ---- events -----------------------------------------------------------------------------

    def _apply(self, event: ParsedEvent, launch: Launch) -> None:
        if isinstance(event, Partial):
            if self._failure is not None:  # the turn has failed: what follows is not its answer
                logger.debug("profile partial after AGENT_ERROR dropped (%d chars)", len(event.text))
            elif launch.streaming and self._end is None:
                self._streamed.append(self._emit(event.text))
        elif isinstance(event, Body):
            self._add_body(event)
        elif isinstance(event, SessionReport):  # a safe token (the parser checked it)
            self.session_id = event.session_id
        elif isinstance(event, ProfileFailed):
            if self._failure is None:
                self._failure = event.message
        elif self._end is None:
            self.sink.emit(event)

    def _emit(self, text: str) -> str:
        """Send ``text`` as a delta within ``maxOutputBytes``; past it the run ends ``limit``."""
        room = self._limits.max_output_bytes - self._emitted_bytes
        size = utf8_len(text)
        if size > room:
            text = cut_utf8(text, room)
            size = utf8_len(text)
            self._finish("limit")
        if text:
            self._emitted_bytes += size
            self.sink.emit(TextDelta(text))
        return text

    def _add_body(self, event: Body) -> None:
        if event.final:
            self._final = event.text
            return
        room = self._limits.max_output_bytes - self._body_bytes
        size = utf8_len(event.text) + (1 if self._body else 0)
        if size > room:
            self._body.append(cut_utf8(event.text, room - (1 if self._body else 0)))
            self._body_bytes = self._limits.max_output_bytes
            self._finish("limit")
            return
        self._body.append(event.text)
        self._body_bytes += size

    # ---- the outcome --------------------------------------------------------------------------

    def _outcome(self, proc: AgentProcess, launch: Launch) -> TurnOutcome:
        end = self._end
        if end == "timeout":
            message = f"the profile ran longer than {launch.timeout:g} s"
            error = TurnError("PROFILE_TIMEOUT", message, {"timeoutSecs": launch.timeout})
            return self._with_session(TurnOutcome("timeout", stop_reason="timeout", error=error))
        if end in ("limit", "line"):
            self._emit(self._reply_rest())
            limit = self._limits.max_output_bytes if end == "limit" else self._limits.max_agent_line_bytes
            name = "maxOutputBytes" if end == "limit" else "maxAgentLineBytes"
            error = TurnError("OUTPUT_LIMIT", f"the profile's output passed {name} ({limit} bytes)", {name: limit})
            return self._with_session(TurnOutcome("failed", error=error))
        code = proc.returncode
        if self._failure is not None or code != 0:
            self._log_failure(proc, launch)
        if self._failure is not None:
            data = {"exitCode": code} if code is not None else None
            error = TurnError("PROFILE_ERROR", self._failure or "the profile failed", data)
            return self.failed(error, send_error_reply=launch.send_error_reply)
        if code != 0:
            return self.failed(self._exit_error(proc, code, launch), send_error_reply=launch.send_error_reply)
        rest = self._reply_rest()
        stderr = proc.stderr_tail(self._limits.client_stderr_tail_bytes) if launch.include_stderr else ""
        if stderr:
            rest += ("\n" if rest or self._streamed else "") + "--- stderr ---\n" + stderr
        self._emit(rest)
        return self._with_session(TurnOutcome("completed", stop_reason="end_turn"))

    def _reply_rest(self) -> str:
        return reply_rest("".join(self._streamed), "\n".join(self._body), self._final)

    def _exit_error(self, proc: AgentProcess, code: int | None, launch: Launch) -> TurnError:
        if code is not None and code < 0:
            message = f"the profile was killed by {_signal_name(-code)}"
        else:
            message = f"the profile exited with code {code}"
        data: dict[str, object] = {"exitCode": code}
        if launch.include_stderr:
            tail = proc.stderr_tail(self._limits.client_stderr_tail_bytes)
            data["stderrTail"] = tail
            message += f"\n--- stderr ---\n{tail}" if tail else ""
        elif proc.stderr_bytes:
            message += f" ({STDERR_HINT})"
            data["hint"] = STDERR_HINT
        return TurnError("PROFILE_EXIT", message, data)

    def _log_failure(self, proc: AgentProcess, launch: Launch) -> None:
        """A failed run's stderr tail (redacted) in the bridge's log: a traceback is usually
        where the reason is, and the client sees it only with ``include_stderr_in_reply``."""
        tail = proc.stderr_tail(self._limits.client_stderr_tail_bytes)
        if tail.strip():
            logger.warning("profile %s failed (exit %s); its stderr ends:\n%s", launch.name, proc.returncode, tail)

    def _with_session(self, outcome: TurnOutcome) -> TurnOutcome:
        parser = self._launch.parser if self._launch is not None else None
        if isinstance(parser, ClaudeStreamParser):
            outcome = msgspec.structs.replace(outcome, usage=parser.usage, resolved_model=parser.model)
        return msgspec.structs.replace(outcome, upstream_session_id=self.session_id)


def reply_rest(streamed: str, body: str, final: str | None = None) -> str:
    """What to send at a successful exit after ``streamed``, so that nothing is sent twice.

    Args:
        streamed: The partials already sent.
        body: The body lines joined with ``\\n``.
        final: Claude's ``result`` text, sent only when nothing was streamed.
    """
    if final is not None:
        return "" if streamed else final
    if not body or not streamed:
        return body
    if body.startswith(streamed):
        return body[len(streamed) :]
    if streamed.startswith(body) or streamed.rstrip() == body.rstrip():
        return ""
    return ("" if streamed.endswith("\n") else "\n") + body


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
