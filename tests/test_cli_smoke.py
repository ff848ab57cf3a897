"""The `make run` path: the real CLI starts, answers /api/ping, and exits 0 on SIGTERM."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

pytestmark = pytest.mark.timeout(60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_answers_ping_and_exits_0_on_sigterm(tmp_path):
    port = free_port()
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "XWORKMATE_AGENTS_DIR": str(tmp_path / "none"),
        "PATH": os.path.dirname(sys.executable),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge.cli", "serve", "--port", str(port)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        for line in proc.stderr:
            if "listening on" in line:
                assert f"http://127.0.0.1:{port}" in line
                break
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/ping", timeout=10) as response:
            body = json.loads(response.read())
        assert set(body) == {"status", "image", "tag", "commit", "version", "buildDate"} and body["status"] == "ok"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()


def test_a_port_in_use_is_one_clear_line_and_exit_code_3(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path), "XWORKMATE_AGENTS_DIR": str(tmp_path / "none")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "bridge.cli", "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=30,
        )
    assert done.returncode == 3
    assert done.stderr.strip().splitlines() == [
        f"xworkmate-bridge: cannot listen on 127.0.0.1:{port}: address already in use (is another bridge running?)"
    ]  # nothing started, nothing claimed to listen


def test_an_address_that_is_not_local_is_exit_code_3(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "serve", "--host", "192.0.2.1", "--port", "0", "--allow-insecure-no-auth"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
    )
    assert done.returncode == 3
    assert (
        done.stderr.strip().splitlines()[-1]
        == "xworkmate-bridge: cannot listen on 192.0.2.1:0: cannot assign requested address"
    )


def test_serve_refuses_a_public_address_without_a_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "BRIDGE_AUTH_TOKEN"}
    done = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=30,
    )
    assert done.returncode == 2
    assert "token" in done.stderr.lower()


def test_call_reports_a_transport_error_with_exit_code_2(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "call", "acp.capabilities", "--url", f"http://127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
    )
    assert done.returncode == 2 and "cannot reach" in done.stderr


def test_bad_config_names_the_key(tmp_path):
    cfg = tmp_path / "bridge.yaml"
    cfg.write_text("port: 8787\nproviders:\n  mine:\n    command: x\n    permisionPolicy: allow\n")
    done = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "serve", "--config", str(cfg)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
    )
    assert done.returncode == 2
    assert "providers.mine.permisionPolicy" in done.stderr and "unknown key" in done.stderr


def test_output_piped_into_a_reader_that_leaves_is_not_a_traceback(tmp_path):
    """`xworkmate-bridge providers --local | head -1`: the reader closes the pipe early."""
    env = {**os.environ, "HOME": str(tmp_path), "XWORKMATE_AGENTS_DIR": str(tmp_path / "none")}
    read_end, write_end = os.pipe()
    os.close(read_end)  # a reader that already left: the first write meets EPIPE
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bridge.cli", "providers", "--local"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=30,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr
    assert proc.returncode == 1


def test_chat_summary_names_the_auth_methods_the_hint_refers_to():
    from bridge.cli import turn_summary

    result = {
        "status": "failed",
        "turnId": "turn-1",
        "resolvedProviderId": "codex",
        "success": False,
        "error": {
            "code": "AGENT_AUTH_REQUIRED",
            "message": "Authentication required",
            "data": {
                "hint": "set providers.<id>.authMethod to one of authMethods",
                "authMethods": ["chatgpt", {"id": "openai-api-key", "name": "API key"}],
            },
        },
    }
    lines = turn_summary(result, 0.13).splitlines()
    assert lines[0] == "[failed] turnId=turn-1 provider=codex seconds=0.13 AGENT_AUTH_REQUIRED: Authentication required"
    assert lines[1].startswith("hint: ") and lines[2] == "authMethods: chatgpt, openai-api-key"


def test_chat_lists_the_sources_its_citation_anchors_point_to():
    from bridge.cli import cited_sources

    result = {
        "output": "Use a token [1](#citation-1). See also [3](#citation-3) and [1](#citation-1).",
        "artifacts": [
            {
                "type": "llmwiki_agent_result",
                "citations": [
                    {"title": "Auth", "sourceId": "bridge-docs", "pageId": "auth", "path": "auth.md"},
                    {"title": "Unused", "sourceId": "bridge-docs", "path": "x.md"},
                    {"title": "Providers", "sourceId": "wiki", "path": "providers.md"},
                ],
            }
        ],
    }
    # the page as knowledge.read takes it, else the file
    assert cited_sources(result) == ["[1] Auth (bridge-docs: /auth)", "[3] Providers (wiki: providers.md)"]
    assert cited_sources({"output": "no anchors", "artifacts": []}) == []


@pytest.mark.parametrize(
    "result",
    [
        {"output": "see [1](#citation-" + "9" * 4400 + ")", "artifacts": [{"citations": []}]},
        {"output": "see [1](#citation-1)", "artifacts": 5},
        {"output": "see [1](#citation-1)", "artifacts": [{"citations": [5, None]}]},
        {"output": 7, "artifacts": [{"citations": "x"}]},
        {"status": "failed", "error": {"code": "X", "message": "m", "data": {"authMethods": 5, "hint": "h"}}},
        {"status": "failed", "error": {"code": "X", "message": "m", "data": "not a mapping"}},
        {"status": "failed", "error": "not a mapping"},
    ],
)
def test_chat_output_survives_malformed_results(result):
    from bridge.cli import cited_sources, turn_summary

    assert isinstance(cited_sources(result), list)
    assert turn_summary(result, 0.5).startswith("[")


def test_providers_refuses_local_only_flags_without_local(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "providers", "--probe"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
    )
    assert done.returncode == 2 and "need --local" in done.stderr


def test_a_bridge_that_answers_what_is_not_json_is_a_transport_error(tmp_path):
    """Once an orjson error escaped as a traceback: the CLI says what happened, exit code 2."""
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
                b"data: {not json\r\n\r\n"
            )

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bridge.cli",
                "call",
                "acp.capabilities",
                "--url",
                f"http://127.0.0.1:{server.getsockname()[1]}",
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=30,
        )
    finally:
        thread.join(10)
        server.close()
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "answered something that is not JSON" in done.stderr


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _note(**update):
    return {"method": "session.update", "params": update}


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
def test_chat_shows_a_wait_on_one_line_that_updates(terminal):
    from bridge.cli import ChatView

    out, err = io.StringIO(), (_Terminal() if terminal else io.StringIO())
    view = ChatView(out, err)
    view.show(_note(type="status", event="started", message="session started"))
    view.show(_note(type="status", event="waiting", reason="output", message="waiting for the agent's output (10 s)"))
    view.show(_note(type="status", event="waiting", reason="output", message="waiting for the agent's output (20 s)"))
    view.show(_note(type="delta", event="delta", delta="Hello"))
    view.close()
    assert out.getvalue() == "Hello\n"
    if terminal:  # rewritten in place, then erased before the text
        assert err.getvalue() == (
            "[status] session started\n"
            "\r\x1b[K[waiting] waiting for the agent's output (10 s)"
            "\r\x1b[K[waiting] waiting for the agent's output (20 s)"
            "\r\x1b[K"
        )
    else:
        assert err.getvalue().splitlines() == [
            "[status] session started",
            "[waiting] waiting for the agent's output (10 s)",
            "[waiting] waiting for the agent's output (20 s)",
        ]


def test_sources_lists_the_configured_knowledge_sources_without_a_server(tmp_path):
    wiki = tmp_path / "wiki"
    wiki.mkdir()
    (wiki / "refunds.md").write_text("# Refunds\n\nRefunds need approval.\n")
    cfg = tmp_path / "bridge.yaml"
    cfg.write_text(
        "workspaceRoots: [" + str(tmp_path) + "]\n"
        "knowledgeSources:\n"
        f"  - {{id: ops, label: Ops wiki, protocol: local-wiki, root: {wiki}}}\n"
        "  - {id: remote, label: Remote, protocol: llmwiki-http, url: 'http://127.0.0.1:1'}\n"
    )
    argv = [sys.executable, "-m", "bridge.cli", "sources", "--config", str(cfg)]
    listed = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    assert [line.split()[0] for line in listed] == ["ops", "remote"] and all("configured" in line for line in listed)
    probed = subprocess.run([*argv, "--probe"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert "ready  1 pages" in probed and "not ready (connect)" in probed
    raw = json.loads(subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=60, check=True).stdout)
    assert [s["id"] for s in raw["sources"]] == ["ops", "remote"]
