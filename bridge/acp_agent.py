"""Editor mode: the bridge as an ACP agent, protocol version 1 (docs/api.md "Editor mode").

An editor (Zed, JetBrains, CodeCompanion, agent-shell) that launches ``xworkmate-bridge
acp-stdio``, or connects to ``GET /acp``, and opens with an ACP ``initialize`` is served here
instead of by the bridge's own methods: plain newline-delimited JSON-RPC 2.0, no hybrid envelope.
Each ACP session is one bridge session; its turns run through the orchestrator like the desktop
app's, so every provider the bridge has (ACP agents, exec profiles, knowledge) is one editor
integration, picked with the ``provider`` session config option.

What maps to what (agentclientprotocol.com, schema v1):

- ``session/new`` / ``session/load`` / ``session/resume`` / ``session/close`` / ``session/list``:
  the bridge's session table and store (``session/load`` replays the stored conversation).
- ``session/prompt``: ``Orchestrator.run_turn``; the turn's ``session.update`` params become ACP
  ``session/update`` notifications (:func:`acp_update`), all written before the response.
- ``session/cancel`` and ``$/cancel_request`` (of a prompt): ``Orchestrator.cancel``; the prompt
  then answers ``stopReason: "cancelled"``.
- a provider's permission request (``permissionPolicy: ask``): ``session/request_permission`` to
  the editor, whose answer goes back through ``Orchestrator.permission``.
- the editor's content blocks, ``mcpServers``, fs/terminal capabilities (:class:`EditorLink`) and
  choices among the provider agent's config options travel with each turn (``EditorInput``) to
  the ACP adapter, which hands them to the provider agent.

Requests are read with small msgspec structs of the fields the bridge uses rather than the ACP
SDK's pydantic schema: ``import acp.schema`` takes about 1.5 s, and editors start ``acp-stdio``
for every window (bench case 6). Tests check what the bridge sends against that schema.
"""

from __future__ import annotations

import datetime
import logging
import os
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import msgspec

from bridge import __version__
from bridge.rpc.errors import InvalidParams, LimitReached, RpcError
from compat.peer import REQUEST_ID, AfterReply, JsonRpcPeer, PeerError, ResponseError, Write
from orchestrator.results import ProviderEntry, TurnResult, UnavailableTurnResult
from orchestrator.service import Orchestrator
from orchestrator.sessions import StreamListener
from orchestrator.turn import EditorInput

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
PROVIDER_OPTION = "provider"
"""The id of the session config option that picks the provider."""
AUTO = "auto"
"""The ``provider`` option's value for the bridge's own routing."""
LIST_PAGE = 50
"""Sessions per ``session/list`` page."""
LIST_SCAN = 20
"""Pages of the store one ``session/list`` with a ``cwd`` reads at most to find some."""
STOP_REASONS = frozenset({"end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"})
PASSED_THROUGH = frozenset({"available_commands_update", "session_info_update"})
"""A provider agent's own session updates sent on unchanged. Its ``config_option_update`` and
``current_mode_update`` are not: the editor would offer options the bridge cannot set yet."""


# ---- the requests, as far as the bridge reads them ---------------------------------------------------


class _NewSession(msgspec.Struct, rename="camel"):
    cwd: str
    mcp_servers: list[dict[str, Any]] = []


class _SessionRef(msgspec.Struct, rename="camel"):
    session_id: str
    cwd: str | None = None
    mcp_servers: list[dict[str, Any]] = []


class _Prompt(msgspec.Struct, rename="camel"):
    session_id: str
    prompt: list[dict[str, Any]]


class _SetOption(msgspec.Struct, rename="camel"):
    session_id: str
    config_id: str
    value: str | bool


class _SetMode(msgspec.Struct, rename="camel"):
    session_id: str
    mode_id: str


class _List(msgspec.Struct, rename="camel"):
    cwd: str | None = None
    cursor: str | None = None


def _read(params: dict[str, Any], shape: type[Any]) -> Any:
    try:
        return msgspec.convert(params, shape)
    except msgspec.ValidationError as exc:
        raise ResponseError(-32602, f"Invalid params: {exc}", {"code": "INVALID_PARAMS"}) from None


