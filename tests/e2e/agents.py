"""Offline launch recipes for the pinned real coding agents (ACP over stdio).

Each ``<agent>_recipe(base_url, tmp)`` points one agent at the fake model server at ``base_url``
(``http://127.0.0.1:PORT``, no path) and isolates it inside ``tmp``: HOME, XDG_* and the agent's own
config dir live there, so nothing reads (or writes) the real user's configuration, and telemetry,
update checks, auto-updates and other outbound traffic are switched off. It writes the files the
agent needs first and returns a plain dict shaped like the bridge's provider config::

    {"command": "/abs/path/in/the/cache", "args": [...], "env": {...}, "cwd": "<tmp>/<agent>/work",
     # extra keys, for tests and reports:
     "name": "gemini", "session_cwd": "<tmp>/work", "auth_method": None, "model": "...",
     "files": ["<tmp>/home/.gemini/settings.json", ...]}

``env`` is complete on its own (PATH included): it works both merged over ``os.environ`` and as the
whole environment. ``session_cwd`` is an empty working directory to pass to ``session/new``.

The agents are installed by ``scripts/install-agents.sh`` into ``agents_dir()``:
``${XWORKMATE_AGENTS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/xworkmate-bridge/agents}``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Directory names inside agents_dir(); keep in step with scripts/install-agents.sh.
PREFIXES: dict[str, str] = {
    "gemini": "gemini-cli-0.61.0",
    "codex": "codex-acp-0.16.0",
    "opencode": "opencode-1.18.33",
    "claude": "claude-agent-acp-0.23.1",
    "hermes": "hermes-0.19.0",
}

# Model ids the fake server is addressed with.
GEMINI_MODEL = "gemini-2.5-flash"  # a concrete model: "auto" would add router/classifier calls
CODEX_MODEL = "gpt-5.4-mini"  # a slug in codex's bundled catalogue: no "unknown model metadata" warning chunk
OPENCODE_MODEL = "mock-model"
HERMES_MODEL = "mock-model"
CLAUDE_MODEL = "claude-sonnet-4-6"

FAKE_KEY = "sk-fake-offline-key"
OPENCODE_VERSION = "1.18.33"


# --------------------------------------------------------------------------------------------
# Locations


def agents_dir() -> Path:
    """The agent cache root (same rule as scripts/install-agents.sh)."""
    env = os.environ.get("XWORKMATE_AGENTS_DIR")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "xworkmate-bridge" / "agents"


def prefix(name: str) -> Path:
    return agents_dir() / PREFIXES[name]


def _arch() -> str:
    m = platform.machine().lower()
    return {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(m, m)


def command_path(name: str) -> Path:
    """Absolute path of the executable the recipe launches (native binaries where the npm
    package ships one, so there is no node wrapper between us and the agent)."""
    p = prefix(name)
    nm = p / "node_modules"
    if name == "gemini":
        return nm / ".bin" / "gemini"
    if name == "codex":
        native = nm / "@zed-industries" / f"codex-acp-linux-{_arch()}" / "bin" / "codex-acp"
        return native if native.exists() else nm / ".bin" / "codex-acp"
    if name == "opencode":
        native = nm / f"opencode-linux-{_arch()}" / "bin" / "opencode"
        return native if native.exists() else nm / ".bin" / "opencode"
    if name == "claude":
        return nm / ".bin" / "claude-agent-acp"
    if name == "hermes":
        return p / "bin" / "hermes"
    raise KeyError(name)


def installed(name: str) -> bool:
    """True when the pinned agent is fully installed (marker written last by install-agents.sh)."""
    if name not in PREFIXES:
        return False
    p = prefix(name)
    return (
        (p / ".installed").is_file()
        and command_path(name).exists()
        and (name not in ("gemini", "claude") or node_bin_dir() is not None)
    )


def node_bin_dir() -> str | None:
    """Directory holding the ``node`` that runs the npm-shim agents (gemini, claude)."""
    node = shutil.which("node")
    return os.path.dirname(os.path.realpath(node)) if node else None


def _path_env(*front: str | os.PathLike[str] | None) -> str:
    parts = [str(p) for p in front if p]
    node = node_bin_dir()
    if node:
        parts.append(node)
    parts += ["/usr/local/bin", "/usr/bin", "/bin"]
    seen: list[str] = []
    for p in parts:
        if p not in seen:
            seen.append(p)
    return os.pathsep.join(seen)


# --------------------------------------------------------------------------------------------
# Isolation helpers


class _Files:
    """Writes files under tmp and remembers them for the recipe's ``files`` list."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def write(self, path: Path, content: str | dict[str, Any]) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = content if isinstance(content, str) else json.dumps(content, indent=2) + "\n"
        path.write_text(text)
        self.paths.append(str(path))
        return path


