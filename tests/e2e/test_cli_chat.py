"""`xworkmate-bridge chat` prints a real agent's streamed answer, then the summary line."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from bridge.cli import build_app
from tests.e2e import agents
from tests.e2e.test_bridge_agents import bridge_config
from tests.fakes.fake_llm import FakeLLM, fake_llm  # noqa: F401  (fixture)
from tests.helpers import real_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.mark.parametrize("transport", ["http", "ws"])
async def test_chat_prints_the_streamed_answer_and_a_summary(transport: str, fake_llm: FakeLLM, tmp_path: Path):
    assert agents.installed("opencode"), "run `make agents`"
    fake_llm.set_reply(chunks=["Hello ", "from ", "mock"], delay=0.02)
    recipe = agents.recipe("opencode", fake_llm.base_url, tmp_path)
    config = bridge_config("opencode", recipe, tmp_path)
    async with real_server(config, build_app(config)) as port:
        argv = [
            sys.executable,
            "-m",
            "bridge.cli",
            "chat",
            "Say hello",
            "--provider",
            "opencode",
            "--cwd",
            str(recipe["session_cwd"]),
            "--url",
            f"{transport}://127.0.0.1:{port}",
        ]
        done = await anyio.run_process(argv, check=False, cwd=tmp_path)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    lines = out.strip().splitlines()
    assert "Hello from mock" in lines[0]
    assert lines[-1].startswith("[completed] turnId=turn-") and "provider=opencode" in lines[-1]