class EditorSession:
    """What the agent keeps per ACP session: where it runs and which provider it uses."""

    __slots__ = ("agent_options", "chosen", "cwd", "listener", "mcp_servers", "provider", "started")

    def __init__(
        self, cwd: str, provider: str, listener: StreamListener, mcp_servers: list[dict[str, Any]], *, started: bool
    ) -> None:
        self.cwd = cwd
        self.provider = provider  # a provider id, or AUTO
        self.listener = listener
        self.mcp_servers = tuple(mcp_servers)  # the editor's, for the provider agent's session/new
        self.started = started  # a turn ran (session.message continues it)
        self.agent_options: list[dict[str, Any]] = []  # the provider agent's select options, once known
        self.chosen: dict[str, str] = {}  # configId -> value the editor picked among them

    def model(self) -> str | None:
        """The value picked for the agent's ``model``-category option (the turn's ``model``)."""
        return next(
            (
                self.chosen[o["id"]]
                for o in self.agent_options
                if o.get("category") == "model" and o["id"] in self.chosen
            ),
            None,
        )

    def other_choices(self) -> dict[str, str]:
        """The values picked for the agent's other options (mode, thought level, …)."""
        model_ids = {o["id"] for o in self.agent_options if o.get("category") == "model"}
        return {k: v for k, v in self.chosen.items() if k not in model_ids}


