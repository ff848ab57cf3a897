"""Editor mode over stdio (docs/api.md "Editor mode"): the official Python ACP SDK
(``agent-client-protocol``) is the editor; it spawns ``xworkmate-bridge acp-stdio`` and every
response and notification it receives is parsed with the SDK's schema models (a message that does
not fit the schema fails the test). The providers are the scriptable fake ACP agent."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
import yaml
from acp import PROTOCOL_VERSION, RequestError, embedded_text_resource, resource_block, resource_link_block, text_block
from acp.schema import (
    AgentMessageChunk,
    AllowedOutcome,
    AvailableCommandsUpdate,
    ClientCapabilities,
    ConfigOptionUpdate,
    FileSystemCapabilities,
    HttpMcpServer,
    Implementation,
    McpServerStdio,
    ReadTextFileResponse,
    RequestPermissionResponse,
    ToolCallProgress,
    ToolCallStart,
    UsageUpdate,
    UserMessageChunk,
    WriteTextFileResponse,
)
from acp.stdio import spawn_agent_process

from tests.test_app_integration import FAKE_AGENT

pytestmark = pytest.mark.timeout(60)
BRIDGE = (sys.executable, "-m", "bridge.cli")
ROOT = Path(__file__).resolve().parents[2]


def config(tmp_path: Path, **extra: Any) -> Path:
    def agent(*modes: str, **extra: Any) -> dict[str, Any]:
        args = [str(FAKE_AGENT), *[a for m in modes for a in ("--mode", m)]]
        return {"command": sys.executable, "args": args, **extra}

    data = {
        "workspaceRoots": [str(tmp_path)],
        "knowledge": {"enabled": False},  # the fake agents are the providers
        "providers": {
            "echo": {"command": sys.executable, "args": [str(FAKE_AGENT), "--log", str(tmp_path / "echo.log")]},
            "slow": agent("slow"),
            "asker": agent("permission", permissionPolicy="ask"),
            "files": agent("fs"),
            "locked": agent("auth"),
            "mover": {
                "command": sys.executable,
                "args": [
                    str(FAKE_AGENT),
                    "--mode",
                    "configoptions",
                    "--mode",
                    "between-turns",
                    "--log",
                    str(tmp_path / "mover.log"),
                ],
            },
            "ghost": {"command": str(tmp_path / "no-such-agent")},
            "picky": {
                "command": sys.executable,
                "args": [str(FAKE_AGENT), "--mode", "configoptions", "--log", str(tmp_path / "picky.log")],
            },
        },
        "timeouts": {"cancelGrace": 1, "permissionTimeout": 1},
        "limits": {"maxSessionsPerToken": 20},
        **extra,
    }
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class Editor:
    """The editor side: records every session update, answers permission requests with
    ``choose`` (an option id, or None for a cancelled outcome)."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, Any]] = []
        self.asked: list[dict[str, Any]] = []
        self.choose: str | None = "opt-allow_once"
        self.never_answer = False  # permission requests wait until the bridge withdraws them
        self.files: dict[str, str] = {}
        self.relayed: list[tuple[str, str]] = []  # (method, sessionId)

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))

    async def request_permission(
        self, options: list[Any], session_id: str, tool_call: Any, **kwargs: Any
    ) -> RequestPermissionResponse:
        self.asked.append({"sessionId": session_id, "options": [o.option_id for o in options], "tool": tool_call})
        if self.never_answer:
            await anyio.sleep_forever()
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=self.choose or ""))

    async def read_text_file(self, path: str, session_id: str, **kwargs: Any) -> ReadTextFileResponse:
        self.relayed.append(("fs/read_text_file", session_id))
        if path not in self.files:  # as editors answer (agents read this as ENOENT)
            raise RequestError.resource_not_found(path)
        return ReadTextFileResponse(content=self.files[path])

    async def write_text_file(self, content: str, path: str, session_id: str, **kwargs: Any) -> WriteTextFileResponse:
        self.relayed.append(("fs/write_text_file", session_id))
        self.files[path] = content
        return WriteTextFileResponse()

    def on_connect(self, conn: Any) -> None:
        pass

    def of(self, kind: type[Any]) -> list[Any]:
        return [u for _, u in self.updates if isinstance(u, kind)]

    def text(self) -> str:
        return "".join(u.content.text for u in self.of(AgentMessageChunk))


