"""``chat`` renders citations for a terminal: ``[n](#citation-n)`` becomes ``[n]`` as the text
streams, however the anchors are split across deltas; ``--json`` keeps the raw result."""

from __future__ import annotations

import io
import itertools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.chat_view import ANCHOR, ChatView, TerminalAnchors
from tests.helpers import serving

TEXT = "Set it [1](#citation-1). Send it [12](#citation-12); not [3](#citation-4), [x](y) or [5] alone ["


def delta(text: str) -> dict:
    return {"method": "session.update", "params": {"type": "delta", "event": "delta", "delta": text}}


@given(st.lists(st.integers(min_value=0, max_value=len(TEXT)), max_size=12))
def test_anchors_split_anywhere_across_deltas_are_rewritten(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(TEXT)]
    anchors = TerminalAnchors()
    shown = "".join(anchors.feed(TEXT[a:b]) for a, b in itertools.pairwise(bounds)) + anchors.flush()
    assert shown == ANCHOR.sub(r"[\1]", TEXT)
    assert shown == "Set it [1]. Send it [12]; not [3](#citation-4), [x](y) or [5] alone ["


def test_only_a_possible_start_of_an_anchor_is_held_back() -> None:
    anchors = TerminalAnchors()
    assert anchors.feed("See [1](#cit") == "See "
    assert anchors.feed("ation-1) and [") == "[1] and "
    assert anchors.feed("2] and [a]") == "[2] and [a]"  # "[2] " could not become an anchor any more
    assert anchors.feed(" [7](#citation-7") == " " and anchors.flush() == "[7](#citation-7"


def test_the_chat_view_streams_terminal_anchors_and_ends_with_a_newline() -> None:
    out, err = io.StringIO(), io.StringIO()
    view = ChatView(out, err)
    for part in ("Use a token [", "1](#citation-", "1).", " Done [2](#citation-2"):
        view.show(delta(part))
    assert out.getvalue() == "Use a token [1]. Done "  # the last anchor is not complete yet
    view.show(delta(")"))
    view.close()
    assert out.getvalue() == "Use a token [1]. Done [2]\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def bridge(tmp_path: Path):
    """A real ``serve`` with no configuration: the embedded knowledge provider over the docs."""
    port = free_port()
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XWORKMATE_AGENTS_DIR": str(tmp_path / "none"),
        "PATH": os.path.dirname(sys.executable),
    }
    env.pop("BRIDGE_AUTH_TOKEN", None)
    with serving([sys.executable, "-m", "bridge.cli", "serve", "--port", str(port)], env, tmp_path):
        yield env, f"http://127.0.0.1:{port}"


@pytest.mark.timeout(90)
def test_chat_renders_citations_for_a_terminal_and_json_keeps_the_raw_result(bridge, tmp_path: Path) -> None:
    env, url = bridge
    ask = [sys.executable, "-m", "bridge.cli", "chat", "how do I set an auth token?", "--provider", "knowledge"]
    shown = subprocess.run([*ask, "--url", url], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "](#citation-" not in shown.stdout and "Bearer <token>`" in shown.stdout and "[1]" in shown.stdout
    assert "[1] docs/api.md › Auth and origins (bridge-docs: /docs/api/auth-and-origins)" in shown.stdout.splitlines()
    raw = subprocess.run(
        [*ask, "--url", url, "--json"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
    )
    assert raw.returncode == 0, raw.stderr
    result = json.loads(raw.stdout)
    assert "[1](#citation-1)" in result["output"] and result["status"] == "completed"
    artifact = result["artifacts"][0]
    assert artifact["type"] == "llmwiki_agent_result" and artifact["answer"] == result["output"]