def _base(tmp: str | os.PathLike[str], name: str) -> tuple[Path, dict[str, str], Path]:
    """Create <tmp>/<name>/{home,xdg/*,work} and the environment common to all agents."""
    root = Path(tmp) / name
    home = root / "home"
    work = root / "work"
    xdg = {
        "XDG_CONFIG_HOME": home / ".config",
        "XDG_DATA_HOME": home / ".local" / "share",
        "XDG_STATE_HOME": home / ".local" / "state",
        "XDG_CACHE_HOME": home / ".cache",
    }
    for d in (home, work, *xdg.values()):
        d.mkdir(parents=True, exist_ok=True)
    tmpdir = root / "tmp"
    tmpdir.mkdir(exist_ok=True)
    env = {
        "HOME": str(home),
        "USERPROFILE": str(home),
        **{k: str(v) for k, v in xdg.items()},
        "TMPDIR": str(tmpdir),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "CI": "1",
        # loopback never goes through a proxy, even if the caller's environment has one
        "NO_PROXY": "127.0.0.1,localhost,::1",
        "no_proxy": "127.0.0.1,localhost,::1",
        # generic opt-outs several CLIs honour
        "DO_NOT_TRACK": "1",
        "DISABLE_TELEMETRY": "1",
    }
    return root, env, work


def _recipe(name: str, args: list[str], env: dict[str, str], work: Path, files: _Files, **extra: Any) -> dict[str, Any]:
    return {
        "command": str(command_path(name)),
        "args": args,
        "env": env,
        # Start the agent inside its sandbox, not in the caller's cwd: opencode runs git in its
        # process cwd at start-up (even with --cwd) and writes <repo>/.git/opencode there.
        "cwd": str(work),
        "name": name,
        "session_cwd": str(work),
        "auth_method": None,
        "files": files.paths,
        **extra,
    }


# --------------------------------------------------------------------------------------------
# gemini-cli


def gemini_recipe(base_url: str, tmp: str | os.PathLike[str]) -> dict[str, Any]:
    """gemini-cli 0.61.0: ``gemini --acp -m gemini-2.5-flash`` with GOOGLE_GEMINI_BASE_URL.

    The Gemini API client posts ``/v1beta/models/<model>:streamGenerateContent?alt=sse``.
    """
    root, env, work = _base(tmp, "gemini")
    home = Path(env["HOME"])
    files = _Files()
    settings = {
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False, "logPrompts": False},
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "model": {"name": GEMINI_MODEL},
        "ide": {"enabled": False},
    }
    files.write(home / ".gemini" / "settings.json", settings)
    # System-level settings default to /etc/gemini-cli/{settings,system-defaults}.json. Point them at
    # paths in the sandbox that do not exist (a file there would be skipped anyway, with a "Security
    # Warning", because gemini refuses settings under a world-writable parent such as /tmp).
    env.update(
        {
            "PATH": _path_env(),
            "GEMINI_API_KEY": FAKE_KEY,
            "GOOGLE_GEMINI_BASE_URL": base_url,
            "GEMINI_CLI_SYSTEM_SETTINGS_PATH": str(root / "etc" / "system-settings.json"),
            "GEMINI_CLI_SYSTEM_DEFAULTS_PATH": str(root / "etc" / "system-defaults.json"),
            "GEMINI_TELEMETRY_ENABLED": "false",
            # one process instead of a parent that re-spawns node with a larger heap
            "GEMINI_CLI_NO_RELAUNCH": "true",
        }
    )
    return _recipe("gemini", ["--acp", "-m", GEMINI_MODEL], env, work, files, model=GEMINI_MODEL)


# --------------------------------------------------------------------------------------------
# codex-acp


def codex_recipe(base_url: str, tmp: str | os.PathLike[str]) -> dict[str, Any]:
    """codex-acp 0.16.0 with a custom ``mock`` model provider (wire_api=responses); no authenticate."""
    root, env, work = _base(tmp, "codex")
    codex_home = Path(env["HOME"]) / ".codex"
    files = _Files()
    config = f"""\
model = "{CODEX_MODEL}"
model_provider = "mock"
check_for_update_on_startup = false

[model_providers.mock]
name = "mock"
base_url = "{base_url}/v1"
env_key = "MOCK_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
log_user_prompt = false
"""
    files.write(codex_home / "config.toml", config)
    env.update(
        {
            "PATH": _path_env(),
            "CODEX_HOME": str(codex_home),
            "MOCK_API_KEY": FAKE_KEY,
            "RUST_LOG": "warn",
        }
    )
    return _recipe("codex", [], env, work, files, model=CODEX_MODEL)


# --------------------------------------------------------------------------------------------
# opencode