@contextlib.asynccontextmanager
async def bridge(
    tmp_path: Path, editor: Editor, caps: ClientCapabilities | None = None, **extra: Any
) -> AsyncIterator[Any]:
    async with spawn_agent_process(
        editor,
        *BRIDGE,
        "acp-stdio",
        "--config",
        str(config(tmp_path, **extra)),
        "--state-dir",
        str(tmp_path / "state"),
        cwd=str(Path(__file__).resolve().parents[2]),
    ) as (conn, _process):
        init = await conn.initialize(
            protocol_version=PROTOCOL_VERSION,
            client_capabilities=caps or ClientCapabilities(),
            client_info=Implementation(name="test-editor", version="1"),
        )
        assert init.protocol_version == 1
        yield conn


async def test_initialize_advertises_what_the_bridge_does(tmp_path: Path) -> None:
    async with bridge(tmp_path, Editor()) as conn:
        init = await conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities())
    caps = init.agent_capabilities
    assert caps is not None and caps.load_session is True
    assert caps.session_capabilities is not None
    sessions = caps.session_capabilities
    assert sessions.list is not None and sessions.resume is not None and sessions.close is not None
    assert caps.prompt_capabilities is not None and caps.prompt_capabilities.image is False
    assert init.agent_info is not None and init.agent_info.name == "xworkmate-bridge"
    assert init.auth_methods == []


async def test_the_provider_option_lists_only_the_providers_the_principal_may_use(tmp_path: Path) -> None:
    principals = {"local": {"turns": {"allowedProviders": ["echo", "slow"]}}}
    async with bridge(tmp_path, Editor(), principals=principals) as conn:
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        option = next(o for o in new.config_options or [] if o.id == "provider")
    assert [v.value for v in option.options] == ["auto", "echo", "slow"]


async def test_a_prompt_streams_through_the_provider_picked_in_the_config_option(tmp_path: Path) -> None:
    editor = Editor()
    async with bridge(tmp_path, editor) as conn:
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        option = next(o for o in new.config_options or [] if o.id == "provider")
        assert option.current_value == "auto"
        assert [v.value for v in option.options] == [
            "auto",
            "asker",
            "echo",
            "files",
            "ghost",
            "locked",
            "mover",
            "picky",
            "slow",
        ]
        chosen = await conn.set_config_option(session_id=new.session_id, config_id="provider", value="echo")
        assert chosen.config_options[0].current_value == "echo"
        answer = await conn.prompt(session_id=new.session_id, prompt=[text_block("hello bridge")])
    assert answer.stop_reason == "end_turn"
    assert editor.text() == "echo: hello bridge"
    merged = editor.of(AvailableCommandsUpdate)[-1].available_commands
    assert [c.name for c in merged] == ["provider", "help"], "the bridge's commands, then the agent's"
    starts = editor.of(ToolCallStart)
    assert [s.tool_call_id for s in starts] == ["t1"] and starts[0].title == "Read file"
    assert [p.status for p in editor.of(ToolCallProgress)][-1] == "completed"
    usage = editor.of(UsageUpdate)
    assert usage and usage[0].used == 1000 and usage[0].size == 200000
    assert {sid for sid, _ in editor.updates} == {new.session_id}


async def test_the_commands_update_follows_the_session_new_response(tmp_path: Path) -> None:
    editor = Editor()
    async with bridge(tmp_path, editor) as conn:
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        with anyio.fail_after(10):
            while not editor.of(AvailableCommandsUpdate):
                await anyio.sleep(0.01)
    commands = editor.of(AvailableCommandsUpdate)[0].available_commands
    assert [c.name for c in commands] == ["provider"]
    assert editor.updates[0][0] == new.session_id


async def test_the_provider_command_switches_the_provider(tmp_path: Path) -> None:
    editor = Editor()
    async with bridge(tmp_path, editor) as conn:
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        switched = await conn.prompt(session_id=new.session_id, prompt=[text_block("/provider echo")])
        answer = await conn.prompt(session_id=new.session_id, prompt=[text_block("again")])
    assert switched.stop_reason == "end_turn" and answer.stop_reason == "end_turn"
    assert "This session now uses echo." in editor.text() and "echo: again" in editor.text()


