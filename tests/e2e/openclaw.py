"""Start the real OpenClaw gateway (npm ``openclaw@2026.9.6`` on Node 24) offline, for e2e tests.

The gateway talks to the project's fake model server (``tests/fakes/fake_llm.py``) through an
``openai-completions`` provider ``fake`` whose only model is ``fake/fake-model``. Everything it
writes (HOME, state dir, config, workspace, logs, temp files) lives under ``<tmp>/openclaw``;
catalogue refresh, update checks, Bonjour, channels, cron, gmail watcher and canvas host are off,
so a start, handshake and chat make no non-loopback connection (the variables follow the
package's own ``docs/gateway/embedding.md``).

Usage::

    from tests.e2e.openclaw import OpenClawGateway, openclaw_paths
    assert openclaw_paths() is not None, "run `make agents` (it installs Node 24 and openclaw)"
    with FakeLLM() as llm, OpenClawGateway(llm.base_url, tmp_path, auth="token", secret="t0k") as gw:
        ... connect a WebSocket client to gw.url (ws://127.0.0.1:PORT) ...
        gw.kill(); gw.start()          # crash + restart on the same port and state dir
        gw.workspace / "hello.txt"      # what the agent's ``write`` tool wrote

Both node and openclaw come from ``scripts/install-agents.sh`` (prefixes ``node-24.22.3`` and
``openclaw-2026.9.6`` in :func:`tests.e2e.agents.agents_dir`). The process runs in its own process
group (it has worker children: spawn-broker, sqlite reader), and stop/kill signal the whole group.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Literal

from tests.e2e.agents import _arch, _base, agents_dir

OPENCLAW_VERSION = "2026.9.6"
NODE_VERSION = "24.22.3"
# Directory names inside agents_dir(); keep in step with scripts/install-agents.sh.
OPENCLAW_PREFIX = f"openclaw-{OPENCLAW_VERSION}"
NODE_PREFIX = f"node-{NODE_VERSION}"

FAKE_PROVIDER = "fake"
FAKE_MODEL = "fake-model"
FAKE_API_KEY = "sk-fake-offline-key"

READY_TIMEOUT = 90.0  # a cold start takes ~11 s here; slow CI machines get plenty of slack
STOP_TIMEOUT = 10.0  # SIGTERM → clean exit takes ~0.5 s


def openclaw_paths() -> tuple[Path, Path] | None:
    """``(node, openclaw.mjs)`` from the agent cache, or None when either is not installed."""
    root = agents_dir()
    node = root / NODE_PREFIX / "node_modules" / f"node-linux-{_arch()}" / "bin" / "node"
    mjs = root / OPENCLAW_PREFIX / "node_modules" / "openclaw" / "openclaw.mjs"
    markers = (root / NODE_PREFIX / ".installed", root / OPENCLAW_PREFIX / ".installed")
    if all(p.is_file() for p in markers) and mjs.is_file() and os.access(node, os.X_OK):
        return node, mjs
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` (and, if the host has IPv6 loopback, on ``::1`` too:
    ``--bind loopback`` listens on both)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s6:
                s6.bind(("::1", port))
        except OSError as exc:
            if exc.errno == 98:  # EADDRINUSE on ::1: try another
                continue
        return port
    raise RuntimeError("no free port")


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


class OpenClawGateway:
    """One real OpenClaw gateway process on ``127.0.0.1:<port>``, pointed at the fake model server.

    ``model_base_url`` is the fake server's ``http://127.0.0.1:PORT`` (no path; ``/v1`` is added).
    ``auth`` is ``"token"`` or ``"password"``; ``secret`` is the token or password clients send
    (``auth.token``, or ``auth.password``). ``config`` is deep-merged over the generated config.
    ``env`` is added to the (otherwise self-contained) child environment.

    The port and the state dir are chosen once, so :meth:`start` after :meth:`stop` or
    :meth:`kill` restarts the same gateway (same sessions, devices, config) on the same URL.
    """

    def __init__(
        self,
        model_base_url: str,
        tmp: str | os.PathLike[str],
        auth: Literal["token", "password"] = "token",
        secret: str = "test-token-123",
        *,
        port: int | None = None,
        config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        ready_timeout: float = READY_TIMEOUT,
    ) -> None:
        if auth not in ("token", "password"):
            raise ValueError(f"auth must be 'token' or 'password', not {auth!r}")
        paths = openclaw_paths()
        if paths is None:
            raise RuntimeError(f"openclaw {OPENCLAW_VERSION} / node {NODE_VERSION} not installed in {agents_dir()}")
        self.node, self.openclaw_mjs = paths
        self.model_base_url = model_base_url.rstrip("/")
        self.auth = auth
        self.secret = secret
        self.port = port or free_port()
        self.ready_timeout = ready_timeout
        self.root = Path(tmp) / "openclaw"
        self.home = self.root / "home"
        self.state_dir = self.root / "state"
        self.config_path = self.state_dir / "openclaw.json"
        self.workspace = self.root / "workspace"
        self.log_path = self.root / "gateway.out.log"  # the process's stdout + stderr (all starts)
        self.file_log_path = self.root / "logs" / "gateway.log"  # OpenClaw's own logging.file
        self.tmpdir = self.root / "tmp"
        self._extra_config = config or {}
        self._extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.pgid: int | None = None
        self.starts = 0
        self.ready_seconds: float | None = None  # spawn → /readyz 200, for the last start()

    # ---- addresses -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """WebSocket URL of the gateway (root path)."""
        return f"ws://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def client_auth(self) -> dict[str, str]:
        """The ``connect.params.auth`` object for the shared secret."""
        return {"token": self.secret} if self.auth == "token" else {"password": self.secret}

    # ---- files -----------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        auth: dict[str, Any] = {"mode": self.auth, self.auth: self.secret}
        cfg: dict[str, Any] = {
            "gateway": {"mode": "local", "port": self.port, "bind": "loopback", "auth": auth},
            "update": {"checkOnStart": False},
            "agents": {
                "defaults": {
                    "model": {"primary": f"{FAKE_PROVIDER}/{FAKE_MODEL}"},
                    "workspace": str(self.workspace),
                }
            },
            "models": {
                "mode": "merge",
                "catalogRefresh": {"enabled": False},
                "providers": {
                    FAKE_PROVIDER: {
                        "baseUrl": f"{self.model_base_url}/v1",
                        "apiKey": FAKE_API_KEY,
                        "api": "openai-completions",
                        "timeoutSeconds": 60,
                        "models": [
                            {
                                "id": FAKE_MODEL,
                                "name": "Fake Model",
                                "reasoning": False,
                                "input": ["text"],
                                "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                                "contextWindow": 128000,
                                "maxTokens": 4096,
                            }
                        ],
                    }
                },
            },
            "logging": {"file": str(self.file_log_path)},
        }
        return _deep_merge(cfg, self._extra_config)

    def write_config(self) -> Path:
        for d in (self.home, self.state_dir, self.workspace, self.file_log_path.parent, self.tmpdir):
            d.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(json.dumps(self.config(), indent=2) + "\n")
        return self.config_path

    def env(self) -> dict[str, str]:
        """The child's whole environment (nothing inherited, so no stray API keys or proxies):
        the agents' sandbox under ``<tmp>/openclaw`` (``tests.e2e.agents._base``: home, XDG
        folders, TMPDIR, loopback without a proxy, telemetry off), Node 24 on PATH, and the
        variables the package's ``docs/gateway/embedding.md`` gives for a supervised gateway."""
        _, env, _ = _base(self.root.parent, self.root.name)
        env.update(
            {
                "PATH": os.pathsep.join([str(self.node.parent), "/usr/local/bin", "/usr/bin", "/bin"]),
                "OPENCLAW_STATE_DIR": str(self.state_dir),
                "OPENCLAW_CONFIG_PATH": str(self.config_path),
                "OPENCLAW_DISABLE_BONJOUR": "1",
                "OPENCLAW_NO_RESPAWN": "1",
                "OPENCLAW_SKIP_CHANNELS": "1",
                "OPENCLAW_EXEC_SHELL_SNAPSHOT": "0",
                "OPENCLAW_NO_AUTO_UPDATE": "1",
                "OPENCLAW_SKIP_CRON": "1",
                "OPENCLAW_SKIP_GMAIL_WATCHER": "1",
                "OPENCLAW_SKIP_CANVAS_HOST": "1",
            }
        )
        env.update(self._extra_env)
        return env

    def argv(self) -> list[str]:
        flag = "--token" if self.auth == "token" else "--password"
        return [
            str(self.node),
            str(self.openclaw_mjs),
            "gateway",
            "run",
            "--port",
            str(self.port),
            "--bind",
            "loopback",
            "--auth",
            self.auth,
            flag,
            self.secret,
        ]

    def log_text(self) -> str:
        """The process's stdout + stderr so far (all starts, appended)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def file_log_text(self) -> str:
        """OpenClaw's own log file (``logging.file``, JSON lines)."""
        try:
            return self.file_log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # ---- lifecycle -------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, wait: bool = True) -> OpenClawGateway:
        """Spawn the gateway (same port and state dir as before) and wait for ``/readyz``."""
        if self.running:
            raise RuntimeError("gateway already running")
        self._reap()
        self.write_config()
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start {self.starts}: {' '.join(self.argv())}\n".encode())
            log.flush()
            t0 = time.monotonic()
            self.proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(self.workspace),
                env=self.env(),
                start_new_session=True,  # own session + process group: stop/kill reach the workers
            )
        self.pgid = self.proc.pid
        self._t0 = t0
        if wait:
            try:
                self.wait_ready()
            except BaseException:
                self.kill()
                raise
        return self

    def readyz(self, timeout: float = 2.0) -> int | None:
        """HTTP status of ``GET /readyz`` (None if nothing answers)."""
        try:
            with urllib.request.urlopen(f"{self.http_url}/readyz", timeout=timeout) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (OSError, ValueError):
            return None

    def wait_ready(self, timeout: float | None = None) -> float:
        """Poll ``/readyz`` until 200; returns seconds since spawn. Raises if the process exits or
        the bound passes (with the log tail in the message)."""
        if self.proc is None:
            raise RuntimeError("gateway not started")
        bound = self.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + bound
        while True:
            if self.readyz(timeout=1.0) == 200:
                self.ready_seconds = time.monotonic() - self._t0
                return self.ready_seconds
            rc = self.proc.poll()
            if rc is not None:
                raise RuntimeError(f"openclaw gateway exited with {rc} before ready:\n{self.log_text()[-4000:]}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"openclaw gateway not ready after {bound:.0f} s:\n{self.log_text()[-4000:]}")
            time.sleep(0.1)

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM (graceful: a ``shutdown`` event, close 1012), then SIGKILL the group after
        ``timeout``; reaps the process and waits for the worker children. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        # the leader has gone (or hung): give the workers a moment, then kill what is left
        if not self._group_gone(wait=2.0):
            self._killpg(signal.SIGKILL)
        return self._reap()

    def kill(self) -> int | None:
        """SIGKILL the whole process group (a crash), and reap."""
        if self.proc is None:
            return None
        self._killpg(signal.SIGKILL)
        return self._reap()

    def restart(self) -> OpenClawGateway:
        self.stop()
        return self.start()

    def _killpg(self, sig: int) -> None:
        if self.pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, sig)

    def _group_members(self) -> list[int]:
        """Live (non-zombie) processes in our process group, read from /proc."""
        if self.pgid is None:
            return []
        out = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            # pid (comm) state ppid pgrp ...; comm may contain spaces/parens
            fields = stat[stat.rfind(")") + 2 :].split()
            if len(fields) >= 3 and int(fields[2]) == self.pgid and fields[0] != "Z":
                out.append(int(entry.name))
        return out

    def _group_gone(self, wait: float) -> bool:
        deadline = time.monotonic() + wait
        while self._group_members():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def _reap(self) -> int | None:
        if self.proc is None:
            return None
        try:
            rc = self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._killpg(signal.SIGKILL)
            rc = self.proc.wait(timeout=STOP_TIMEOUT)
        if not self._group_gone(wait=STOP_TIMEOUT):
            self._killpg(signal.SIGKILL)
            self._group_gone(wait=STOP_TIMEOUT)
        self.proc = None
        self.pgid = None
        return rc

    def __enter__(self) -> OpenClawGateway:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.proc.pid}" if self.running and self.proc else "stopped"
        return f"<OpenClawGateway {self.url} auth={self.auth} {state}>"
