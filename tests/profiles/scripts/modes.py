"""A scriptable exec profile for the failure-mode tests. PROFILE_MODE (from the profile's env)
picks the behaviour; PIDS_FILE, when set, receives the pid of every process it starts."""

import hashlib
import json
import os
import subprocess
import sys
import time

MODE = os.environ.get("PROFILE_MODE", "env")
out = sys.stdout.buffer


def line(data):
    out.write(data if isinstance(data, bytes) else data.encode())
    out.write(b"\n")
    out.flush()


def partial(text):
    line("AGENT_PARTIAL:" + json.dumps(text))


def record(*pids):
    if os.environ.get("PIDS_FILE"):
        with open(os.environ["PIDS_FILE"], "a") as f:
            f.write("".join(f"{p}\n" for p in pids))


def sleeper():
    """A grandchild that ignores SIGTERM and never exits by itself."""
    code = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    return subprocess.Popen([sys.executable, "-c", code], stdout=sys.stdout, stderr=sys.stderr).pid


if MODE == "env":  # the protocol environment, as the reply body
    names = sorted(
        k
        for k in os.environ
        if k.startswith("AGENT_") or k in ("GREETING", "SETTING", "BRIDGE_AUTH_TOKEN", "SECRET_OF_PARENT")
    )
    line(json.dumps({k: os.environ[k] for k in names} | {"argv": sys.argv[1:], "cwd": os.getcwd()}))
elif MODE == "stdin":  # reads stdin to EOF first, like `codex exec` does
    data = sys.stdin.buffer.read()
    partial("read")
    line(
        json.dumps(
            {
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "env_bytes": len(os.environb.get(b"AGENT_MESSAGE", b"")),
                "truncated": os.environ.get("AGENT_MESSAGE_TRUNCATED", ""),
            }
        )
    )
elif MODE == "error":
    partial("working")
    line("AGENT_ERROR:" + json.dumps('boom "quoted"'))
    sys.exit(1)
elif MODE == "exit":
    line("some stdout")
    sys.stderr.write("trace: it broke\n")
    sys.exit(3)
elif MODE == "hang":  # streams, starts a stubborn grandchild, then waits forever
    record(os.getpid(), sleeper())
    partial("started")
    time.sleep(600)
elif MODE == "grandchild":  # answers and exits, leaving a grandchild that holds stdout (#15)
    record(sleeper())
    partial("hi")
    line("AGENT_SESSION:s1")
    line("ok")
elif MODE == "unflushed":  # prints as most scripts do, no flush, then waits for GATE_FILE
    print("AGENT_PARTIAL:" + json.dumps("first"))
    while not os.path.exists(os.environ["GATE_FILE"]):
        time.sleep(0.01)
    print("AGENT_PARTIAL:" + json.dumps(" second"))
elif MODE == "error-then-partial":  # fails, then goes on streaming
    partial("working")
    line("AGENT_ERROR:" + json.dumps("it failed"))
    partial(" and more")
elif MODE == "raises":  # an uncaught exception: the traceback goes to stderr
    partial("about to")
    raise RuntimeError("the profile broke here")
elif MODE == "gate":  # streams, then waits for GATE_FILE to exist
    record(os.getpid())
    partial("started")
    while not os.path.exists(os.environ["GATE_FILE"]):
        time.sleep(0.01)
    line("done")
elif MODE == "malformed":
    line(b"AGENT_PARTIAL:not json")
    line(b"AGENT_PARTIAL:123")
    line(b'AGENT_PARTIAL:"\\ud83d"')  # half of a surrogate pair ...
    line(b'AGENT_PARTIAL:"\\ude00 ok"')  # ... and its other half
    line(b'AGENT_PARTIAL:"lone \\udc00 low"')
    line(b'AGENT_PARTIAL:"\xe2\x9c"')  # a UTF-8 character cut in two
    line(b'AGENT_PARTIAL:"\x93"')
    line(b"AGENT_SESSION:   ")  # empty: ignored
    line(b"AGENT_SESSION:kept")
    line(b"body \xff\xfe bytes")
    line(b"AGENT_ERRORX: not a marker")
    out.write(b"tail without newline")
elif MODE == "flood-partials":
    for _ in range(1000):
        partial("x" * 1000)
elif MODE == "flood-body":
    chunk = ("y" * 99 + "\n").encode()
    for _ in range(100000):  # 10 MB if nobody stops it
        out.write(chunk)
elif MODE == "long-line":
    partial("before")
    line("z" * 100000)
    line("after")
elif MODE == "stderr-flood":
    sys.stderr.write("e" * (2 * 1024 * 1024))
    sys.stderr.flush()
    line("survived")
elif MODE == "stderr-ok":
    sys.stderr.write("note on stderr\n")
    line("fine")
elif MODE == "session-prefix":
    line("SESSION=abc-123")
    line("the reply")
elif MODE == "differs":
    partial("progress...")
    line("final answer")