async def test_session_cancel_answers_the_prompt_cancelled(tmp_path: Path) -> None:
    editor = Editor()
    async with bridge(tmp_path, editor) as conn:
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.set_config_option(session_id=new.session_id, config_id="provider", value="slow")
        async with anyio.create_task_group() as tg:
            answers: list[Any] = []

            async def prompt() -> None:
                answers.append(await conn.prompt(session_id=new.session_id, prompt=[text_block("count")]))

            tg.start_soon(prompt)
            with anyio.fail_after(20):
                while "1 " not in editor.text():
                    await anyio.sleep(0.01)
            await conn.cancel(session_id=new.session_id)
    assert answers[0].stop_reason == "cancelled"


async def test_a_permission_request_is_asked_of_the_editor_and_its_answer_relayed(tmp_path: Path) -> None:
    editor = Editor()
    editor.choose = "opt-reject_once"
    async with bridge(tmp_path, editor) as conn:
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.set_config_option(session_id=new.session_id, config_id="provider", value="asker")
        answer = await conn.prompt(session_id=new.session_id, prompt=[text_block("write it")])
    assert answer.stop_reason == "end_turn"
    assert len(editor.asked) == 1
    asked = editor.asked[0]
    assert asked["sessionId"] == new.session_id
    assert asked["options"] == ["opt-allow_once", "opt-allow_always", "opt-reject_once", "opt-reject_always"]
    assert asked["tool"].title == "Write file"
    assert "permission: opt-reject_once" in editor.text()


async def test_sessions_are_listed_and_loaded_after_a_restart_with_their_conversation(tmp_path: Path) -> None:
    first = Editor()
    async with bridge(tmp_path, first) as conn:
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.set_config_option(session_id=new.session_id, config_id="provider", value="echo")
        await conn.prompt(session_id=new.session_id, prompt=[text_block("remember me")])
    second = Editor()
    async with bridge(tmp_path, second) as conn:
        listed = await conn.list_sessions(cwd=str(tmp_path))
        assert [s.session_id for s in listed.sessions] == [new.session_id]
        (tmp_path / "link").symlink_to(tmp_path)
        via_link = await conn.list_sessions(cwd=str(tmp_path / "link") + "/")
        assert [s.session_id for s in via_link.sessions] == [new.session_id]
        assert listed.sessions[0].cwd == str(tmp_path)
        loaded = await conn.load_session(session_id=new.session_id, cwd=str(tmp_path), mcp_servers=[])
        replayed = list(second.updates)
        answer = await conn.prompt(session_id=new.session_id, prompt=[text_block("and now?")])
    assert loaded.config_options[0].current_value == "echo"
    kinds = [type(u).__name__ for _, u in replayed]
    assert kinds[:2] == ["UserMessageChunk", "AgentMessageChunk"]
    assert [c.name for c in second.of(AvailableCommandsUpdate)[0].available_commands][:1] == ["provider"]
    assert second.of(UserMessageChunk)[0].content.text == "remember me"
    assert replayed[1][1].content.text == "echo: remember me"
    assert answer.stop_reason == "end_turn" and "and now?" in second.text()


async def test_unknown_sessions_methods_and_content_get_clear_errors(tmp_path: Path) -> None:
    async with bridge(tmp_path, Editor()) as conn:
        with pytest.raises(RequestError) as unknown:
            await conn.prompt(session_id="nope", prompt=[text_block("hi")])
        assert unknown.value.code == -32004
        with pytest.raises(RequestError) as outside:
            await conn.new_session(cwd="/", mcp_servers=[])
        assert outside.value.code == -32602 and "cwd is outside the workspace roots" in str(outside.value)
        with pytest.raises(RequestError) as relative:
            await conn.new_session(cwd="project", mcp_servers=[])
        assert relative.value.code == -32602 and "absolute" in str(relative.value)
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        with pytest.raises(RequestError) as bad_option:
            await conn.set_config_option(session_id=new.session_id, config_id="provider", value="nobody")
        assert bad_option.value.code == -32602
        with pytest.raises(RequestError) as not_found:
            await conn.load_session(session_id="never-was", cwd=str(tmp_path), mcp_servers=[])
        assert not_found.value.code == -32004


