"""What the bridge sends ACP agents fits the ACP schema, as the ``agent-client-protocol`` package
models it (pinned in pyproject.toml). The adapter builds raw dicts (compat/acp/connection.py says
why); these tests hold them to the schema: ``initialize``, ``session/new``, ``session/load``,
``session/prompt`` (with attachments), ``session/set_config_option``, ``session/cancel`` and the
answer to ``session/request_permission``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import acp.schema as schema
import anyio

from compat.base import Attachment

from .conftest import AgentFactory, RecordingSink, received, turn_request, wait_log


def sent(log: Path, method: str) -> list[dict[str, Any]]:
    return [entry["params"] for entry in received(log, method)]


async def test_a_turn_sends_messages_that_fit_the_acp_schema(make_agent: AgentFactory, tmp_path: Path) -> None:
    doc = tmp_path / "notes.md"
    doc.write_text("notes")
    adapter = await make_agent("configoptions")
    session = adapter.open_session("s1")
    attachments = (Attachment(name="notes.md", path=str(doc), description="the notes"),)
    outcome = await session.run_turn(turn_request("hello", attachments=attachments, model="m-fast"), RecordingSink())
    assert outcome.status == "completed"
    schema.InitializeRequest.model_validate(sent(make_agent.log, "initialize")[0])
    schema.NewSessionRequest.model_validate(sent(make_agent.log, "session/new")[0])
    schema.SetSessionConfigOptionSelectRequest.model_validate(sent(make_agent.log, "session/set_config_option")[0])
    prompt = schema.PromptRequest.model_validate(sent(make_agent.log, "session/prompt")[0])
    assert [block.type for block in prompt.prompt] == ["text", "resource_link"]


async def test_a_permission_answer_fits_the_acp_schema(make_agent: AgentFactory) -> None:
    adapter = await make_agent("permission", permission_policy="allow")
    outcome = await adapter.open_session("s1").run_turn(turn_request(), RecordingSink())
    assert outcome.status == "completed"
    answer = await wait_log(make_agent.log, lambda e: e.get("event") == "permission")
    schema.RequestPermissionResponse.model_validate({"outcome": answer["outcome"]})


async def test_a_cancel_fits_the_acp_schema(make_agent: AgentFactory) -> None:
    adapter = await make_agent("slow")
    session = adapter.open_session("s1")
    async with anyio.create_task_group() as tg:
        tg.start_soon(session.run_turn, turn_request(), sink := RecordingSink())
        await sink.wait_for(lambda s: bool(s.text))
        assert session.request_cancel()
    schema.CancelNotification.model_validate(sent(make_agent.log, "session/cancel")[0])


async def test_a_reloaded_session_sends_a_load_that_fits_the_acp_schema(make_agent: AgentFactory) -> None:
    adapter = await make_agent("loadsession", timeouts={"idle_timeout": 0.05})
    session = adapter.open_session("s1")
    assert (await session.run_turn(turn_request("one"), RecordingSink())).status == "completed"
    with anyio.fail_after(10):
        while session.pid is not None:
            await anyio.sleep(0.02)  # the idle reaper ends the agent; no event marks it
    assert (await session.run_turn(turn_request("two"), RecordingSink())).status == "completed"
    schema.LoadSessionRequest.model_validate(sent(make_agent.log, "session/load")[0])
