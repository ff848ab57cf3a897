"""A small raw ACP client used to verify the real agents' launch recipes.

It speaks newline-delimited JSON-RPC 2.0 over the agent's stdio, with no SDK in between, so every field
the agent sends (``models``, ``_meta``, unknown update kinds) is kept as a plain dict.

Sequence: ``initialize`` → (``authenticate`` if asked) → ``session/new`` → ``session/prompt``. While the
prompt runs it answers ``session/request_permission`` with the ``allow_once`` option (falling back to any
``allow_*``), answers ``fs/*`` / ``terminal/*`` / unknown requests with -32601 (we advertise neither),
and collects ``agent_message_chunk`` text. stderr is drained all the time (a full pipe would block the
agent). Every step has its own timeout. The agent runs in its own session/process group
(``start_new_session=True``); at the end stdin is closed and, after a short grace period, the whole
group gets SIGTERM and then SIGKILL (codex-acp and claude-agent-acp ignore stdin EOF).

Library use::

    result = await run_probe(recipe, session_cwd="/tmp/x", prompt="Say hello")
    result.text, result.stop_reason, result.initialize, result.session_new, result.timings, result.group_gone

CLI (runs one recipe from ``tests/e2e/agents.py`` against a fake model server started in-process)::

    .venv/bin/python tests/e2e/acp_probe.py gemini [--prompt TEXT] [--chunk A --chunk B] [--json]
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Environment every agent gets even when the recipe is run with inherit_env=False.
_BASE_ENV_KEYS = ("LANG", "LC_ALL", "TZ", "TMPDIR")

CLIENT_INFO = {"name": "xworkmate-acp-probe", "title": "xworkmate ACP probe", "version": "0.1.0"}


class ProbeError(RuntimeError):
    """A JSON-RPC error, a timeout or an early exit during one probe step."""

    def __init__(self, step: str, message: str, error: Any = None) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step
        self.error = error


@dataclass
class ProbeResult:
    command: list[str]
    pid: int | None = None
    initialize: dict[str, Any] | None = None
    authenticate: Any = None
    session_new: dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    error: dict[str, Any] | None = None  # {"step", "message", "error"} for the first failed step
    chunks: list[str] = field(default_factory=list)
    thoughts: list[str] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)
    agent_requests: list[dict[str, Any]] = field(default_factory=list)
    permissions: list[dict[str, Any]] = field(default_factory=list)
    non_json_stdout: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    stderr_tail: str = ""
    returncode: int | None = None
    exited_on_eof: bool | None = None
    group_gone: bool | None = None
    survivors: list[int] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.chunks)

    @property
    def stop_reason(self) -> str | None:
        return (self.prompt or {}).get("stopReason")

    @property
    def session_id(self) -> str | None:
        return (self.session_new or {}).get("sessionId")

    def update_kinds(self) -> list[str]:
        return [u.get("update", {}).get("sessionUpdate", "?") for u in self.updates]

    def describe(self) -> dict[str, Any]:
        """A compact, JSON-able summary for logs and reports."""
        init = self.initialize or {}
        new = self.session_new or {}
        return {
            "command": self.command,
            "agentInfo": init.get("agentInfo"),
            "agentCapabilities": init.get("agentCapabilities"),
            "authMethods": init.get("authMethods"),
            "session_new_keys": sorted(new.keys()),
            "has_configOptions": "configOptions" in new,
            "has_models": "models" in new,
            "has_modes": "modes" in new,
            "prompt_result": self.prompt,
            "error": self.error,
            "text": self.text,
            "chunks": self.chunks,
            "update_kinds": self.update_kinds(),
            "agent_requests": [r.get("method") for r in self.agent_requests],
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "exited_on_eof": self.exited_on_eof,
            "group_gone": self.group_gone,
            "returncode": self.returncode,
        }


def build_env(recipe_env: Mapping[str, str] | None, inherit_env: bool = False) -> dict[str, str]:
    """The child environment: the recipe's env on top of a minimal base (or the full os.environ)."""
    if inherit_env:
        env = dict(os.environ)
    else:
        env = {k: os.environ[k] for k in _BASE_ENV_KEYS if k in os.environ}
        env.setdefault("PATH", os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"))
    env.update({k: str(v) for k, v in (recipe_env or {}).items()})
    return env


def _pgid_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid`` (scans /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:
            continue
        # pid (comm) state ppid pgrp ... ; comm may contain spaces/parens, so split after the last ')'.
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) >= 3 and rest[0] != "Z" and int(rest[2]) == pgid:
            members.append(int(entry))
    return members


class AcpProbe:
    """One agent process and its JSON-RPC plumbing."""

    def __init__(
        self,
        command: str,
        args: list[str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        *,
        stderr_path: str | os.PathLike[str] | None = None,
        stderr_tail_bytes: int = 64 * 1024,
        permission_kind: str = "allow_once",
    ) -> None:
        self.command = command
        self.args = list(args or [])
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.stderr_path = stderr_path
        self.permission_kind = permission_kind
        self.proc: asyncio.subprocess.Process | None = None
        self.result = ProbeResult(command=[command, *self.args])
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._stderr = deque(maxlen=stderr_tail_bytes)  # bytes
        self._stderr_fh = None
        self._closed = asyncio.Event()

    # ---- process ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self.stderr_path is not None:
            self._stderr_fh = open(self.stderr_path, "ab")
        self.proc = await asyncio.create_subprocess_exec(
            self.command,
            *self.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
            limit=64 * 1024 * 1024,
        )
        self.result.pid = self.proc.pid
        self._tasks.append(asyncio.create_task(self._read_stdout()))
        self._tasks.append(asyncio.create_task(self._drain_stderr()))

    async def _drain_stderr(self) -> None:
        assert self.proc and self.proc.stderr
        while True:
            data = await self.proc.stderr.read(65536)
            if not data:
                break
            self._stderr.extend(data)
            if self._stderr_fh is not None:
                self._stderr_fh.write(data)
                self._stderr_fh.flush()

    def stderr_tail(self, nbytes: int = 4000) -> str:
        data = bytes(self._stderr)[-nbytes:]
        return data.decode(errors="replace")

    async def _read_stdout(self) -> None:
        assert self.proc and self.proc.stdout
        try:
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    break
                line = line.strip()
                if not line:
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    self.result.non_json_stdout.append(line.decode(errors="replace")[:500])
                    continue
                if isinstance(msg, dict):
                    await self._dispatch(msg)
        finally:
            self._closed.set()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(EOFError("agent closed stdout"))

    async def _send(self, msg: dict[str, Any]) -> None:
        assert self.proc and self.proc.stdin
        data = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def request(self, method: str, params: Any, timeout: float) -> Any:
        rid = self._next_id
        self._next_id += 1
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            await self._send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
            msg = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise ProbeError(method, f"no answer within {timeout:.0f}s") from None
        except EOFError:
            raise ProbeError(method, "agent exited (stdout closed) before answering") from None
        finally:
            self._pending.pop(rid, None)
        if "error" in msg:
            err = msg["error"]
            raise ProbeError(method, str(err.get("message") if isinstance(err, dict) else err), err)
        return msg.get("result")

    async def notify(self, method: str, params: Any) -> None:
        await self._send({"jsonrpc": "2.0", "method": method, "params": params})

    async def _dispatch(self, msg: dict[str, Any]) -> None:
        method = msg.get("method")
        if method is None:
            rid = msg.get("id")
            fut = self._pending.get(rid) if isinstance(rid, int) else None
            if fut is not None and not fut.done():
                fut.set_result(msg)
            return
        params = msg.get("params") or {}
        if "id" not in msg:  # notification
            if method == "session/update":
                self.result.updates.append(params)
                upd = params.get("update") or {}
                kind = upd.get("sessionUpdate")
                content = upd.get("content") or {}
                if kind == "agent_message_chunk" and content.get("type") == "text":
                    self.result.chunks.append(content.get("text", ""))
                elif kind == "agent_thought_chunk" and content.get("type") == "text":
                    self.result.thoughts.append(content.get("text", ""))
            return
        # a request from the agent
        self.result.agent_requests.append({"method": method, "params": params})
        if method == "session/request_permission":
            self.result.permissions.append(params)
            options = params.get("options") or []
            chosen = next((o for o in options if o.get("kind") == self.permission_kind), None)
            chosen = chosen or next((o for o in options if str(o.get("kind", "")).startswith("allow")), None)
            if chosen is None:
                outcome: dict[str, Any] = {"outcome": "cancelled"}
            else:
                outcome = {"outcome": "selected", "optionId": chosen["optionId"]}
            await self._send({"jsonrpc": "2.0", "id": msg["id"], "result": {"outcome": outcome}})
            return
        await self._send(
            {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": f"method not found: {method}"}}
        )

    async def close(self, eof_grace: float = 1.5, term_grace: float = 3.0) -> None:
        """Close stdin, then SIGTERM and SIGKILL the whole process group; record whether it is gone."""
        proc = self.proc
        if proc is None:
            return
        pgid = proc.pid  # start_new_session=True: the child leads its own group
        try:
            if proc.stdin and not proc.stdin.is_closing():
                proc.stdin.close()
        except (OSError, RuntimeError):
            pass
        try:
            await asyncio.wait_for(proc.wait(), eof_grace)
            self.result.exited_on_eof = True
        except TimeoutError:
            self.result.exited_on_eof = False
        for sig, grace in ((signal.SIGTERM, term_grace), (signal.SIGKILL, 2.0)):
            if not _pgid_members(pgid) and proc.returncode is not None:
                break
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                if proc.returncode is not None and not _pgid_members(pgid):
                    break
                try:
                    await asyncio.wait_for(proc.wait(), 0.1)
                except TimeoutError:
                    pass
        if proc.returncode is None:
            try:
                await asyncio.wait_for(proc.wait(), 2.0)
            except TimeoutError:
                pass
        self.result.returncode = proc.returncode
        self.result.survivors = _pgid_members(pgid)
        self.result.group_gone = not self.result.survivors
        for t in self._tasks:
            if not t.done():
                try:
                    await asyncio.wait_for(t, 2.0)
                except (TimeoutError, Exception):
                    t.cancel()
        self.result.stderr_tail = self.stderr_tail()
        if self._stderr_fh is not None:
            self._stderr_fh.close()
            self._stderr_fh = None


async def run_probe(
    recipe: Mapping[str, Any],
    *,
    session_cwd: str,
    prompt: str = "Say hello",
    auth_method: str | None = None,
    client_capabilities: dict[str, Any] | None = None,
    inherit_env: bool = False,
    init_timeout: float = 60.0,
    session_timeout: float = 60.0,
    prompt_timeout: float = 60.0,
    stderr_path: str | os.PathLike[str] | None = None,
    mcp_servers: list[Any] | None = None,
) -> ProbeResult:
    """Run initialize → authenticate? → session/new → session/prompt against one recipe and tear down.

    ``recipe`` is ``{"command", "args", "env", "cwd"}`` (plus an optional ``"auth_method"``). It never
    raises for protocol problems: the first failure lands in ``result.error``.
    """
    auth_method = auth_method or recipe.get("auth_method")
    probe = AcpProbe(
        recipe["command"],
        list(recipe.get("args") or []),
        build_env(recipe.get("env"), inherit_env),
        recipe.get("cwd"),
        stderr_path=stderr_path,
    )
    res = probe.result
    t0 = time.monotonic()
    try:
        await probe.start()
        caps = client_capabilities or {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False}
        t = time.monotonic()
        res.initialize = await probe.request(
            "initialize", {"protocolVersion": 1, "clientCapabilities": caps, "clientInfo": CLIENT_INFO}, init_timeout
        )
        res.timings["initialize"] = time.monotonic() - t
        if auth_method:
            t = time.monotonic()
            res.authenticate = await probe.request("authenticate", {"methodId": auth_method}, init_timeout)
            res.timings["authenticate"] = time.monotonic() - t
        t = time.monotonic()
        res.session_new = await probe.request(
            "session/new", {"cwd": session_cwd, "mcpServers": list(mcp_servers or [])}, session_timeout
        )
        res.timings["session_new"] = time.monotonic() - t
        sid = res.session_new.get("sessionId") if isinstance(res.session_new, dict) else None
        if prompt is not None:
            t = time.monotonic()
            res.prompt = await probe.request(
                "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": prompt}]}, prompt_timeout
            )
            res.timings["prompt"] = time.monotonic() - t
    except ProbeError as exc:
        res.error = {"step": exc.step, "message": str(exc), "error": exc.error}
    except (OSError, ValueError) as exc:
        res.error = {"step": "spawn", "message": repr(exc), "error": None}
    finally:
        await probe.close()
        res.timings["total"] = time.monotonic() - t0
    return res