def test_the_acp_dialect_is_plain_json_rpc_and_answers_broken_input(tmp_path: Path) -> None:
    lines = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}},
        "this is not json",
        {"jsonrpc": "2.0", "id": 1, "method": "session/fork", "params": {}},
        {"jsonrpc": "2.0", "method": "some/notification", "params": {}},
        {"jsonrpc": "2.0", "id": 2, "method": "acp.capabilities", "params": {}},
        {"jsonrpc": "2.0", "id": 3, "method": "session/new", "params": {"cwd": 7}},
    ]
    data = b"".join((line if isinstance(line, str) else json.dumps(line)).encode() + b"\n" for line in lines)
    done = subprocess.run(
        [*BRIDGE, "acp-stdio", "--config", str(config(tmp_path)), "--state-dir", str(tmp_path / "state")],
        input=data,
        capture_output=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert all(set(a) <= {"jsonrpc", "id", "result", "error"} for a in answers), "no envelope fields"
    by_id = {a.get("id"): a for a in answers}
    assert by_id[0]["result"]["protocolVersion"] == 1
    assert by_id[None]["error"]["code"] == -32700
    assert by_id[1]["error"]["code"] == -32601  # unstable: not offered
    assert by_id[2]["error"]["code"] == -32601  # the bridge's own methods are the other dialect
    assert by_id[3]["error"]["code"] == -32602
    assert len(answers) == 5  # the notification got nothing


async def test_the_editors_fs_reaches_the_provider_agent_through_the_bridge(tmp_path: Path) -> None:
    editor = Editor()
    editor.files["/project/notes.txt"] = "buffer text, unsaved"
    caps = ClientCapabilities(fs=FileSystemCapabilities(read_text_file=True, write_text_file=True))
    async with bridge(tmp_path, editor, caps) as conn:
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.set_config_option(session_id=new.session_id, config_id="provider", value="files")
        answer = await conn.prompt(session_id=new.session_id, prompt=[text_block("/project/notes.txt")])
    assert answer.stop_reason == "end_turn"
    assert editor.text() == "read: buffer text, unsaved wrote"
    assert editor.files["/project/notes.txt.out"] == "BUFFER TEXT, UNSAVED"
    assert editor.relayed == [("fs/read_text_file", new.session_id), ("fs/write_text_file", new.session_id)]


async def test_without_the_editors_fs_the_agent_is_not_offered_it(tmp_path: Path) -> None:
    editor = Editor()
    async with bridge(tmp_path, editor) as conn:
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.set_config_option(session_id=new.session_id, config_id="provider", value="files")
        await conn.prompt(session_id=new.session_id, prompt=[text_block("/project/notes.txt")])
    assert editor.text() == "no fs" and editor.relayed == []


async def test_mcp_servers_and_content_blocks_reach_the_provider_agent(tmp_path: Path) -> None:
    stdio = McpServerStdio(name="docs", command="/usr/bin/env", args=["docs-mcp"], env=[])
    http = HttpMcpServer(type="http", name="web", url="http://127.0.0.1:9/mcp", headers=[])
    blocks = [
        text_block("explain"),
        resource_link_block("main.py", f"file://{tmp_path}/main.py"),
        resource_block(embedded_text_resource(f"file://{tmp_path}/a.py", "print(1)")),
    ]
    async with bridge(tmp_path, Editor()) as conn:
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[stdio, http])
        await conn.set_config_option(session_id=new.session_id, config_id="provider", value="echo")
        await conn.prompt(session_id=new.session_id, prompt=blocks)
    received = [json.loads(line) for line in (tmp_path / "echo.log").read_text().splitlines()]
    new_params = next(r["params"] for r in received if r.get("method") == "session/new")
    # the agent advertises no http MCP: the stdio server only (the http one is logged by name)
    assert new_params["mcpServers"] == [stdio.model_dump(by_alias=True, exclude_none=True)]
    prompt = next(r["params"]["prompt"] for r in received if r.get("method") == "session/prompt")
    assert prompt == [b.model_dump(by_alias=True, exclude_none=True) for b in blocks]


