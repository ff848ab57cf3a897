"""Exec profiles' configuration: the iLink Hub Bridge profile keys, and how a profile's command
line is resolved (runtime by script extension, the pinned ``tsx``, the built-in ``claude-code``).

A profile comes from ``profiles.<id>`` in the bridge's YAML (the iLink layout) or from
``providers.<id>: {type: profile | claude-code, …}`` with the same snake_case keys. Key names and
defaults follow the iLink profile spec (exec-profiles-and-hermes.md §2); unknown keys are errors.
Every error names the profile and the key (``profiles.bot.script: …``).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from compat.process.commands import agents_dir, find_command, version_key
from compat.settings import Count, FieldInvalid, Seconds, Settings, SettingsError, convert, expand_env

logger = logging.getLogger(__name__)

TSX_VERSION = "4.23.15"  # keep in step with scripts/install-profile-tools.sh
CLAUDE_CLI = "node_modules/@anthropic-ai/claude-agent-sdk/cli.js"
RUBY_LINE_BUFFERED = "STDOUT.sync = true; STDERR.sync = true; $0 = ARGV.shift; load($0)"
"""How a ``.rb`` profile is started: its output line by line, ``$0`` and ``ARGV`` as usual."""
RUNTIMES: Mapping[str, str] = {
    ".py": "python3",
    ".js": "node",
    ".mjs": "node",
    ".cjs": "node",
    ".ts": "tsx",
    ".sh": "bash",
    ".bash": "bash",
    ".rb": "ruby",
}
_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "fish", "ash"})


class ProfileConfigError(ValueError):
    """A profile cannot be used; the message names the profile and the key (one line each, when
    :func:`parse_profiles` found several). ``found`` and ``rest``: what :func:`parse_profiles`
    could use anyway."""

    def __init__(
        self, message: str, *, found: dict[str, ProfileConfig] | None = None, rest: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.found = found or {}
        self.rest = rest


class ProfileConfig(Settings, frozen=True, rename=None):
    """One exec profile (snake_case keys, as in iLink; ``maxConcurrent`` is also accepted).
    Built from raw data by :func:`parse_profile`, which replaces ``${VAR}`` first.

    Raises (from the constructor, or as a :class:`~compat.settings.SettingsError` problem from
    :func:`parse_profile`):
        FieldInvalid: an empty ``script``/``command``/``cwd``/``label``, a bad ``env`` name,
            neither ``script`` nor ``command``, or ``{{MESSAGE}}`` given to a shell's ``-c``.
    """

    type: Literal["exec", "claude-code"] = "exec"
    script: str | None = None
    command: str | None = None
    args: list[str] = []
    cwd: str | None = None  # default: the turn's workingDirectory
    env: dict[str, str] = {}
    timeout_secs: Seconds = 300.0
    streaming: bool = True
    stdin: Literal["message", "none"] = "none"
    send_error_reply: bool = True
    include_stderr_in_reply: bool = False
    cli_session_first_line_prefix: str | None = None
    label: str | None = None
    max_concurrent: Count = 8
    # iLink Hub profile keys that have nothing to act on here, accepted so that its profiles run
    # unchanged (exec-profiles-and-hermes.md §2): the Hub splits a reply into WeChat messages of
    # max_reply_chars, keeps truncation_suffix unused on that path, and lists description in its
    # MCP list_agents. A turn here has one output, bounded by limits.maxOutputBytes.
    description: str | None = None
    max_reply_chars: Count = 8000
    truncation_suffix: str | None = None

    def __post_init__(self) -> None:
        for name in ("script", "command", "cwd", "cli_session_first_line_prefix", "label"):
            value = getattr(self, name)
            if value is not None and not value.strip():
                raise FieldInvalid(name, "must not be empty")
        for name in self.env:
            if not name or "=" in name or "\0" in name:
                raise FieldInvalid("env", f"invalid variable name {name!r}")
        if self.type == "exec" and not (self.script or self.command):
            raise ValueError("one of script or command is required (or type: claude-code)")
        if _shell_with_message(self.command, self.args):
            raise ValueError(
                "{{MESSAGE}} in args of a shell run with -c would let the message run as code; "
                "read $AGENT_MESSAGE in the script instead"
            )


def expand_vars(value: str) -> str:
    """Replace environment references from the bridge's environment (``compat.settings.expand_env``:
    ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``$$``).

    Raises:
        ValueError: A referenced variable is not set (and has no default).
    """
    expanded = expand_env(value)
    if expanded.missing:
        raise ValueError(f"environment variable ${{{expanded.missing[0]}}} is not set")
    for name in expanded.empty:
        logger.warning("environment variable %s is set but empty", name)
    return expanded.text


def _shell_with_message(command: str | None, args: list[str]) -> bool:
    if not command or not command.split() or os.path.basename(command.split()[0]) not in _SHELLS:
        return False
    runs_code = any(re.fullmatch(r"-[A-Za-z]*c[A-Za-z]*", a) for a in [*command.split()[1:], *args])
    return runs_code and any("{{MESSAGE}}" in a for a in args)


# ---- parsing a configuration --------------------------------------------------------------------


def parse_profile(where: str, raw: Any, *, expand: bool = True) -> ProfileConfig:
    """Validate one profile; ``where`` is its config path (``profiles.bot``).

    Args:
        expand: Replace ``${VAR}`` in ``script``, ``command``, ``cwd``, ``args`` and ``env``
            values from the bridge's environment (False for a file bridge.config already
            expanded: a value is never expanded twice).

    Raises:
        ProfileConfigError: The first bad key, as ``<where>.<key>: <message>``.
    """
    if isinstance(raw, Mapping):
        raw = dict(raw)
        if expand:
            raw = _expanded(where, raw)
        if "maxConcurrent" in raw and "max_concurrent" not in raw:
            raw["max_concurrent"] = raw.pop("maxConcurrent")  # camelCase, like the bridge's own keys
        if raw.get("type") == "profile":
            raw["type"] = "exec"  # providers.<id>: {type: profile}
        if "stdin" in raw and raw["stdin"] is None:
            raw["stdin"] = "none"
    try:
        return convert({} if raw is None else raw, ProfileConfig, where)
    except SettingsError as exc:
        raise ProfileConfigError(str(exc)) from None


def _expanded(where: str, raw: dict[str, Any]) -> dict[str, Any]:
    def one(key: str, value: Any) -> Any:
        if not isinstance(value, str):
            return value  # validation reports the type
        try:
            return expand_vars(value)
        except ValueError as exc:
            raise ProfileConfigError(f"{where}.{key}: {exc}") from None

    for key in ("script", "command", "cwd"):
        if key in raw:
            raw[key] = one(key, raw[key])
    if isinstance(raw.get("args"), list):
        raw["args"] = [one("args", arg) for arg in raw["args"]]
    if isinstance(raw.get("env"), Mapping):
        raw["env"] = {name: one("env", value) for name, value in raw["env"].items()}
    return raw


def parse_profiles(
    profiles: Mapping[str, Any] | None,
    providers: Mapping[str, Any] | None = None,
    *,
    profile_dir: str | os.PathLike[str],
    reserved: Iterable[str] = (),
    check_runtime: bool = True,
    expand: bool = True,
) -> tuple[dict[str, ProfileConfig], dict[str, Any] | None]:
    """Collect the profiles of a raw (YAML-loaded) configuration.

    Args:
        profiles: The top-level ``profiles:`` mapping (iLink layout), or None.
        providers: The raw ``providers:`` mapping; entries with ``type: profile`` or
            ``type: claude-code`` are profiles, the others are left alone.
        profile_dir: Where relative ``script:``/``cwd:`` paths and ``{{PROFILE_DIR}}`` point (the
            config file's directory).
        reserved: Ids of providers that exist without a ``providers:`` entry (the presets and
            ``knowledge`` when ``providers:`` is absent); a profile may not take them.
        check_runtime: Also resolve each profile's runtime and script (see :func:`resolve_runtime`).
        expand: See :func:`parse_profile`.

    Returns:
        ``({id: ProfileConfig}, providers without the profile entries)``, both in config order.

    Raises:
        ProfileConfigError: Every invalid profile, missing runtime or script, and id used twice
            (profiles and providers share one id space), one line each; it carries the profiles
            that are valid and the providers without the profile entries (``found``, ``rest``),
            so the caller can go on to check the rest of the configuration.
    """
    if profiles is not None and not isinstance(profiles, Mapping):
        raise ProfileConfigError("profiles: must be a mapping of profile ids to profiles")
    if providers is not None and not isinstance(providers, Mapping):
        raise ProfileConfigError("providers: must be a mapping of provider ids to entries")
    found: dict[str, ProfileConfig] = {}
    rest = None if providers is None else dict(providers)
    taken = set(reserved)
    problems: list[str] = []

    def parse(where: str, profile_id: str, raw: Any) -> None:
        try:
            profile = parse_profile(where, raw, expand=expand)
            if check_runtime:
                resolve_runtime(profile, profile_dir, where=where)
        except ProfileConfigError as exc:
            problems.extend(str(exc).splitlines())
        else:
            found[profile_id] = profile

    for profile_id, raw in (profiles or {}).items():
        if rest is not None and profile_id in rest:
            problems.append(f"profiles.{profile_id}: the id is also used by providers.{profile_id}")
        elif profile_id in taken:
            problems.append(f"profiles.{profile_id}: the id is already used by the built-in provider {profile_id}")
        else:
            parse(f"profiles.{profile_id}", str(profile_id), raw)
    for provider_id, raw in (providers or {}).items():
        if isinstance(raw, Mapping) and raw.get("type") in ("profile", "claude-code"):
            parse(f"providers.{provider_id}", str(provider_id), raw)
            assert rest is not None
            del rest[provider_id]
    if problems:
        raise ProfileConfigError("\n".join(problems), found=found, rest=rest)
    return found, rest


# ---- resolving the command line -----------------------------------------------------------------


def tools_dir() -> Path:
    """The profile tools cache: ``$XWORKMATE_TOOLS_DIR``, else
    ``${XDG_CACHE_HOME:-~/.cache}/xworkmate-bridge/tools`` (scripts/install-profile-tools.sh)."""
    explicit = os.environ.get("XWORKMATE_TOOLS_DIR")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "xworkmate-bridge" / "tools"


def find_tsx() -> str | None:
    """The pinned ``tsx`` from the tools cache (``tsx-<TSX_VERSION>``, else the newest installed),
    then ``tsx`` on PATH. Never fetched (no ``npx``)."""
    root = tools_dir()
    pinned = root / f"tsx-{TSX_VERSION}" / "node_modules" / ".bin" / "tsx"
    others = sorted(root.glob("tsx-*/node_modules/.bin/tsx"), key=lambda p: version_key(p.parts[-4]), reverse=True)
    for path in (pinned, *others):
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return shutil.which("tsx")


def find_claude_cli() -> str | None:
    """``cli.js`` of the Claude Code CLI bundled by ``@zed-industries/claude-agent-acp`` in the
    ``make agents`` cache, newest version first."""
    root = agents_dir()
    found = root.glob(f"claude-agent-acp-*/{CLAUDE_CLI}")
    newest = sorted(found, key=lambda p: version_key(p.relative_to(root).parts[0]), reverse=True)
    return str(newest[0]) if newest else None


def _runtime(name: str, where: str) -> str:
    path = find_tsx() if name == "tsx" else shutil.which(name)
    if path is None:
        hint = " (run scripts/install-profile-tools.sh)" if name == "tsx" else ""
        raise ProfileConfigError(f"{where}: runtime {name!r} is not installed{hint}")
    if name == "tsx" and shutil.which("node") is None:
        raise ProfileConfigError(f"{where}: runtime 'node' (needed by tsx) is not installed")
    return path


def _local_path(value: str, profile_dir: Path) -> Path:
    path = Path(os.path.expanduser(value))
    return path if path.is_absolute() else profile_dir / path


def _command(command: str, profile_dir: Path, where: str) -> list[str]:
    parts = [command]
    if any(c.isspace() for c in command) and not _local_path(command, profile_dir).exists():
        parts = shlex.split(command)  # "npx tsx"-style commands without args (as agentproc does)
    head = parts[0]
    if os.sep in head:
        found = _local_path(head, profile_dir)
        resolved = str(found) if found.is_file() and os.access(found, os.X_OK) else None
    else:
        resolved = find_command(head)
    if resolved is None:
        raise ProfileConfigError(f"{where}.command: {head!r} is not an executable file or on PATH")
    return [resolved, *parts[1:]]


def resolve_runtime(
    profile: ProfileConfig, profile_dir: str | os.PathLike[str], *, where: str = "profile"
) -> list[str]:
    """The command-line prefix that runs ``profile`` (before its ``args``).

    ``{{PROFILE_DIR}}`` may appear in ``script`` and ``command``. ``command`` (split like a shell
    word list when it has spaces and is no file, as agentproc does) replaces the runtime inferred
    from the ``script`` extension (``.py`` → python3,
    ``.js``/``.mjs``/``.cjs`` → node, ``.ts`` → the pinned tsx, ``.sh``/``.bash`` → bash, ``.rb``
    → ruby); any other script is executed directly and must be executable. ``type: claude-code``
    is ``node <cli.js>`` (``script:`` may point at another ``cli.js``, ``command:`` at a ``claude``
    executable).

    Args:
        profile: The validated profile.
        profile_dir: Base of relative ``script``/``command`` paths.
        where: The profile's config path for messages (``profiles.bot``).

    Returns:
        ``[runtime, script]``, ``[script]``, ``[command, script]`` or ``[command]``, absolute.

    Raises:
        ProfileConfigError: The script is missing or not executable, or a runtime is not installed.
    """
    base = Path(profile_dir)
    command, script_value = (
        None if v is None else v.replace("{{PROFILE_DIR}}", str(base)) for v in (profile.command, profile.script)
    )
    if profile.type == "claude-code" and not script_value:
        if command:
            return _command(command, base, where)
        cli = find_claude_cli()
        if cli is None:
            raise ProfileConfigError(
                f"{where}.type: claude-code needs {CLAUDE_CLI} from claude-agent-acp "
                f"in {agents_dir()} (run `make agents`)"
            )
        return [_runtime("node", f"{where}.type"), cli]
    if not script_value:
        assert command is not None
        return _command(command, base, where)
    script = _local_path(script_value, base)
    if not script.is_file():
        raise ProfileConfigError(f"{where}.script: {str(script)!r} does not exist")
    if command:
        return [*_command(command, base, where), str(script)]
    runtime = RUNTIMES.get(script.suffix.lower())
    if runtime is None:
        if not os.access(script, os.X_OK):
            reason = "is not executable (and its extension names no runtime)"
            raise ProfileConfigError(f"{where}.script: {str(script)!r} {reason}")
        return [str(script)]
    if runtime == "ruby":  # Ruby block-buffers a pipe: partials would arrive in one burst at exit
        return [_runtime(runtime, f"{where}.script"), "-e", RUBY_LINE_BUFFERED, str(script)]
    return [_runtime(runtime, f"{where}.script"), str(script)]