def opencode_recipe(base_url: str, tmp: str | os.PathLike[str]) -> dict[str, Any]:
    """opencode 1.18.33 (``opencode acp``) with an ``@ai-sdk/openai-compatible`` provider ``mock``."""
    root, env, work = _base(tmp, "opencode")
    files = _Files()
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "mock": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Mock",
                "options": {"baseURL": f"{base_url}/v1", "apiKey": FAKE_KEY},
                "models": {OPENCODE_MODEL: {"name": "Mock model"}},
            }
        },
        "model": f"mock/{OPENCODE_MODEL}",
        "small_model": f"mock/{OPENCODE_MODEL}",
        "autoupdate": False,
        "share": "disabled",
        "enabled_providers": ["mock"],
    }
    cfg = files.write(root / "opencode.json", config)
    # opencode runs a background `npm install @opencode-ai/plugin@<version>` (Arborist, against
    # registry.npmjs.org) in every config dir whose node_modules is missing or whose package-lock
    # lacks the dependency. A node_modules dir plus a matching package.json/package-lock.json in the
    # global config dir makes that check pass without touching the network.
    oc_cfg_dir = Path(env["XDG_CONFIG_HOME"]) / "opencode"
    (oc_cfg_dir / "node_modules").mkdir(parents=True, exist_ok=True)
    deps = {"@opencode-ai/plugin": OPENCODE_VERSION}
    files.write(oc_cfg_dir / "package.json", {"dependencies": deps})
    files.write(
        oc_cfg_dir / "package-lock.json",
        {"name": "opencode", "lockfileVersion": 3, "requires": True, "packages": {"": {"dependencies": deps}}},
    )
    env.update(
        {
            "PATH": _path_env(),
            "OPENCODE_CONFIG": str(cfg),
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",
            "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
        }
    )
    # --cwd sets the ACP server's default directory; the process cwd (recipe "cwd") is the sandbox
    # too, because opencode also runs git in its process cwd at start-up
    return _recipe("opencode", ["acp", "--pure", "--cwd", str(work)], env, work, files, model=f"mock/{OPENCODE_MODEL}")


# --------------------------------------------------------------------------------------------
# hermes


def hermes_recipe(base_url: str, tmp: str | os.PathLike[str]) -> dict[str, Any]:
    """hermes-agent 0.19.0 (``hermes acp``) with a ``custom`` OpenAI-compatible provider."""
    root, env, work = _base(tmp, "hermes")
    hermes_home = Path(env["HOME"]) / ".hermes"
    files = _Files()
    config = f"""\
model:
  provider: custom
  default: {HERMES_MODEL}
  base_url: {base_url}/v1
  api_key: {FAKE_KEY}
  context_length: 128000
"""
    files.write(hermes_home / "config.yaml", config)
    files.write(hermes_home / ".env", "")
    # Cost estimation / context-length fallbacks read OpenRouter's model catalogue
    # (https://openrouter.ai/api/v1/models), cached for 1 h under HERMES_HOME/cache. A fresh,
    # non-empty cache file stops the fetch.
    files.write(
        hermes_home / "cache" / "openrouter_model_metadata.json",
        {HERMES_MODEL: {"context_length": 128000, "max_completion_tokens": 4096, "name": HERMES_MODEL, "pricing": {}}},
    )
    env.update(
        {
            "PATH": _path_env(prefix("hermes") / "bin"),
            "HERMES_HOME": str(hermes_home),
            "HERMES_DISABLE_LAZY_INSTALLS": "1",  # never pip-install optional tool deps at runtime
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return _recipe("hermes", ["acp"], env, work, files, model=HERMES_MODEL)


# --------------------------------------------------------------------------------------------
# claude-agent-acp


def claude_recipe(base_url: str, tmp: str | os.PathLike[str]) -> dict[str, Any]:
    """claude-agent-acp 0.23.1 (bundled Claude Code 2.1.83) with ANTHROPIC_BASE_URL at the fake server."""
    root, env, work = _base(tmp, "claude")
    config_dir = Path(env["HOME"]) / ".claude"
    plugin_cache = config_dir / "plugins"
    files = _Files()
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    # a fresh plugin blocklist cache stops the (ungated) fetch from raw.githubusercontent.com
    files.write(plugin_cache / "blocklist.json", {"fetchedAt": now, "plugins": []})
    files.write(config_dir / "settings.json", {"env": {}, "permissions": {"defaultMode": "default"}})
    env.update(
        {
            "PATH": _path_env(),
            "CLAUDE_CONFIG_DIR": str(config_dir),
            "CLAUDE_CODE_PLUGIN_CACHE_DIR": str(plugin_cache),
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": FAKE_KEY,
            "IS_SANDBOX": "1",  # we run as root in CI; the SDK passes --allow-dangerously-skip-permissions
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_BUG_COMMAND": "1",
            "DISABLE_INSTALLATION_CHECKS": "1",
            "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
            "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",  # else it may git-clone from GitHub
            "CLAUDE_CODE_IDE_SKIP_AUTO_INSTALL": "1",
            "CLAUDE_CODE_MAX_RETRIES": "0",
        }
    )
    return _recipe("claude", [], env, work, files, model=CLAUDE_MODEL)


AGENTS: dict[str, Callable[[str, str | os.PathLike[str]], dict[str, Any]]] = {
    "opencode": opencode_recipe,
    "hermes": hermes_recipe,
    "gemini": gemini_recipe,
    "codex": codex_recipe,
    "claude": claude_recipe,
}


def recipe(name: str, base_url: str, tmp: str | os.PathLike[str]) -> dict[str, Any]:
    return AGENTS[name](base_url, tmp)
