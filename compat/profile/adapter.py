"""Exec profiles as providers: any command (a script around an API, ``hermes -z``, ``codex
exec``, an in-house tool) speaking the P0 exec protocol of the iLink Hub Bridge and the AgentProc
SDKs, and the built-in ``claude-code`` profile (the Claude Code CLI in print mode).

:class:`ProfileAdapter` implements ``ProviderAdapter``; :class:`ProfileSession` implements
``ProviderSession``. Every turn is one process run (``compat.profile.run``); what carries over
between turns is the upstream session id the profile reported (``AGENT_SESSION:``), handed back
as ``AGENT_SESSION_ID`` (``--resume <id>`` for claude-code). One turn at a time per session;
different sessions of one profile run in parallel up to ``max_concurrent``, the excess waits.

Configuration keys: ``compat.profile.settings``; protocol: ``compat.profile.protocol``; one run:
``compat.profile.run``.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from bridge.rpc.codec import scrub
from bridge.rpc.redact import register_env_secrets
from compat.base import ProbeResult, ProviderInfo, TurnError, TurnOutcome, TurnRequest, TurnSink
from compat.process.env import ENV_NEVER, child_env
from compat.profile.protocol import (
    CLIENT_PLACEHOLDERS,
    ClaudeStreamParser,
    ExecLineParser,
    fill_placeholders,
    placeholders,
    protocol_env,
)
from compat.profile.run import Launch, ProfileRun
from compat.profile.settings import ProfileConfig, ProfileConfigError, resolve_runtime
from compat.settings import Limits, Timeouts

__all__ = ["CLAUDE_PRINT_ARGS", "ProfileAdapter", "ProfileSession"]

logger = logging.getLogger(__name__)

CLAUDE_PRINT_ARGS = ("-p", "--output-format", "stream-json", "--verbose", "--include-partial-messages")


class ProfileAdapter:
    """Implements ``ProviderAdapter`` for one exec profile.

    Args:
        provider_id: The profile's id (shared id space with the other providers).
        profile: The validated profile.
        limits: ``maxOutputBytes``, ``maxAgentLineBytes``, ``stderrTailBytes``, …
        timeouts: ``cancelGrace`` (SIGTERM → SIGKILL) and ``turnTimeout`` (caps ``timeout_secs``).
        profile_dir: Base of relative paths and ``{{PROFILE_DIR}}`` (the config file's directory).
        config_path: Where the profile is configured, for messages (default ``profiles.<id>``).
    """

    def __init__(
        self,
        provider_id: str,
        profile: ProfileConfig,
        limits: Limits,
        timeouts: Timeouts,
        *,
        profile_dir: str | os.PathLike[str],
        config_path: str | None = None,
        roots: Sequence[Path] = (),
    ) -> None:
        self.info = ProviderInfo(provider_id=provider_id, label=profile.label or provider_id, category="profile")
        self.profile = profile
        self.limits = limits
        self.timeouts = timeouts
        self.profile_dir = Path(profile_dir).resolve()
        self.where = config_path or f"profiles.{provider_id}"
        self.roots = [Path(r).resolve() for r in roots]  # a cwd made from client input stays inside
        self.slots = anyio.CapacityLimiter(profile.max_concurrent)
        self._sessions: set[ProfileSession] = set()
        register_env_secrets(profile.env)

    # ---- ProviderAdapter ----------------------------------------------------------------------

    def probe_cheap(self) -> ProbeResult:
        """``ok`` when the runtime and the script (or command) resolve; only ``stat`` and PATH."""
        try:
            argv = resolve_runtime(self.profile, self.profile_dir, where=self.where)
        except ProfileConfigError as exc:
            return ProbeResult("not_found", str(exc))
        return ProbeResult("ok", " ".join(argv))

    async def probe_full(self) -> ProbeResult:
        """The same as :meth:`probe_cheap`: running a profile is a turn (it may cost money)."""
        return self.probe_cheap()

    async def preflight(self, params: dict[str, Any]) -> None:
        """Profiles take no provider-family params: nothing to refuse."""

    def open_session(self, session_id: str) -> ProfileSession:
        session = ProfileSession(self, session_id)
        self._sessions.add(session)
        return session

    async def aclose(self) -> None:
        """End every running turn's process group (bounded, shielded)."""
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for session in list(self._sessions):
                    tg.start_soon(session.aclose)

    # ---- used by ProfileSession ---------------------------------------------------------------

    def forget(self, session: ProfileSession) -> None:
        self._sessions.discard(session)

    def launch(self, request: TurnRequest, upstream_session_id: str | None) -> Launch:
        """The process for one turn: command line, working directory, environment, stdin.

        Raises:
            ProfileConfigError: The runtime or script is gone since the configuration was loaded.
        """
        profile = self.profile
        prefix = resolve_runtime(profile, self.profile_dir, where=self.where)
        if _CONTROL.search(request.thread_id or ""):
            raise ProfileConfigError("threadId: control characters cannot go into a profile's {{SESSION_NAME}}")
        values = {
            "MESSAGE": scrub(request.text_prompt()),
            "SESSION_ID": upstream_session_id or "",
            "SESSION_NAME": request.thread_id or "default",
            "PROFILE_DIR": str(self.profile_dir),
        }
        args = [fill_placeholders(arg, values) for arg in profile.args]
        env = _profile_env(profile.env, values)
        message = values["MESSAGE"].encode("utf-8")
        if profile.type == "claude-code":
            argv = [*prefix, *CLAUDE_PRINT_ARGS]
            argv += ["--resume", upstream_session_id] if upstream_session_id else []
            argv += ["--model", request.model] if request.model else []
            parser: ExecLineParser | ClaudeStreamParser = ClaudeStreamParser()
            stdin: bytes | None = message
        else:
            argv = prefix
            agent_env, truncated = protocol_env(request, upstream_session_id, streaming=profile.streaming)
            env.update(agent_env)
            parser = ExecLineParser(profile.cli_session_first_line_prefix)
            stdin = message if profile.stdin == "message" or truncated else None
        return Launch(
            argv=[*argv, *args],
            cwd=self._cwd(request, values),
            env=env,
            stdin=stdin,
            parser=parser,
            streaming=profile.streaming,
            # At or past turnTimeout the turn's deadline ends the run (TURN_TIMEOUT): two timers
            # at the same moment made PROFILE_TIMEOUT or TURN_TIMEOUT a matter of scheduling.
            timeout=profile.timeout_secs if profile.timeout_secs < self.timeouts.turn_timeout else None,
            send_error_reply=profile.send_error_reply,
            include_stderr=profile.include_stderr_in_reply,
            name=self.info.provider_id,
        )

    def _cwd(self, request: TurnRequest, values: dict[str, str]) -> str:
        """The run's directory: the turn's, or the profile's ``cwd``. One made from client input
        (``{{MESSAGE}}``, ``{{SESSION_ID}}``, ``{{SESSION_NAME}}``) must resolve inside the
        workspace roots, as a ``workingDirectory`` must.

        Raises:
            ProfileConfigError: it does not (the turn fails ``PROFILE_ERROR``).
        """
        template = self.profile.cwd
        if not template:
            return request.working_directory
        path = Path(os.path.expanduser(fill_placeholders(template, values)))
        path = path if path.is_absolute() else self.profile_dir / path
        if set(placeholders(template)) & CLIENT_PLACEHOLDERS:
            try:
                real = path.resolve()
            except (OSError, ValueError, RuntimeError):
                real = None
            if real is None or not any(real == root or root in real.parents for root in self.roots):
                raise ProfileConfigError(
                    f"{self.where}.cwd: made from the request, it resolves outside the workspace roots"
                )
            return str(real)
        return str(path)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
LINE_BUFFERED_ENV = {"PYTHONUNBUFFERED": "1"}
"""Set for every profile run unless its ``env`` says otherwise: a Python profile's ``print`` to a
pipe is block-buffered, so without it every ``AGENT_PARTIAL:`` of a turn arrived at once when the
script exited. (Node writes pipes synchronously; Ruby scripts are started with ``STDOUT.sync``;
other runtimes: docs/api.md "Exec profiles".)"""


def _profile_env(profile_env: dict[str, str], values: dict[str, str]) -> dict[str, str]:
    """The allow-listed environment, :data:`LINE_BUFFERED_ENV`, and the profile's ``env``
    (placeholders filled), never the bridge's own tokens. Only values under secret-looking names
    are registered with the redactor (at adapter creation): profile env often holds flags
    (``MODE: fast``) that must stay readable."""
    env = {**child_env(), **LINE_BUFFERED_ENV}
    env.update({name: fill_placeholders(value, values) for name, value in profile_env.items()})
    for name in ENV_NEVER:
        env.pop(name, None)
    return env


class ProfileSession:
    """Implements ``ProviderSession`` for one bridge session; created by
    ``ProfileAdapter.open_session``. Holds the upstream session id between turns."""

    def __init__(self, adapter: ProfileAdapter, session_id: str) -> None:
        self.session_id = session_id
        self.upstream_session_id: str | None = None
        self._adapter = adapter
        self._lock = anyio.Lock()
        self._run: ProfileRun | None = None
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The running turn's process id (also its process-group id), if any."""
        process = self._run.process if self._run is not None else None
        return process.pid if process is not None else None

    async def run_turn(self, request: TurnRequest, sink: TurnSink) -> TurnOutcome:
        """Run one turn; failures are outcomes (``PROFILE_*``, ``OUTPUT_LIMIT``). Cut off (a
        cancel), the process group is ended (SIGTERM, SIGKILL after ``cancelGrace``)."""
        async with self._lock:
            if self._closed:
                return TurnOutcome("failed", error=TurnError("PROFILE_ERROR", "the session is closed"))
            run = self._run = ProfileRun(
                sink, self._adapter.limits, self._adapter.timeouts.cancel_grace, self.upstream_session_id
            )
            try:
                async with self._adapter.slots:  # max_concurrent runs of this profile; the rest wait
                    return await self._start(run, request)
            finally:
                self._run = None
                if run.session_id:
                    self.upstream_session_id = run.session_id

    def request_cancel(self) -> bool:
        """A profile has no graceful stop: a cancel ends its process group at once."""
        return False

    async def aclose(self) -> None:
        """End a running turn's processes; bounded and idempotent."""
        self._closed = True
        self._adapter.forget(self)
        run = self._run
        if run is not None and run.process is not None:
            await run.process.terminate(self._adapter.timeouts.cancel_grace)

    async def _start(self, run: ProfileRun, request: TurnRequest) -> TurnOutcome:
        try:
            launch = self._adapter.launch(request, self.upstream_session_id)
        except ProfileConfigError as exc:
            error = TurnError("PROFILE_ERROR", str(exc))
            return run.failed(error, send_error_reply=self._adapter.profile.send_error_reply)
        return await run.run(launch)