# --------------------------------------------------------------------------------------------
# CLI: run one recipe against an in-process fake model server


def _main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    root = Path(__file__).resolve().parents[2]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from tests.e2e import agents
    from tests.fakes.fake_llm import FakeLLM

    ap = argparse.ArgumentParser(description="Run one real agent over ACP against the fake model server.")
    ap.add_argument("agent", choices=sorted(agents.AGENTS))
    ap.add_argument("--prompt", default="Say hello")
    ap.add_argument("--chunk", action="append", default=None)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--timeout", type=float, default=90.0)
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--json", action="store_true", help="print the full result as JSON")
    ap.add_argument("--requests", action="store_true", help="print recorded request bodies")
    args = ap.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix=f"acp-{args.agent}-")
    with FakeLLM(chunks=args.chunk, delay=args.delay) as llm:
        recipe = agents.recipe(args.agent, llm.base_url, tmp)
        res = asyncio.run(
            run_probe(
                recipe,
                session_cwd=recipe["session_cwd"],
                prompt=args.prompt,
                prompt_timeout=args.timeout,
                stderr_path=Path(tmp) / "agent.stderr",
            )
        )
        out = res.describe() | {"fake_llm_requests": llm.summary(), "tmp": tmp}
        if args.requests:
            out["request_bodies"] = [r.as_dict() | {"body": r.body} for r in llm.requests]
    if not args.json:
        out.pop("chunks", None)
    print(json.dumps(out, indent=2, default=str))
    if res.error:
        print("---- stderr tail ----\n" + res.stderr_tail[-3000:], file=sys.stderr)
    if not args.keep:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if (res.stop_reason == "end_turn" and not res.error) else 1


if __name__ == "__main__":
    sys.exit(_main())