async def test_the_provider_agents_models_become_the_editors_model_option(tmp_path: Path) -> None:
    editor = Editor()
    async with bridge(tmp_path, editor) as conn:
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        assert [o.id for o in new.config_options or []] == ["provider"]  # no agent yet: no models known
        await conn.set_config_option(session_id=new.session_id, config_id="provider", value="picky")
        await conn.prompt(session_id=new.session_id, prompt=[text_block("first")])
        offered = editor.of(ConfigOptionUpdate)[-1].config_options
        model = next(o for o in offered if o.id == "model")
        assert model.category == "model" and model.current_value == "m-default"
        assert [o.value for o in model.options] == ["m-default", "m-fast"]
        chosen = await conn.set_config_option(session_id=new.session_id, config_id="model", value="m-fast")
        assert next(o for o in chosen.config_options if o.id == "model").current_value == "m-fast"
        with pytest.raises(RequestError) as unknown:
            await conn.set_config_option(session_id=new.session_id, config_id="model", value="m-huge")
        assert unknown.value.code == -32602
        mode = next(o for o in offered if o.id == "mode")
        assert [o.value for o in mode.options] == ["build", "plan"]
        await conn.set_session_mode(session_id=new.session_id, mode_id="plan")
        with pytest.raises(RequestError) as no_mode:
            await conn.set_session_mode(session_id=new.session_id, mode_id="yolo")
        assert no_mode.value.code == -32602
        await conn.prompt(session_id=new.session_id, prompt=[text_block("second")])
    received = [json.loads(line) for line in (tmp_path / "picky.log").read_text().splitlines()]
    sets = [r["params"] for r in received if r.get("method") == "session/set_config_option"]
    assert sorted((p["configId"], p["value"]) for p in sets) == [("mode", "plan"), ("model", "m-fast")]


async def test_a_provider_that_cannot_run_stays_choosable_and_its_prompt_says_why(tmp_path: Path) -> None:
    async with bridge(tmp_path, Editor()) as conn:
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        ghost = next(o for o in new.config_options[0].options if o.value == "ghost")
        assert ghost.description and ghost.description.startswith("unavailable now:")
        await conn.set_config_option(session_id=new.session_id, config_id="provider", value="ghost")
        with pytest.raises(RequestError) as unavailable:
            await conn.prompt(session_id=new.session_id, prompt=[text_block("hi")])
    assert unavailable.value.code == -32603
    assert unavailable.value.data["code"] == "PROVIDER_UNAVAILABLE"


async def test_an_agent_that_needs_authentication_says_how_in_the_error(tmp_path: Path) -> None:
    async with bridge(tmp_path, Editor()) as conn:
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.set_config_option(session_id=new.session_id, config_id="provider", value="locked")
        with pytest.raises(RequestError) as locked:
            await conn.prompt(session_id=new.session_id, prompt=[text_block("hi")])
        data = locked.value.data
        assert data["code"] == "AGENT_AUTH_REQUIRED" and data["providerId"] == "locked"
        assert data["authMethods"] == ["fake-key"] and data["hint"]
        assert str(locked.value).startswith("locked: ")
        again = await conn.set_config_option(session_id=new.session_id, config_id="provider", value="locked")
        assert "locked" in [o.value for o in again.config_options[0].options]  # still offered


async def test_a_permission_answer_naming_no_offered_option_is_a_rejection_at_once(tmp_path: Path) -> None:
    editor = Editor()
    editor.choose = "made-up-option"
    async with bridge(tmp_path, editor) as conn:
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.set_config_option(session_id=new.session_id, config_id="provider", value="asker")
        with anyio.fail_after(20):  # permissionTimeout (60 s) must not be what ends it
            answer = await conn.prompt(session_id=new.session_id, prompt=[text_block("write it")])
    assert answer.stop_reason == "end_turn" and "permission: opt-reject_once" in editor.text()