class AcpAgent:
    """One editor connection served as an ACP agent. Feed it every received line
    (:meth:`feed`, in order) and host :meth:`run` in the connection's task group.

    Args:
        orch: the running orchestrator.
        principal: whose sessions these are (``local`` on stdio, the token's over WebSocket).
        write: queues one outgoing line (``compat.peer.Write``).
        connection_id: names the connection in logs and as the sessions' listener.
        backlog: the bytes the connection has queued (a replay waits for it to drain).
    """

    def __init__(
        self,
        orch: Orchestrator,
        principal: str,
        write: Write,
        *,
        connection_id: str,
        backlog: Callable[[], int] | None = None,
    ) -> None:
        self._orch = orch
        self._backlog = backlog or (lambda: 0)
        self._principal = principal
        self._id = connection_id
        self._sessions: dict[str, EditorSession] = {}
        self._prompts: dict[Any, str] = {}  # request id of a running session/prompt -> its session
        self._closers: list[Callable[[], None]] = []
        self._tg: anyio.abc.TaskGroup | None = None
        self._client_capabilities: dict[str, Any] = {}  # the editor's, from initialize
        self.peer = JsonRpcPeer(write, name=connection_id, answer_strays=True, strict=True)
        for method, handler in (
            ("initialize", self.initialize),
            ("authenticate", self.authenticate),
            ("session/new", self.new_session),
            ("session/load", self.load_session),
            ("session/resume", self.resume_session),
            ("session/close", self.close_session),
            ("session/list", self.list_sessions),
            ("session/prompt", self.prompt),
            ("session/set_config_option", self.set_config_option),
            ("session/set_mode", self.set_mode),
        ):
            self.peer.on_request(method, _answering_rpc_errors(handler))
        self.peer.on_notification("session/cancel", self.cancel)
        self.peer.on_notification("$/cancel_request", self.cancel_request)

    @property
    def closers(self) -> list[Callable[[], None]]:
        """Run when the connection closes (the sessions stop listening to it)."""
        return self._closers

    def feed(self, line: bytes) -> None:
        """Handle one message from the editor."""
        self.peer.feed(line)

    async def idle(self) -> None:
        """Until every request of the editor's is answered."""
        await self.peer.idle()

    async def room(self) -> None:
        """Until another request of the editor's can be taken (``JsonRpcPeer.room``)."""
        await self.peer.room()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve the editor's requests until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await tg.start(self.peer.serve)
            task_status.started()
            await anyio.sleep_forever()

    # ---- initialize -------------------------------------------------------------------------------

    async def initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        """Version 1 whatever the editor offers (the agent answers its own latest; an editor that
        cannot speak it disconnects). No auth methods: stdio is local, and over WebSocket the
        token was checked at the upgrade."""
        caps = params.get("clientCapabilities")
        caps = caps if isinstance(caps, dict) else {}
        fs = caps.get("fs")
        fs = fs if isinstance(fs, dict) else {}
        self._client_capabilities = {
            "fs": {"readTextFile": fs.get("readTextFile") is True, "writeTextFile": fs.get("writeTextFile") is True},
            "terminal": caps.get("terminal") is True,
        }
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
                "mcpCapabilities": {"http": False, "sse": False},
                "sessionCapabilities": {"list": {}, "resume": {}, "close": {}},
            },
            "agentInfo": {"name": "xworkmate-bridge", "title": "XWorkmate Bridge", "version": __version__},
            "authMethods": [],
        }

    async def authenticate(self, params: dict[str, Any]) -> dict[str, Any]:
        raise InvalidParams("this agent offers no auth methods (initialize lists none)", field="methodId")

    # ---- sessions ---------------------------------------------------------------------------------

    async def new_session(self, params: dict[str, Any]) -> AfterReply:
        """``session/new {cwd, mcpServers}`` → ``{sessionId, configOptions}``; the bridge's
        commands follow the response (an editor may hang on an update before it)."""
        request = _read(params, _NewSession)
        session_id = f"acp-{uuid.uuid4().hex}"
        cwd = self._cwd(request.cwd, session_id)
        session = self._open(session_id, cwd, request.mcp_servers, started=False)
        return AfterReply(
            {"sessionId": session_id, "configOptions": self._config_options(session)},
            lambda: self._send_update(session_id, self._commands()),
        )

    async def load_session(self, params: dict[str, Any]) -> AfterReply:
        """``session/load``: the stored conversation replayed as ``user_message_chunk`` and
        ``agent_message_chunk`` updates (and a turn still running: its prompt, its updates so far,
        then the rest live), then ``{configOptions}``; the next prompt continues it.

        Raises -32004 (``NOT_FOUND``) for a session this principal does not have."""
        request = _read(params, _SessionRef)
        session = await self._reopen(request)
        for role, text in await self._orch.stored.history(request.session_id, self._principal):
            kind = "user_message_chunk" if role == "user" else "agent_message_chunk"
            self._send_update(request.session_id, {"sessionUpdate": kind, "content": {"type": "text", "text": text}})
        running = self._orch.stored.running_turn(request.session_id, self._principal)
        if running is not None:  # a turn that outlived its connection: what it did so far, then live
            prompt, first_seq = running
            user = {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": prompt}}
            self._send_update(request.session_id, user)
            await self._subscribe(request.session_id, session, first_seq - 1)
        return AfterReply({"configOptions": self._config_options(session)}, self._after_open(request.session_id))

    async def resume_session(self, params: dict[str, Any]) -> AfterReply:
        """``session/resume``: as ``session/load`` without the replay (a running turn's next
        updates stream here)."""
        request = _read(params, _SessionRef)
        session = await self._reopen(request)
        if self._orch.stored.running_turn(request.session_id, self._principal) is not None:
            snapshot = await self._orch.stored.get(request.session_id, self._principal)
            await self._subscribe(request.session_id, session, snapshot.last_seq)
        return AfterReply({"configOptions": self._config_options(session)}, self._after_open(request.session_id))

    async def _subscribe(self, session_id: str, session: EditorSession, after_seq: int) -> None:
        await self._orch.stored.subscribe(session_id, self._principal, session.listener, after_seq, until_idle=False)

    def _after_open(self, session_id: str) -> Callable[[], None]:
        return lambda: self._send_update(session_id, self._commands())

    async def _reopen(self, request: _SessionRef) -> EditorSession:
        snapshot = await self._orch.stored.get(request.session_id, self._principal)
        cwd = self._cwd(request.cwd or snapshot.working_directory, request.session_id)
        session = self._open(request.session_id, cwd, request.mcp_servers, started=True)
        if snapshot.provider_id and snapshot.provider_id in self._providers():
            session.provider = snapshot.provider_id
            state = snapshot.session_state.get("config_option_update")
            self._learn_options(request.session_id, state, announce=False)  # the response has them
        return session

    def _cwd(self, cwd: str | None, session_id: str) -> str:
        """``cwd`` checked as ACP wants it (absolute) and as the bridge does (in a workspace root).

        Raises:
            InvalidParams: -32602 (``field: cwd``).
        """
        if cwd is not None and not os.path.isabs(cwd):
            raise InvalidParams(f"cwd must be an absolute path: {cwd[:200]}", field="cwd")
        try:
            return self._orch.workspace.working_directory(cwd, self._principal, session_id)
        except InvalidParams as exc:
            raise InvalidParams(exc.message.replace("workingDirectory", "cwd"), field="cwd") from None

    async def close_session(self, params: dict[str, Any]) -> dict[str, Any]:
        request = _read(params, _SessionRef)
        await self._orch.close(request.session_id, self._principal)
        self._sessions.pop(request.session_id, None)
        return {}

    async def list_sessions(self, params: dict[str, Any]) -> dict[str, Any]:
        """``session/list {cwd?, cursor?}``: this principal's sessions, most recent first (the
        desktop app's too: one store), :data:`LIST_PAGE` a page; with ``cwd``, those in that
        directory (compared as real paths), read ahead at most :data:`LIST_SCAN` pages deep
        for a page's worth."""
        request = _read(params, _List)
        wanted = os.path.realpath(request.cwd) if request.cwd else None
        sessions: list[dict[str, Any]] = []
        cursor = request.cursor
        for _ in range(LIST_SCAN):
            page = await self._orch.stored.list_sessions(self._principal, cursor, LIST_PAGE)
            cursor = page.next_cursor
            for entry in page.sessions:
                where = entry.working_directory
                if where is None or (wanted is not None and os.path.realpath(where) != wanted):
                    continue
                info: dict[str, Any] = {
                    "sessionId": entry.session_id,
                    "cwd": where,
                    "updatedAt": _iso(entry.updated_at),
                }
                if isinstance(entry.title, str):
                    info["title"] = entry.title
                sessions.append(info)
            if sessions or not cursor:
                break
        result: dict[str, Any] = {"sessions": sessions}
        if cursor:
            result["nextCursor"] = cursor
        return result

    def _open(self, session_id: str, cwd: str, mcp_servers: list[dict[str, Any]], *, started: bool) -> EditorSession:
        listener = StreamListener(
            lambda method, update: self._relay(session_id, update), self._id, self._closers, self._backlog
        )
        session = EditorSession(cwd, AUTO, listener, mcp_servers, started=started)
        self._sessions.pop(session_id, None)
        if len(self._sessions) >= self._orch.limits.max_sessions_per_token:
            # A connection holds at most maxSessionsPerToken: the oldest that never ran a turn
            # makes room (it holds nothing but its choices), else the editor is told.
            unused = next((sid for sid, s in self._sessions.items() if not s.started), None)
            if unused is None:
                raise LimitReached(
                    "this connection has maxSessionsPerToken sessions open; close some (session/close)",
                    limit="maxSessionsPerToken",
                )
            del self._sessions[unused]
        self._sessions[session_id] = session
        return session

    def _session(self, session_id: str) -> EditorSession:
        session = self._sessions.get(session_id)
        if session is None:
            raise ResponseError(
                -32004, "unknown session: open it with session/new or session/load", {"code": "NOT_FOUND"}
            )
        return session

    # ---- config options -----------------------------------------------------------------------------

    def _providers(self) -> dict[str, str]:
        """Every configured provider, id -> label, in catalog order: the list stays the same
        while probes come and go (a provider that needs authentication stays choosable, and its
        prompt then says how to authenticate), then the gateway when one is configured."""
        return {p.provider_id: p.label for p in self._catalog()}

    def _catalog(self) -> list[ProviderEntry]:
        """The providers this principal may use (``principals.<name>.turns``)."""
        caps = self._orch.capabilities()
        gate = self._orch.gate
        entries = [*caps.provider_catalog, *caps.gateway_providers]
        return [p for p in entries if gate.turn_provider(self._principal, p.provider_id)]

    def _routing(self, provider: str) -> dict[str, Any] | None:
        """A turn's ``routing`` for the chosen ``provider``: the bridge's own, an agent, or the gateway."""
        if provider == AUTO:
            return None
        if any(p.provider_id == provider for p in self._orch.capabilities().gateway_providers):
            return {"routingMode": "explicit", "explicitExecutionTarget": "gateway"}
        return {"explicitProviderId": provider}

    def _provider_options(self) -> list[dict[str, Any]]:
        options = [{"value": AUTO, "name": "Auto", "description": "the bridge's routing picks the provider"}]
        for entry in self._catalog():
            option = {"value": entry.provider_id, "name": entry.label or entry.provider_id}
            if isinstance(entry.unavailable_reason, str):
                option["description"] = f"unavailable now: {entry.unavailable_reason}"[:300]
            options.append(option)
        return options

    def _provider_id(self, value: str) -> str | None:
        """``value`` as a provider id (``auto``, an id, or an id in other case or spelling), or None."""
        value = value.strip()
        if value.lower() == AUTO:
            return AUTO
        providers = self._providers()
        resolved = self._orch.registry.resolve_id(value)
        by_case = {pid.lower(): pid for pid in providers}
        return resolved if resolved in providers else by_case.get(resolved.lower())

    def _config_options(self, session: EditorSession) -> list[dict[str, Any]]:
        """The ``provider`` option, and the ``model`` option once the provider agent's models are
        known (its ``model`` config option, from its ``session/new`` or a later update)."""
        options = self._provider_options()
        config = [
            {
                "id": PROVIDER_OPTION,
                "name": "Provider",
                "description": "which of the bridge's providers runs the prompts",
                "type": "select",
                "currentValue": session.provider,
                "options": options,
            }
        ]
        for option in session.agent_options:
            config.append({**option, "currentValue": session.chosen.get(option["id"], option.get("currentValue"))})
        return config

    def _learn_options(self, session_id: str, data: dict[str, Any] | None, *, announce: bool = True) -> None:
        """A provider agent's ``config_option_update`` (or its ``session/new`` options): its
        select options (model, mode, thought level, …) join the editor's options after
        ``provider`` (sent as the bridge's own ``config_option_update``)."""
        session = self._sessions.get(session_id)
        options = (data or {}).get("configOptions")
        if session is None or not isinstance(options, list):
            return
        learned = [
            {k: o[k] for k in ("id", "name", "description", "category", "type", "currentValue", "options") if k in o}
            for o in options
            if isinstance(o, dict)
            and o.get("type") == "select"
            and isinstance(o.get("id"), str)
            and o["id"] != PROVIDER_OPTION
            and isinstance(o.get("options"), list)
        ]
        if learned == session.agent_options:
            return
        session.agent_options = learned
        known = {o["id"] for o in learned}
        session.chosen = {k: v for k, v in session.chosen.items() if k in known}
        if announce:
            update = {"sessionUpdate": "config_option_update", "configOptions": self._config_options(session)}
            self._send_update(session_id, update)

    def _mode_changed(self, session_id: str, mode_id: Any) -> None:
        """The provider agent switched its mode itself (``current_mode_update``): the editor's
        mode option shows it (a ``config_option_update``), and an earlier choice gives way."""
        session = self._sessions.get(session_id)
        option = next((o for o in session.agent_options if o.get("category") == "mode"), None) if session else None
        if session is None or option is None or not isinstance(mode_id, str) or mode_id not in _option_values(option):
            return
        option["currentValue"] = mode_id
        session.chosen.pop(option["id"], None)
        update = {"sessionUpdate": "config_option_update", "configOptions": self._config_options(session)}
        self._send_update(session_id, update)

    async def set_config_option(self, params: dict[str, Any]) -> dict[str, Any]:
        """``session/set_config_option {sessionId, configId, value}`` → ``{configOptions}``: the
        ``provider``, or one of the provider agent's options (applied before the next prompt).

        Raises -32602 for an unknown option or a value the option does not list."""
        request = _read(params, _SetOption)
        session = self._session(request.session_id)
        agent_option = next((o for o in session.agent_options if o["id"] == request.config_id), None)
        if agent_option is not None:
            if request.value not in _option_values(agent_option):
                raise InvalidParams(f"not one of the option's values: {str(request.value)[:100]}", field="value")
            session.chosen[request.config_id] = str(request.value)  # applied by the next prompt
            return {"configOptions": self._config_options(session)}
        if request.config_id != PROVIDER_OPTION:
            raise InvalidParams(f"unknown config option: {request.config_id[:100]}", field="configId")
        provider = self._provider_id(request.value) if isinstance(request.value, str) else None
        if provider is None:
            raise InvalidParams(f"not a provider of this bridge: {str(request.value)[:100]}", field="value")
        self._switch(request.session_id, session, provider)
        return {"configOptions": self._config_options(session)}

    def _switch(self, session_id: str, session: EditorSession, provider: str) -> None:
        """Use ``provider``: another provider's options and commands are not this one's."""
        if provider != session.provider:
            session.agent_options, session.chosen = [], {}
            session.provider = provider
            self._send_update(session_id, self._commands())

    async def set_mode(self, params: dict[str, Any]) -> dict[str, Any]:
        """``session/set_mode {sessionId, modeId}``: the provider agent's ``mode``-category option,
        as ``session/set_config_option`` sets it.

        Raises -32602 when the provider agent has no such option (or not this mode)."""
        request = _read(params, _SetMode)
        session = self._session(request.session_id)
        option = next((o for o in session.agent_options if o.get("category") == "mode"), None)
        if option is None:
            raise InvalidParams("the provider offers no modes (yet: they are known once its agent started)")
        if request.mode_id not in _option_values(option):
            raise InvalidParams(f"not one of the provider's modes: {request.mode_id[:100]}", field="modeId")
        session.chosen[option["id"]] = request.mode_id
        return {}

    def _with_own_commands(self, update: dict[str, Any]) -> dict[str, Any]:
        """A provider agent's commands after the bridge's (``/provider``), which they never hide."""
        own = self._commands()["availableCommands"]
        theirs = update.get("availableCommands")
        theirs = (
            [c for c in theirs if isinstance(c, dict) and c.get("name") != "provider"]
            if isinstance(theirs, list)
            else []
        )
        return {**update, "availableCommands": own + theirs}

    def _commands(self) -> dict[str, Any]:
        commands = [
            {
                "name": "provider",
                "description": "switch this session's provider (auto or one of: " + ", ".join(self._providers()) + ")",
                "input": {"hint": "provider id"},
            }
        ]
        return {"sessionUpdate": "available_commands_update", "availableCommands": commands}

    # ---- prompts ----------------------------------------------------------------------------------

    async def prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        """``session/prompt {sessionId, prompt}`` → ``{stopReason}`` after every update of the turn.

        Raises: -32602 for content the bridge cannot pass on (images, audio, blob resources);
        the bridge's errors (-32005 busy, -32006 limit); and -32603 with ``data.code`` the turn's
        error code (``TURN_TIMEOUT``, ``PROVIDER_UNAVAILABLE``, …) for a turn that failed."""
        request = _read(params, _Prompt)
        session = self._session(request.session_id)
        text = prompt_text(request.prompt)
        command = text.strip().split(maxsplit=1)
        if command and command[0] == "/provider":
            return self._provider_command(request.session_id, session, command[1] if len(command) > 1 else "")
        from orchestrator.models import TurnParams  # pydantic: loaded on first use (bench case 6)

        turn = TurnParams.model_validate(
            {
                "sessionId": request.session_id,
                "taskPrompt": text,
                "workingDirectory": session.cwd,
                "routing": self._routing(session.provider),
                "model": session.model(),
            }
        )
        editor = EditorInput(
            content=tuple(request.prompt),
            mcp_servers=session.mcp_servers,
            client=EditorLink(self.peer, request.session_id, self._client_capabilities),
            config_options=session.other_choices(),
        )
        request_id = REQUEST_ID.get()
        self._prompts[request_id] = request.session_id
        start, session.started = not session.started, True  # a prompt sent meanwhile queues behind
        try:
            result = await self._orch.run_turn(turn, self._principal, session.listener, start=start, editor=editor)
        finally:
            self._prompts.pop(request_id, None)
        return _prompt_response(result)

    def _provider_command(self, session_id: str, session: EditorSession, value: str) -> dict[str, Any]:
        choices = "auto, " + ", ".join(self._providers())
        provider = self._provider_id(value) if value.strip() else None
        if not value.strip():
            reply = f"This session uses {session.provider}. Switch with /provider <id>: {choices}."
        elif provider is None:
            reply = f"Unknown provider {value.strip()[:100]!r}. Choose one of: {choices}."
        else:
            self._switch(session_id, session, provider)
            reply = f"This session now uses {provider}."
            self._send_update(
                session_id, {"sessionUpdate": "config_option_update", "configOptions": self._config_options(session)}
            )
        self._send_update(
            session_id, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": reply}}
        )
        return {"stopReason": "end_turn"}

    def cancel(self, params: dict[str, Any]) -> None:
        """``session/cancel {sessionId}`` (a notification)."""
        session_id = params.get("sessionId")
        if isinstance(session_id, str) and session_id in self._sessions:
            self._orch.cancel(session_id, self._principal)

    def cancel_request(self, params: dict[str, Any]) -> None:
        """``$/cancel_request {requestId}``: a running ``session/prompt`` is cancelled as by
        ``session/cancel``; other requests are short and run to their answer."""
        request_id = params.get("requestId")
        session_id = self._prompts.get(request_id) if isinstance(request_id, str | int) else None
        if session_id is not None:
            self._orch.cancel(session_id, self._principal)

    # ---- updates out --------------------------------------------------------------------------------

    def _relay(self, session_id: str, params: dict[str, Any]) -> None:
        """A ``session.update`` of the bridge session, to the editor as ACP."""
        if params.get("type") == "permission":
            if self._tg is not None:
                self._tg.start_soon(self._ask_permission, session_id, params)
            return
        if params.get("type") == "status" and params.get("event") == "config_option_update":
            self._learn_options(session_id, params.get("data"))
            return
        if params.get("type") == "status" and params.get("event") == "current_mode_update":
            self._mode_changed(session_id, (params.get("data") or {}).get("currentModeId"))
            return
        update = acp_update(params)
        if update is not None and update["sessionUpdate"] == "available_commands_update":
            update = self._with_own_commands(update)  # an editor replaces its list with each update
        if update is not None:
            self._send_update(session_id, update)

    def _send_update(self, session_id: str, update: dict[str, Any]) -> None:
        try:
            self.peer.notify("session/update", {"sessionId": session_id, "update": update})
        except PeerError:
            pass  # the editor is gone; the connection's end stops the rest

    async def _ask_permission(self, session_id: str, params: dict[str, Any]) -> None:
        """Ask the editor (``session/request_permission``, the provider's options and tool call
        unchanged) and answer the provider with its choice at once; a cancelled or failed
        answer, or an option the agent did not offer, picks a reject option when there is one."""
        options = params.get("options") or []
        tool_call = {"toolCallId": "permission", **(params.get("toolCall") or {})}
        option_id, answer = None, None
        settled = self._orch.permission_settled(session_id, self._principal, str(params.get("requestId")))
        if settled is None or settled.is_set():
            return  # answered or ended before the editor could be asked
        try:
            call = self.peer.call(
                "session/request_permission", {"sessionId": session_id, "toolCall": tool_call, "options": options}
            )
        except PeerError:
            return
        async with anyio.create_task_group() as tg:

            async def withdraw_when_settled() -> None:
                await settled.wait()  # timed out, or the turn ended: the question is moot
                self.peer.withdraw(call)

            tg.start_soon(withdraw_when_settled)
            try:
                answer = await self.peer.wait(call, None)
            except PeerError as exc:
                if settled.is_set():
                    return
                log.info("%s: no permission answer from the editor (%s): rejected", self._id, exc)
            finally:
                tg.cancel_scope.cancel()
        outcome = answer.get("outcome") if isinstance(answer, dict) else None
        if isinstance(outcome, dict) and outcome.get("outcome") == "selected":
            option_id = outcome.get("optionId")
        offered = [o.get("optionId") for o in options if isinstance(o, dict)]
        if option_id not in offered:  # cancelled, failed, or an option the agent did not offer
            if option_id is not None:
                log.info("%s: the editor chose an option not offered (%r): rejected", self._id, str(option_id)[:100])
            option_id = next((o.get("optionId") for o in options if str(o.get("kind", "")).startswith("reject")), None)
        if not isinstance(option_id, str):
            return  # nothing to reject with: the turn's permissionTimeout or cancel ends the wait
        from orchestrator.models import PermissionParams

        try:
            self._orch.permission(
                PermissionParams(session_id=session_id, request_id=params["requestId"], option_id=option_id),
                self._principal,
            )
        except RpcError as exc:  # the turn ended meanwhile
            log.info("%s: permission answer not used: %s", self._id, exc.message)


class EditorLink:
    """``compat.base.ClientLink`` for one editor session: a provider agent's ``fs/*`` and
    ``terminal/*`` requests go to the editor with the editor's session id, every other field
    unchanged, and its answer comes back as it is."""

    def __init__(self, peer: JsonRpcPeer, session_id: str, capabilities: dict[str, Any]) -> None:
        self._peer = peer
        self._session_id = session_id
        self._capabilities = capabilities

    @property
    def capabilities(self) -> dict[str, Any]:
        return self._capabilities

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        try:
            return await self._peer.request(method, {**params, "sessionId": self._session_id}, timeout=None)
        except ResponseError:
            raise
        except PeerError as exc:
            raise ResponseError(-32603, f"the editor is gone: {exc}") from None


def acp_update(params: dict[str, Any]) -> dict[str, Any] | None:
    """One bridge ``session.update`` (docs/api.md "Update stream") as an ACP ``SessionUpdate``, or
    None for those an editor has no use for (status, done: the prompt's response says it)."""
    kind = params.get("type")
    if kind == "delta":
        return {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": params["delta"]}}
    if kind == "thought":
        return {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": params["delta"]}}
    if kind in ("tool_call", "tool_call_update"):
        call = dict(params.get("toolCall") or {})
        if kind == "tool_call":
            call.setdefault("title", call.get("toolCallId", "tool"))
        return {"sessionUpdate": kind, **call}
    if kind == "plan":
        return {"sessionUpdate": "plan", "entries": params.get("entries") or []}
    if kind == "usage":
        usage = params.get("usage") or {}
        if "contextUsed" in usage and "contextSize" in usage:
            update: dict[str, Any] = {
                "sessionUpdate": "usage_update",
                "used": usage["contextUsed"],
                "size": usage["contextSize"],
            }
            if isinstance(usage.get("cost"), dict) and usage["cost"].get("currency"):
                update["cost"] = usage["cost"]
            return update
        return None
    if kind == "status" and params.get("event") in PASSED_THROUGH:
        return {"sessionUpdate": params["event"], **(params.get("data") or {})}
    return None


def prompt_text(blocks: list[dict[str, Any]]) -> str:
    """The prompt's content blocks as the text a turn carries: text as is, a resource link and an
    embedded text resource with their URI.

    Raises:
        InvalidParams: -32602 for an image, audio or binary resource, or an empty prompt.
    """
    parts: list[str] = []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif kind == "resource_link" and isinstance(block.get("uri"), str):
            parts.append(f"[{block.get('name') or block['uri']}]({block['uri']})")
        elif kind == "resource" and isinstance(resource := block.get("resource"), dict):
            if not isinstance(resource.get("text"), str):
                raise InvalidParams("binary resources cannot be passed to the bridge's providers", field="prompt")
            parts.append(f"<{resource.get('uri', '')}>\n```\n{resource['text']}\n```")
        elif kind in ("image", "audio"):
            raise InvalidParams(f"the bridge's providers cannot take {kind} content here; send text", field="prompt")
        else:
            raise InvalidParams(f"unsupported content block: {str(kind)[:50]}", field="prompt")
    text = "\n\n".join(parts)
    if not text.strip():
        raise InvalidParams("the prompt is empty", field="prompt")
    return text


def _option_values(option: dict[str, Any]) -> list[Any]:
    """The values of a select option, its groups flattened."""
    values = []
    for entry in option.get("options") or []:
        if isinstance(entry, dict) and isinstance(entry.get("options"), list):
            values += [o.get("value") for o in entry["options"] if isinstance(o, dict)]
        elif isinstance(entry, dict):
            values.append(entry.get("value"))
    return values


def _prompt_response(result: TurnResult | UnavailableTurnResult) -> dict[str, Any]:
    if isinstance(result, UnavailableTurnResult):
        raise ResponseError(
            -32603,
            result.unavailable_message or "no provider can take this prompt",
            {"code": result.unavailable_code, "providerId": result.resolved_provider_id},
        )
    if result.status == "cancelled":
        return {"stopReason": "cancelled"}
    if not result.success:
        error = result.error
        provider = result.resolved_provider_id
        data: dict[str, Any] = {"code": "INTERNAL_ERROR", "providerId": provider}
        message = result.summary or "the turn failed"
        if not isinstance(error, msgspec.UnsetType):
            data["code"], message = error.code, error.message or message
            if isinstance(error.data, dict):  # e.g. the hint and authMethods of AGENT_AUTH_REQUIRED
                data = {**error.data, **data}
        hint = data.get("hint")
        text = f"{provider}: {message}" if provider and not message.startswith(provider) else message
        raise ResponseError(-32603, f"{text} ({hint})" if isinstance(hint, str) else text, data)
    return {"stopReason": result.stop_reason if result.stop_reason in STOP_REASONS else "end_turn"}


def _answering_rpc_errors(handler: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
    """The bridge's ``RpcError`` (-32602, -32004, …) as the peer's error answer, ``data.code`` kept."""

    async def serve(params: dict[str, Any]) -> Any:
        try:
            return await handler(params)
        except RpcError as exc:
            error = exc.to_error()
            raise ResponseError(error["code"], error["message"], error["data"]) from None

    return serve


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat().replace("+00:00", "Z")
