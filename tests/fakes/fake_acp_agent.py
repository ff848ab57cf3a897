#!/usr/bin/env python3
"""A scriptable fake ACP agent: newline-delimited JSON-RPC 2.0 on stdin/stdout, stdlib only.

Behaviour is chosen with ``--mode NAME`` (repeatable) or ``FAKE_ACP_MODE=a,b``:

    (none)           echo: thought, three text chunks, tool_call + two updates, plan,
                     usage_update, session_info_update, a vendor update kind, then end_turn
    crash            one chunk, a message on stderr, exit 3 mid-turn
    prompt-error     answers session/prompt with error -32603 and data holding a secret
    garbage          non-JSON lines, JSON non-messages and blank lines around a normal echo
    bigline          a 100 KiB tool_call_update, then end_turn
    hugeline         a 256 KiB line, then hangs (the client must kill us)
    runaway          endless stdout bytes with no newline
    unterminated     the prompt result without a trailing newline, then exit 0
    stderrflood      2 MiB of stderr before answering initialize, 64 KiB more per update
    slow             a chunk every 0.1 s for 10 s; session/cancel ends it with "cancelled"
    ignore-cancel    streams forever and never answers the prompt once cancelled
    ignore-term      ignores SIGTERM and stdin EOF (only SIGKILL ends it)
    permission       asks session/request_permission, echoes which option it got
    late-permission  after answering the prompt, asks session/request_permission (logged as
                     ``late-permission`` with the outcome once the answer arrives)
    nested-after     after answering the prompt, writes a line of 3000 "[" (logged ``nested``)
    grandchild       starts `sleep 600` in its group, and with grandchild-setsid one that
                     escaped the group (both inherit our stdout); prompts behave like slow
    auth             session/new fails -32000 until `authenticate {methodId: "fake-key"}`
    models           session/new returns legacy `models`; accepts session/set_model
    configoptions    session/new returns configOptions (mode + model); accepts set_config_option
                     (and sends a config_option_update before answering it, as agents do)
    loadsession      advertises loadSession; sessions live in --state so a new process can
                     load (and replay) them
    leak-key         on the prompt: writes $FAKE_API_KEY (or --leak-var) to stderr, padded so that the last
                     --leak-cut (default 4096) bytes start 6 characters into it, and exits 1
    leak-key-start   the same at start-up, before answering anything
    unknown-request  mid-turn sends a vendor notification, a `_vendor.example/drain` request and
                     an `fs/read_text_file` request, waits for the answers and echoes their codes
    early-updates    before answering session/new: an available_commands_update and a message
                     chunk for the new session id (a JetBrains client hung on this order)
    late-chunk       20 ms after answering the prompt: one more message chunk ("late")
    surrogate        a chunk and the prompt result's _meta carry a lone UTF-16 surrogate, as
                     Node agents write when they cut a string ("\ud83d")
    between-turns    20 ms after answering the prompt: a current_mode_update (between turns)
    silent           on the prompt: writes nothing until cancelled (a model that never answers)
    fs               on the prompt "PATH": reads PATH with fs/read_text_file and writes its text
                     upper-cased to PATH.out with fs/write_text_file when the client advertised
                     them (chunks "read: <text>" and "wrote"), else chunks "no fs"
    bad-utf8         a chunk and the prompt result's _meta carry bytes that are not UTF-8
                     ("a\xff\xfeb", "caf\xe9", as a Latin-1 tool output gives them)

Every received message and notable event is appended to ``--log`` (JSON lines with our pid).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

KIB = 1024
NOISE = [  # lines that are not JSON-RPC messages (field-failures #10)
    "",
    "[INFO] starting tools",
    "42",
    '["not","an","object"]',
    '"str"',
    '{"foo":"bar"}',
    '{"jsonrpc":"2.0"}',
    "null",
    "{broken json",
    "\x00\x01 binary-ish",
    "   ",
    "Deduplicated hook: x",
    "[" * 3000,  # nested past any parser's stack
]


class FakeAgent:
    def __init__(self, args: argparse.Namespace) -> None:
        env_modes = [m for m in os.environ.get("FAKE_ACP_MODE", "").split(",") if m]
        self.modes = set(args.mode or []) | set(env_modes)
        self.log_path = args.log
        self.state_path = args.state
        self.perm_kinds = args.perm_kinds.split(",")
        self.leak_cut = args.leak_cut
        self.leak_var = args.leak_var
        self.lock = threading.Lock()
        self.authed = False
        self.sessions: dict[str, dict] = self._load_state()
        self.cancelled: dict[str, threading.Event] = {}
        self.waiting: dict[str, tuple[threading.Event, list]] = {}
        self.config_model = "m-default"
        self.config_mode = "build"

    # ---- plumbing ---------------------------------------------------------------------------

    def write(self, message: dict | str, newline: bool = True) -> None:
        data = message if isinstance(message, str) else json.dumps(message)
        with self.lock:
            try:
                sys.stdout.write(data + ("\n" if newline else ""))
                sys.stdout.flush()
            except (BrokenPipeError, ValueError):
                os._exit(0)

    def write_bad_utf8(self, message: dict) -> None:
        """``message`` with each ``@BAD@`` in its JSON text replaced by bytes that are not UTF-8."""
        data = json.dumps(message).encode().replace(b"@BAD1@", b"a\xff\xfeb").replace(b"@BAD2@", b"caf\xe9")
        with self.lock:
            sys.stdout.flush()
            sys.stdout.buffer.write(data + b"\n")
            sys.stdout.buffer.flush()

    def log(self, **event: object) -> None:
        if self.log_path:
            with self.lock, open(self.log_path, "a") as f:
                f.write(json.dumps({"pid": os.getpid(), **event}) + "\n")

    def stderr(self, text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()

    def result(self, msg_id: object, result: object) -> None:
        self.write({"jsonrpc": "2.0", "id": msg_id, "result": result})

    def error(self, msg_id: object, code: int, message: str) -> None:
        self.write({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}})

    def update(self, sid: str, update: dict) -> None:
        params = {"sessionId": sid, "update": update}
        self.write({"jsonrpc": "2.0", "method": "session/update", "params": params})
        if "stderrflood" in self.modes:
            self.stderr("e" * (64 * KIB - 1) + "\n")

    def chunk(self, sid: str, text: str, kind: str = "agent_message_chunk") -> None:
        self.update(sid, {"sessionUpdate": kind, "content": {"type": "text", "text": text}})

    def tool(self, sid: str, update_kind: str, call_id: str, **fields: object) -> None:
        self.update(sid, {"sessionUpdate": update_kind, "toolCallId": call_id, **fields})

    def ask(self, method: str, params: dict, msg_id: str) -> dict:
        """Send a request to the client and block until its response arrives."""
        done = threading.Event()
        self.waiting[msg_id] = (done, [])
        self.write({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        done.wait()
        return self.waiting.pop(msg_id)[1][0]

    def _load_state(self) -> dict[str, dict]:
        if self.state_path and os.path.exists(self.state_path):
            with open(self.state_path) as f:
                return json.load(f)
        return {}

    def _save_state(self) -> None:
        if self.state_path and "loadsession" in self.modes:
            with open(self.state_path, "w") as f:
                json.dump(self.sessions, f)

    # ---- main loop --------------------------------------------------------------------------

    def run(self) -> None:
        self.log(event="start", argv=sys.argv, cwd=os.getcwd(), env=sorted(os.environ))
        if "ignore-term" in self.modes:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if "grandchild" in self.modes:
            self.start_grandchildren()
        if "stderrflood" in self.modes:
            self.stderr(("f" * (KIB - 1) + "\n") * 2 * KIB)
        if "leak-key-start" in self.modes:
            self.leak_key()
        for line in sys.stdin:
            if not line.strip():
                continue
            msg = json.loads(line)
            self.log(event="recv", method=msg.get("method"), id=msg.get("id"), params=msg.get("params"))
            self.dispatch(msg)
        self.log(event="stdin-eof")
        while "ignore-term" in self.modes:
            time.sleep(1)

    def dispatch(self, msg: dict) -> None:
        method, msg_id, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method is None:  # a response to one of our requests
            done, holder = self.waiting[msg_id]
            holder.append(msg)
            done.set()
        elif method == "session/cancel":
            self.cancelled.setdefault(params["sessionId"], threading.Event()).set()
        elif method == "session/prompt":
            threading.Thread(target=self.prompt, args=(msg_id, params), daemon=True).start()
        else:
            handler = getattr(self, "on_" + method.replace("/", "_"), None)
            if handler is None:
                self.error(msg_id, -32601, "Method not found")
            else:
                handler(msg_id, params)

    def leak_key(self) -> None:
        """A key on stderr where a cut of the last --leak-cut bytes would split it; exit 1."""
        key = os.environ[self.leak_var]
        cut = self.leak_cut
        self.stderr("boot: key " + key + "\n" + "p" * (cut - len(key) + 5))
        os._exit(1)

    def start_grandchildren(self) -> None:
        pids = [subprocess.Popen(["sleep", "600"]).pid]
        if "grandchild-setsid" in self.modes:
            pids.append(subprocess.Popen(["sleep", "600"], start_new_session=True).pid)
        self.log(event="grandchildren", pids=pids)

    # ---- agent methods ----------------------------------------------------------------------

    def on_initialize(self, msg_id: object, params: dict) -> None:
        self.client_caps = params.get("clientCapabilities") or {}
        if "garbage" in self.modes:
            self.write("Loaded cached credentials.")
        result = {
            "protocolVersion": 1,
            "agentCapabilities": {"loadSession": "loadsession" in self.modes},
            "agentInfo": {"name": "fake-acp-agent", "version": "1.0"},
            "authMethods": [{"id": "fake-key", "name": "Fake key"}] if "auth" in self.modes else [],
        }
        self.result(msg_id, result)

    def on_authenticate(self, msg_id: object, params: dict) -> None:
        if params.get("methodId") != "fake-key":
            self.error(msg_id, -32602, "unknown auth method")
            return
        self.authed = True
        self.result(msg_id, {})

    def on_session_new(self, msg_id: object, params: dict) -> None:
        if "auth" in self.modes and not self.authed:
            self.error(msg_id, -32000, "Authentication required")
            return
        sid = "fake-" + uuid.uuid4().hex[:12]
        self.sessions[sid] = {"cwd": params["cwd"], "history": []}
        self._save_state()
        if "early-updates" in self.modes:
            commands = [{"name": "early", "description": "Sent before session/new answered"}]
            self.update(sid, {"sessionUpdate": "available_commands_update", "availableCommands": commands})
            self.chunk(sid, "early ")
        self.result(msg_id, {"sessionId": sid, **self.model_state()})

    def on_session_load(self, msg_id: object, params: dict) -> None:
        session = self._load_state().get(params["sessionId"])
        if "loadsession" not in self.modes or session is None:
            self.error(msg_id, -32002, "Resource not found")
            return
        self.sessions[params["sessionId"]] = session
        for role, text in session["history"]:
            kind = "user_message_chunk" if role == "user" else "agent_message_chunk"
            self.chunk(params["sessionId"], text, kind)
        self.result(msg_id, None)

    def model_state(self) -> dict:
        if "configoptions" in self.modes:
            return {"configOptions": self.config_options()}
        if "models" in self.modes:
            models = [{"modelId": m, "name": m} for m in ("m-default", "m-fast")]
            return {"models": {"currentModelId": "m-default", "availableModels": models}}
        return {}

    def config_options(self) -> list[dict]:
        mode = {
            "id": "mode",
            "name": "Mode",
            "category": "mode",
            "type": "select",
            "currentValue": self.config_mode,
            "options": [{"value": "build", "name": "Build"}, {"value": "plan", "name": "Plan"}],
        }
        model = {
            "id": "model",
            "name": "Model",
            "category": "model",
            "type": "select",
            "currentValue": self.config_model,
            "options": [{"value": m, "name": m} for m in ("m-default", "m-fast")],
        }
        return [mode, model]

    def on_session_set_config_option(self, msg_id: object, params: dict) -> None:
        if "configoptions" not in self.modes:
            self.error(msg_id, -32601, "Method not found")
            return
        if params.get("configId") == "mode":
            if params["value"] not in ("build", "plan"):
                self.error(msg_id, -32602, f"unknown mode {params['value']}")
                return
            self.config_mode = params["value"]
        elif params["value"] not in ("m-default", "m-fast"):
            self.error(msg_id, -32602, f"unknown model {params['value']}")
            return
        else:
            self.config_model = params["value"]
        update = {"sessionUpdate": "config_option_update", "configOptions": self.config_options()}
        self.update(params["sessionId"], update)
        self.result(msg_id, {"configOptions": self.config_options()})

    def on_session_set_model(self, msg_id: object, params: dict) -> None:
        if "models" not in self.modes:
            self.error(msg_id, -32601, "Method not found")
            return
        self.result(msg_id, {})

    # ---- the prompt turn --------------------------------------------------------------------

    def prompt(self, msg_id: object, params: dict) -> None:
        sid = params["sessionId"]
        if "prompt-error" in self.modes:
            data = {"message": "stream disconnected: api_key=sk-fake0123456789abcdef", "codex_error_info": "other"}
            error = {"code": -32603, "message": "Internal error", "data": data}
            self.write({"jsonrpc": "2.0", "id": msg_id, "error": error})
            return
        cancelled = self.cancelled[sid] = threading.Event()
        text = " ".join(b["text"] for b in params["prompt"] if b["type"] == "text")
        links = [b for b in params["prompt"] if b["type"] == "resource_link"]
        session = self.sessions.setdefault(sid, {"cwd": "", "history": []})
        self.log(event="prompt", sessionId=sid, turn=len(session["history"]) // 2 + 1, links=links)
        stop = self.behave(sid, text, cancelled)
        if stop is None:
            return  # hugeline / ignore-cancel: never answer
        session["history"] += [["user", text], ["agent", f"echo: {text}"]]
        self._save_state()
        usage = {"inputTokens": 10, "outputTokens": 20, "totalTokens": 30, "thoughtTokens": 5}
        meta = {"quota": {"token_count": {"input_tokens": 11, "output_tokens": 21}}}
        if "surrogate" in self.modes:
            meta["note"] = "cut \ud83d"  # a lone high surrogate (json.dumps writes it as an escape)
        result = {"jsonrpc": "2.0", "id": msg_id, "result": {"stopReason": stop, "usage": usage, "_meta": meta}}
        if "unterminated" in self.modes:
            self.write(result, newline=False)
            os._exit(0)
        if "bad-utf8" in self.modes:
            meta["note"] = "@BAD2@"
            self.write_bad_utf8(result)
        else:
            self.write(result)
        if "late-chunk" in self.modes:
            time.sleep(0.02)
            self.chunk(sid, "late")
            self.log(event="late-chunk")
        if "between-turns" in self.modes:
            time.sleep(0.02)
            self.update(sid, {"sessionUpdate": "current_mode_update", "currentModeId": "plan"})
            self.log(event="between-turns")
        if "late-permission" in self.modes:
            threading.Thread(target=self.late_permission, args=(sid,), daemon=True).start()
        if "nested-after" in self.modes:
            self.write("[" * 3000, newline=True)
            self.log(event="nested")

    def late_permission(self, sid: str) -> None:
        tool_call = {"toolCallId": "t-late", "title": "Clean up", "kind": "delete", "status": "pending"}
        params = {
            "sessionId": sid,
            "toolCall": tool_call,
            "options": [{"optionId": "ok", "name": "ok", "kind": "allow_once"}],
        }
        response = self.ask("session/request_permission", params, "perm-late")
        self.log(event="late-permission", outcome=response.get("result", {}).get("outcome"))

    def behave(self, sid: str, text: str, cancelled: threading.Event) -> str | None:
        modes = self.modes
        if "leak-key" in modes:
            self.leak_key()
        if "crash" in modes:
            self.chunk(sid, "partial")
            self.stderr("fatal: model exploded (api_key=sk-fake0123456789abcdef)\n")
            os._exit(3)
        if "hugeline" in modes:
            huge = {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "rawOutput": "h" * 256 * KIB}
            self.update(sid, huge)
            time.sleep(600)
        if "runaway" in modes:
            while True:
                self.write("r" * 64 * KIB, newline=False)
        if "ignore-cancel" in modes:
            while True:
                self.chunk(sid, ".")
                time.sleep(0.05)
        if modes & {"slow", "grandchild"}:
            return self.slow(sid, cancelled)
        if "permission" in modes:
            return self.permission(sid, cancelled)
        if "unknown-request" in modes:
            return self.unknown_requests(sid)
        if "fs" in modes:
            return self.use_fs(sid, text.strip())
        if "surrogate" in modes:
            self.chunk(sid, "smile \ud83d")  # cut inside the surrogate pair of U+1F600
            return "end_turn"
        if "silent" in modes:
            cancelled.wait(600)
            return "cancelled"
        if "bad-utf8" in modes:
            content = {"type": "text", "text": "@BAD1@"}
            params = {"sessionId": sid, "update": {"sessionUpdate": "agent_message_chunk", "content": content}}
            self.write_bad_utf8({"jsonrpc": "2.0", "method": "session/update", "params": params})
            return "end_turn"
        if "bigline" in modes:
            content = [{"type": "content", "content": {"type": "text", "text": "b" * 100 * KIB}}]
            self.tool(sid, "tool_call", "big", title="Big", status="pending")
            self.tool(sid, "tool_call_update", "big", content=content)
            return "end_turn"
        self.echo(sid, text)
        return "end_turn"

    def echo(self, sid: str, text: str) -> None:
        noise = "garbage" in self.modes
        commands = [{"name": "help", "description": "Help"}]
        self.update(sid, {"sessionUpdate": "available_commands_update", "availableCommands": commands})
        self.chunk(sid, "thinking about it", "agent_thought_chunk")
        reply = f"echo: {text}"
        third = max(1, len(reply) // 3)
        for i, piece in enumerate((reply[:third], reply[third : 2 * third], reply[2 * third :])):
            self.chunk(sid, piece)
            if noise:
                for line in NOISE[i * 4 : i * 4 + 4]:
                    self.write(line)
        where = {"path": "/tmp/a.txt"}
        self.tool(
            sid, "tool_call", "t1", title="Read file", kind="read", status="pending", locations=[where], rawInput=where
        )
        self.tool(sid, "tool_call_update", "t1", status="in_progress")
        body = [{"type": "content", "content": {"type": "text", "text": "file body"}}]
        self.tool(sid, "tool_call_update", "t1", status="completed", content=body)
        entries = [
            {"content": "read", "priority": "high", "status": "completed"},
            {"content": "answer", "priority": "medium", "status": "in_progress"},
        ]
        self.update(sid, {"sessionUpdate": "plan", "entries": entries})
        cost = {"amount": 0.01, "currency": "USD"}
        self.update(sid, {"sessionUpdate": "usage_update", "used": 1000, "size": 200000, "cost": cost})
        self.update(sid, {"sessionUpdate": "session_info_update", "title": "Echo"})
        self.update(sid, {"sessionUpdate": "_fake_vendor_update", "x": 1})
        self.update(sid, {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": text}})

    def slow(self, sid: str, cancelled: threading.Event) -> str:
        for i in range(100):
            if cancelled.wait(0.1):
                return "cancelled"
            self.chunk(sid, f"{i} ")
        return "end_turn"

    def permission(self, sid: str, cancelled: threading.Event) -> str:
        options = [{"optionId": f"opt-{kind}", "name": kind, "kind": kind} for kind in self.perm_kinds]
        tool_call = {"toolCallId": "t-perm", "title": "Write file", "kind": "edit", "status": "pending"}
        params = {"sessionId": sid, "toolCall": tool_call, "options": options}
        response = self.ask("session/request_permission", params, "perm-1")
        outcome = response.get("result", {}).get("outcome", {})
        chosen = outcome.get("optionId") if outcome.get("outcome") == "selected" else "cancelled"
        self.log(event="permission", outcome=outcome)
        self.chunk(sid, f"permission: {chosen}")
        return "cancelled" if cancelled.is_set() else "end_turn"

    def use_fs(self, sid: str, path: str) -> str:
        fs = getattr(self, "client_caps", {}).get("fs") or {}
        if not (fs.get("readTextFile") and fs.get("writeTextFile")):
            self.chunk(sid, "no fs")
            return "end_turn"
        read = self.ask("fs/read_text_file", {"sessionId": sid, "path": path}, "fs-read")
        content = read.get("result", {}).get("content", "")
        self.chunk(sid, f"read: {content}")
        params = {"sessionId": sid, "path": path + ".out", "content": content.upper()}
        wrote = self.ask("fs/write_text_file", params, "fs-write")
        self.chunk(sid, " wrote" if "result" in wrote else f" write failed {wrote.get('error')}")
        return "end_turn"

    def unknown_requests(self, sid: str) -> str:
        self.write({"jsonrpc": "2.0", "method": "_vendor.example/servers_changed", "params": {}})
        drain = self.ask("_vendor.example/drain", {}, "drain-1")
        fs = self.ask("fs/read_text_file", {"sessionId": sid, "path": "/etc/hostname"}, "fs-1")
        codes = [m.get("error", {}).get("code") for m in (drain, fs)]
        self.log(event="answers", codes=codes)
        self.chunk(sid, f"codes: {codes[0]} {codes[1]}")
        return "end_turn"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", action="append", help="behaviour; repeatable")
    parser.add_argument("--log", help="append JSON lines about received messages here")
    parser.add_argument("--state", help="session store for loadsession")
    parser.add_argument("--perm-kinds", default="allow_once,allow_always,reject_once,reject_always")
    parser.add_argument("--leak-cut", type=int, default=4 * KIB, help="see mode leak-key")
    parser.add_argument("--leak-var", default="FAKE_API_KEY", help="the variable mode leak-key writes")
    parser.add_argument("-m", dest="model", help="launch-time model (a client's modelFlag)")
    FakeAgent(parser.parse_args()).run()


if __name__ == "__main__":
    main()