class RawEditor:
    """``acp-stdio`` driven with raw JSON lines (where the SDK hides what is under test: EOF,
    signals, withdrawn requests); every message read is kept in ``seen``."""

    def __init__(self, tmp_path: Path) -> None:
        self.argv = [*BRIDGE, "acp-stdio", "--config", str(config(tmp_path)), "--state-dir", str(tmp_path / "state")]
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.seen: list[dict[str, Any]] = []
        self._next_id = 0

    def request(self, method: str, params: dict[str, Any]) -> int:
        request_id, self._next_id = self._next_id, self._next_id + 1
        self.stdin.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode())
        self.stdin.write(b"\n")
        self.stdin.flush()
        return request_id

    def answer(self, request_id: int) -> dict[str, Any]:
        for line in self.stdout:
            self.seen.append(json.loads(line))
            if self.seen[-1].get("id") == request_id and "method" not in self.seen[-1]:
                return self.seen[-1]
        raise AssertionError("no answer")

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return self.answer(self.request(method, params))

    def session_on(self, provider: str, cwd: Path) -> str:
        """initialize, session/new in ``cwd``, the provider option set: the session id."""
        self.call("initialize", {"protocolVersion": 1})
        sid = self.call("session/new", {"cwd": str(cwd), "mcpServers": []})["result"]["sessionId"]
        self.call("session/set_config_option", {"sessionId": sid, "configId": "provider", "value": provider})
        return sid

    def prompt(self, sid: str, text: str) -> int:
        return self.request("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": text}]})

    def until_chunk(self, text: str) -> None:
        for line in self.stdout:
            self.seen.append(json.loads(line))
            if self.seen[-1].get("params", {}).get("update", {}).get("content", {}).get("text") == text:
                return
        raise AssertionError(f"no chunk {text!r}")

    def rest(self) -> list[dict[str, Any]]:
        """Everything until stdout ends."""
        self.seen += [json.loads(line) for line in self.stdout]
        return self.seen

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_when_the_editor_goes_away_its_running_turn_is_cancelled_recorded_and_the_bridge_exits(
    tmp_path: Path,
) -> None:
    editor = RawEditor(tmp_path)
    try:
        sid = editor.session_on("slow", tmp_path)
        prompt = editor.prompt(sid, "go")
        editor.until_chunk("1 ")
        editor.stdin.close()  # the editor is gone
        rest = editor.rest()
        assert editor.proc.wait(timeout=30) == 0
    finally:
        editor.close()
    assert next(m for m in rest if m.get("id") == prompt)["result"] == {"stopReason": "cancelled"}
    get = {"jsonrpc": "2.0", "id": 1, "method": "session.get", "params": {"sessionId": sid}}
    again = subprocess.run(
        editor.argv, input=json.dumps(get).encode() + b"\n", capture_output=True, timeout=60, cwd=ROOT
    )
    snapshot = json.loads(again.stdout.splitlines()[-1])["result"]
    assert snapshot["turns"][0]["status"] == "cancelled"


async def test_a_flood_of_session_new_holds_at_most_max_sessions_per_token(tmp_path: Path) -> None:
    async with bridge(tmp_path, Editor()) as conn:
        used = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.set_config_option(session_id=used.session_id, config_id="provider", value="echo")
        await conn.prompt(session_id=used.session_id, prompt=[text_block("keep me")])
        flood = [(await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id for _ in range(60)]
        with pytest.raises(RequestError) as evicted:  # the oldest unused ones made room
            await conn.prompt(session_id=flood[0], prompt=[text_block("hi")])
        assert evicted.value.code == -32004
        answer = await conn.prompt(session_id=used.session_id, prompt=[text_block("still here")])
        assert answer.stop_reason == "end_turn"
        newest = await conn.set_config_option(session_id=flood[-1], config_id="provider", value="echo")
        assert newest.config_options[0].current_value == "echo"


def test_a_permission_question_the_editor_leaves_open_is_withdrawn_when_the_turn_stops_waiting(
    tmp_path: Path,
) -> None:
    editor = RawEditor(tmp_path)
    try:
        sid = editor.session_on("asker", tmp_path)
        prompt = editor.prompt(sid, "?")
        result = editor.answer(prompt)["result"]  # never answered: permissionTimeout (1 s) ends the wait
    finally:
        editor.stdin.close()
        editor.proc.wait(timeout=30)
    seen = editor.seen
    asked = next(m for m in seen if m.get("method") == "session/request_permission")
    withdrawn = [m for m in seen if m.get("method") == "$/cancel_request"]
    assert withdrawn == [{"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": asked["id"]}}]
    assert seen.index(withdrawn[0]) < seen.index(next(m for m in seen if m.get("id") == prompt and "result" in m))
    assert result["stopReason"] == "end_turn"  # the agent got "cancelled" for its question and went on


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_ends_acp_stdio_as_the_end_of_its_input_does(tmp_path: Path, signum: int) -> None:
    editor = RawEditor(tmp_path)
    try:
        sid = editor.session_on("slow", tmp_path)
        prompt = editor.prompt(sid, "go")
        editor.until_chunk("1 ")
        agents = psutil.Process(editor.proc.pid).children(recursive=True)
        editor.proc.send_signal(signum)  # stdin stays open: the signal alone ends it
        rest = editor.rest()
        assert editor.proc.wait(timeout=30) == 0
    finally:
        editor.close()
    assert next(m for m in rest if m.get("id") == prompt)["result"] == {"stopReason": "cancelled"}
    gone, alive = psutil.wait_procs(agents, timeout=10)
    assert agents and not alive


