"""Editor mode end to end: the official Python ACP SDK spawns ``xworkmate-bridge acp-stdio`` whose
provider is a pinned real agent (offline recipe, the fake model server on 127.0.0.1), picks the
provider through the ``provider`` config option, and streams a prompt through it. Every message
the SDK receives is parsed with its schema models."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from acp import PROTOCOL_VERSION, text_block
from acp.schema import AgentMessageChunk, ClientCapabilities, FileSystemCapabilities, Implementation
from acp.stdio import spawn_agent_process

from tests.e2e import agents
from tests.e2e.test_bridge_agents import AGENTS, CHUNKS, config_dict
from tests.editor.test_acp_stdio import Editor
from tests.fakes.fake_llm import FakeLLM, Reply, fake_llm  # noqa: F401  (fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]
ROOT = Path(__file__).resolve().parents[2]


def config(name: str, recipe: dict[str, Any], tmp_path: Path) -> Path:
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(config_dict(name, recipe, tmp_path)))
    return path


@pytest.mark.parametrize("name", AGENTS)
async def test_an_editor_prompt_streams_a_real_agent_answer(name: str, fake_llm: FakeLLM, tmp_path: Path) -> None:
    assert agents.installed(name), f"{name} is missing from {agents.agents_dir()}: run `make agents`"
    fake_llm.set_reply(chunks=CHUNKS, delay=0.02)
    recipe = agents.recipe(name, fake_llm.base_url, tmp_path)
    editor = Editor()
    argv = ["-m", "bridge.cli", "acp-stdio", "--config", str(config(name, recipe, tmp_path))]
    argv += ["--state-dir", str(tmp_path / "state")]
    async with spawn_agent_process(editor, sys.executable, *argv, cwd=str(ROOT)) as (conn, _process):
        await conn.initialize(
            protocol_version=PROTOCOL_VERSION,
            client_capabilities=ClientCapabilities(),
            client_info=Implementation(name="e2e-editor", version="1"),
        )
        new = await conn.new_session(cwd=str(recipe["session_cwd"]), mcp_servers=[])
        chosen = await conn.set_config_option(session_id=new.session_id, config_id="provider", value=name)
        assert chosen.config_options[0].current_value == name
        answer = await conn.prompt(session_id=new.session_id, prompt=[text_block("Say hello")])
        again = await conn.prompt(session_id=new.session_id, prompt=[text_block("Once more")])
    context = f"updates={editor.updates}\nllm={fake_llm.summary()}"
    assert answer.stop_reason == "end_turn" and again.stop_reason == "end_turn", context
    chunks = [u.content.text for u in editor.of(AgentMessageChunk)]
    assert "Hello from mock" in "".join(chunks), context
    assert [c for c in chunks if c.strip()][-3:] == CHUNKS, context
    assert {sid for sid, _ in editor.updates} == {new.session_id}


def gemini_tool_use(path: Path) -> Any:
    """The fake model's part of a gemini turn that reads ``path`` and writes ``path``.out: a
    ``read_file`` call, then a ``write_file`` call, then a text answer."""

    def respond(rec: Any) -> Reply:
        contents = (rec.body or {}).get("contents") or []
        parts = contents[-1].get("parts", []) if contents else []
        answered = [p["functionResponse"] for p in parts if isinstance(p, dict) and "functionResponse" in p]
        if not answered:
            return Reply(chunks=["Reading. "], function_call={"name": "read_file", "args": {"file_path": str(path)}})
        if answered[0].get("name") == "read_file":
            args = {"file_path": f"{path}.out", "content": "UPPER-CASED\n"}
            return Reply(chunks=["Writing. "], function_call={"name": "write_file", "args": args})
        return Reply(chunks=["Done."])

    return respond


async def test_a_real_agents_file_tools_use_the_editors_fs_through_the_bridge(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    assert agents.installed("gemini"), f"gemini is missing from {agents.agents_dir()}: run `make agents`"
    recipe = agents.recipe("gemini", fake_llm.base_url, tmp_path)
    work = Path(recipe["session_cwd"])
    (work / "notes.txt").write_text("disk text\n")  # the editor's unsaved buffers differ
    (work / "notes.txt.out").write_text("old on disk\n")
    fake_llm.responder = gemini_tool_use(work / "notes.txt")
    editor = Editor()
    editor.files[str(work / "notes.txt")] = "editor buffer\n"
    editor.files[str(work / "notes.txt.out")] = "old in the editor\n"
    caps = ClientCapabilities(fs=FileSystemCapabilities(read_text_file=True, write_text_file=True))
    argv = ["-m", "bridge.cli", "acp-stdio", "--config", str(config("gemini", recipe, tmp_path))]
    argv += ["--state-dir", str(tmp_path / "state")]
    async with spawn_agent_process(editor, sys.executable, *argv, cwd=str(ROOT)) as (conn, _process):
        await conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=caps)
        new = await conn.new_session(cwd=str(work), mcp_servers=[])
        await conn.set_config_option(session_id=new.session_id, config_id="provider", value="gemini")
        answer = await conn.prompt(session_id=new.session_id, prompt=[text_block("Upper-case notes.txt")])
    context = f"updates={editor.updates}\nllm={fake_llm.summary()}"
    assert answer.stop_reason == "end_turn", context
    assert ("fs/read_text_file", new.session_id) in editor.relayed, context
    assert ("fs/write_text_file", new.session_id) in editor.relayed, context
    assert editor.files[f"{work / 'notes.txt'}.out"] == "UPPER-CASED\n", context
    assert (work / "notes.txt.out").read_text() == "old on disk\n", "written into the editor, not to disk"
