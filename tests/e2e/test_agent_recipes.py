"""Each pinned real agent completes one ACP turn, fully offline, against the fake model server.

For every agent: start the in-process fake model server on 127.0.0.1, build the agent's recipe
(tests/e2e/agents.py) in a temp dir, run initialize → session/new → session/prompt through the raw
ACP probe, and check that the streamed text is the fake reply, the turn ends with ``end_turn``, the
agent called the endpoint we expect, and the agent's whole process group is gone afterwards.

Agents that ``make agents`` has not installed are skipped. Run inside a loopback-only network
namespace (see tests/e2e/netns.py) to prove nothing leaves the machine.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from tests.e2e import agents  # noqa: E402
from tests.e2e.acp_probe import ProbeResult, run_probe  # noqa: E402
from tests.fakes.fake_llm import FakeLLM, RecordedRequest, fake_llm  # noqa: E402,F401

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

CHUNKS = ["Hello ", "from ", "mock"]
REPLY = "".join(CHUNKS)


async def _run(name: str, llm: FakeLLM, tmp_path: Path) -> tuple[dict, ProbeResult]:
    assert agents.installed(name), f"{name} is not installed under {agents.agents_dir()} (run `make agents`)"
    llm.set_reply(chunks=CHUNKS, delay=0.02)
    recipe = agents.recipe(name, llm.base_url, tmp_path)
    res = await run_probe(
        recipe,
        session_cwd=recipe["session_cwd"],
        prompt="Say hello",
        init_timeout=30,
        session_timeout=30,
        prompt_timeout=45,
        stderr_path=tmp_path / f"{name}.stderr",
    )
    context = (
        f"\nerror={res.error}\nsummary={res.describe()}\nfake requests={llm.summary()}"
        f"\n--- stderr tail ---\n{res.stderr_tail[-3000:]}"
    )
    assert res.error is None, context
    assert res.stop_reason == "end_turn", context
    assert REPLY in res.text, context
    # every configured chunk arrived as its own delta (claude adds one leading empty chunk)
    assert [c for c in res.chunks if c] == CHUNKS, context
    assert res.group_gone, f"survivors in the agent's process group: {res.survivors}{context}"
    assert llm.main_requests(), context
    return recipe, res


def _main(llm: FakeLLM) -> RecordedRequest:
    main = llm.main_requests()
    assert len(main) == 1, llm.summary()
    return main[0]


def _no_real_credentials_leaked(req: RecordedRequest) -> None:
    joined = " ".join(req.headers.values())
    assert agents.FAKE_KEY in joined, req.headers


async def test_opencode(fake_llm: FakeLLM, tmp_path: Path) -> None:
    recipe, res = await _run("opencode", fake_llm, tmp_path)
    main = _main(fake_llm)
    assert main.path == "/v1/chat/completions" and main.body["stream"] is True
    assert main.body["model"] == agents.OPENCODE_MODEL
    _no_real_credentials_leaked(main)
    # the second chat-completions call is opencode's title generator
    assert [r.kind for r in fake_llm.model_requests()].count("title") <= 1
    assert "configOptions" in res.session_new
    assert res.initialize["agentInfo"]["name"] == "OpenCode"


async def test_hermes(fake_llm: FakeLLM, tmp_path: Path) -> None:
    recipe, res = await _run("hermes", fake_llm, tmp_path)
    main = _main(fake_llm)
    assert main.path == "/v1/chat/completions" and main.body["stream"] is True
    assert main.body["model"] == agents.HERMES_MODEL
    _no_real_credentials_leaked(main)
    assert res.initialize["agentInfo"]["name"] == "hermes-agent"
    assert "models" in res.session_new and "modes" in res.session_new


async def test_gemini(fake_llm: FakeLLM, tmp_path: Path) -> None:
    recipe, res = await _run("gemini", fake_llm, tmp_path)
    main = _main(fake_llm)
    assert main.path == f"/v1beta/models/{agents.GEMINI_MODEL}:streamGenerateContent"
    assert main.query == "alt=sse"
    assert main.headers.get("x-goog-api-key") == agents.FAKE_KEY
    assert res.initialize["agentInfo"]["name"] == "gemini-cli"
    assert "models" in res.session_new and "modes" in res.session_new


async def test_codex(fake_llm: FakeLLM, tmp_path: Path) -> None:
    recipe, res = await _run("codex", fake_llm, tmp_path)
    main = _main(fake_llm)
    assert main.path == "/v1/responses" and main.body["stream"] is True
    assert main.body["model"] == agents.CODEX_MODEL
    assert main.headers.get("authorization") == f"Bearer {agents.FAKE_KEY}"
    assert res.text == REPLY  # a known model slug: no "unknown model metadata" warning chunk
    assert "configOptions" in res.session_new and "modes" in res.session_new


async def test_claude(fake_llm: FakeLLM, tmp_path: Path) -> None:
    recipe, res = await _run("claude", fake_llm, tmp_path)
    main = _main(fake_llm)
    assert main.path == "/v1/messages" and main.body["stream"] is True
    assert main.headers.get("x-api-key") == agents.FAKE_KEY
    assert res.initialize["authMethods"] == []
    assert {"models", "modes", "configOptions"} <= set(res.session_new)


def test_loopback_only_namespace_helper() -> None:
    """tests/e2e/netns.py builds a loopback-only namespace (as root), or says why it cannot."""
    from tests.e2e import netns

    st = netns.status()
    if os.geteuid() != 0 and not st.ok:
        # Without root, unshare may be refused: the helper must then say why (run-tests.sh falls
        # back to running without a namespace). As root (CI) the namespace must work.
        assert st.reason, st.as_dict()
        return
    assert st.ok, st.as_dict()
    assert st.inside["interfaces"] == ["lo"]