def test_pipelined_requests_all_get_their_answers(tmp_path: Path) -> None:
    lines = [{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}]
    lines += [{"jsonrpc": "2.0", "id": n, "method": "session/list", "params": {}} for n in range(1, 201)]
    done = subprocess.run(
        [*BRIDGE, "acp-stdio", "--config", str(config(tmp_path)), "--state-dir", str(tmp_path / "state")],
        input=b"".join(json.dumps(line).encode() + b"\n" for line in lines),
        capture_output=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted(a["id"] for a in answers) == list(range(201))
    assert all("result" in a for a in answers), [a for a in answers if "error" in a][:3]


def test_broken_and_non_conforming_messages_get_json_rpc_errors(tmp_path: Path) -> None:
    deep = "[" * 3000
    first = subprocess.run(
        [*BRIDGE, "acp-stdio", "--config", str(config(tmp_path)), "--state-dir", str(tmp_path / "state")],
        input=deep.encode() + b"\n",
        capture_output=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert first.returncode == 0 and json.loads(first.stdout.splitlines()[0])["error"]["code"] in (-32700, -32600)
    lines = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}},
        {"id": 1, "method": "session/list", "params": {}},
        {"jsonrpc": "1.0", "id": 2, "method": "session/list", "params": {}},
        {"jsonrpc": "2.0", "id": [3], "method": "session/list", "params": {}},
        {"jsonrpc": "2.0", "id": 4, "method": "authenticate", "params": {"methodId": "anything"}},
        {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": [1, 2]}},
        deep,
        {"jsonrpc": "2.0", "id": 5, "method": "session/list", "params": {}},
    ]
    done = subprocess.run(
        [*BRIDGE, "acp-stdio", "--config", str(config(tmp_path)), "--state-dir", str(tmp_path / "state")],
        input=b"".join((ln if isinstance(ln, str) else json.dumps(ln)).encode() + b"\n" for ln in lines),
        capture_output=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    errors = [a["error"]["code"] for a in answers if a.get("id") is None]
    assert errors.count(-32600) == 3 and len(errors) == 4, answers  # the three, and the deep line
    by_id = {a["id"]: a for a in answers if a.get("id") is not None}
    assert by_id[4]["error"]["code"] == -32602
    assert "result" in by_id[5] and b"Traceback" not in done.stderr


async def test_a_mode_the_agent_switches_itself_shows_in_the_editors_mode_option(tmp_path: Path) -> None:
    editor = Editor()
    async with bridge(tmp_path, editor) as conn:
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.set_config_option(session_id=new.session_id, config_id="provider", value="mover")
        await conn.prompt(session_id=new.session_id, prompt=[text_block("first")])
        with anyio.fail_after(10):  # the agent switched after its answer: the update is in the pipe
            # the event, not the word: the log's first line (the agent's argv) holds "between-turns" too
            while '"event": "between-turns"' not in (tmp_path / "mover.log").read_text():
                await anyio.sleep(0.01)
        # A session's state that arrives between turns goes out with the next turn that streams
        # (or the one after it, when it came while that one was starting).
        await conn.prompt(session_id=new.session_id, prompt=[text_block("second")])
        await conn.prompt(session_id=new.session_id, prompt=[text_block("third")])

        def modes() -> list[str]:
            return [
                next(o for o in u.config_options if o.id == "mode").current_value for u in editor.of(ConfigOptionUpdate)
            ]

        with anyio.fail_after(10):  # a notification may trail its turn's response on a busy machine
            while modes()[-1:] != ["plan"]:
                await anyio.sleep(0.01)
    assert modes()[0] == "build"


async def test_a_closed_session_loads_with_the_provider_it_last_used(tmp_path: Path) -> None:
    async with bridge(tmp_path, Editor()) as conn:
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.set_config_option(session_id=new.session_id, config_id="provider", value="echo")
        await conn.prompt(session_id=new.session_id, prompt=[text_block("hi")])
        await conn.close_session(session_id=new.session_id)
        loaded = await conn.load_session(session_id=new.session_id, cwd=str(tmp_path), mcp_servers=[])
    assert loaded.config_options[0].current_value == "echo"
