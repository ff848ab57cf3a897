"""The bridge's configuration: YAML file, environment overrides, validation with named keys.

Precedence (docs/api.md "Configuration"): command-line flags, then environment variables
(``BRIDGE_AUTH_TOKEN``, ``ACP_ALLOWED_ORIGINS``, ``BRIDGE_HOST``, ``BRIDGE_PORT``; empty values are
ignored), then the file (``--config``, else ``BRIDGE_CONFIG_PATH``, else ``./xworkmate-bridge.yaml``
when present). String values in the file may reference ``${VAR}``; a missing variable is an error.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Annotated, Any

import msgspec
import yaml

from compat.knowledge.settings import KnowledgeSettings, SourceDescriptor
from compat.profile.settings import ProfileConfig, ProfileConfigError, parse_profiles
from compat.settings import (
    FieldInvalid,
    Limits,
    ProviderConfig,
    Seconds,
    Settings,
    SettingsError,
    Timeouts,
    convert,
    snake_case,
)

DEFAULT_ORIGINS = ("https://xworkmate.svc.plus", "http://localhost:*", "http://127.0.0.1:*")
DEFAULT_FILE = "xworkmate-bridge.yaml"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file and the bad key."""


class NamedToken(Settings, frozen=True):
    name: Annotated[str, msgspec.Meta(min_length=1)]
    token: Annotated[str, msgspec.Meta(min_length=1)]


class BridgeConfig(Settings, frozen=True):
    """The whole validated configuration (see docs/api.md for every key); build it with
    :func:`load_config` (or :func:`compat.settings.convert` for data already in memory)."""

    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8787
    auth_tokens: list[NamedToken | str] = []  # a bare token is named token-1, token-2, … (__post_init__)
    allowed_origins: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_ORIGINS))
    workspace_roots: list[str] = []
    providers: dict[str, ProviderConfig | None] | None = None  # None: every preset found on PATH
    profiles: dict[str, ProfileConfig] = {}  # exec profiles (iLink layout)
    gateway: dict[str, Any] | None = None
    knowledge: KnowledgeSettings = msgspec.field(default_factory=KnowledgeSettings)
    knowledge_sources: list[SourceDescriptor] | None = None  # None: the embedded documentation
    timeouts: Timeouts = msgspec.field(default_factory=Timeouts)
    limits: Limits = msgspec.field(default_factory=Limits)
    ws_ping_interval: Seconds = 20.0
    ws_ping_timeout: Seconds = 20.0
    sse_keepalive: Seconds = 15.0
    log_level: str = "info"
    allow_insecure_no_auth: bool = False
    profile_dir: str = msgspec.field(default_factory=os.getcwd, name="-")
    """Where relative profile paths start: the config file's folder. Set by :func:`load_config`
    (which overwrites a ``-`` key of the file), not a configuration key."""

    def __post_init__(self) -> None:
        named = [
            NamedToken(name=f"token-{i}", token=t) if isinstance(t, str) else t
            for i, t in enumerate(self.auth_tokens, start=1)
        ]
        if any(not t.token for t in named):
            raise FieldInvalid("authTokens", "a token must not be empty")
        names = [t.name for t in named]
        if twice := next((n for n in names if names.count(n) > 1), None):
            raise FieldInvalid("authTokens", f"two tokens are named {twice!r} (a bare token is named token-<n>)")
        msgspec.structs.force_setattr(self, "auth_tokens", named)
        if self.providers is not None:  # `codex:` with nothing under it is the preset as it is
            providers = {k: ProviderConfig() if v is None else v for k, v in self.providers.items()}
            msgspec.structs.force_setattr(self, "providers", providers)

    @property
    def named_tokens(self) -> list[NamedToken]:
        """``authTokens``, each named (``__post_init__`` names the bare ones)."""
        return [t for t in self.auth_tokens if isinstance(t, NamedToken)]

    def roots(self) -> list[Path]:
        """Workspace roots as resolved paths (default: the home and the system temp directory)."""
        raw = self.workspace_roots or [str(Path.home()), tempfile.gettempdir()]
        return [Path(os.path.expanduser(r)).resolve() for r in raw]


def _expand(value: Any, where: str, missing: list[str] | None = None) -> Any:
    """Replace ``${VAR}`` in every string; a missing variable is a ConfigError naming each key."""
    top = missing is None
    missing = [] if missing is None else missing

    def walk(item: Any, at: str) -> Any:
        if isinstance(item, str):

            def sub(match: re.Match[str]) -> str:
                name = match.group(1)
                if name not in os.environ:
                    missing.append(f"{at}: environment variable ${{{name}}} is not set")
                    return ""
                return os.environ[name]

            return _VAR.sub(sub, item)
        if isinstance(item, dict):
            return {k: walk(v, f"{at}.{k}" if at else str(k)) for k, v in item.items()}
        if isinstance(item, list):
            return [walk(v, f"{at}.{i}") for i, v in enumerate(item)]
        return item

    result = walk(value, where)
    if top and missing:
        raise ConfigError("\n".join(missing))
    return result


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def find_config_file(explicit: str | None) -> Path | None:
    if explicit:
        return Path(explicit)
    if env_path := _env("BRIDGE_CONFIG_PATH"):
        return Path(env_path)
    default = Path(DEFAULT_FILE)
    return default if default.is_file() else None


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open(encoding="utf-8") as stream:  # a stream, so YAML errors name the file
            raw = yaml.safe_load(stream)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    try:
        return _expand(raw, "")
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    except ConfigError as exc:
        raise ConfigError("\n".join(f"{path}: {line}" for line in str(exc).splitlines())) from None


def load_config(path: str | None = None, overrides: dict[str, Any] | None = None) -> BridgeConfig:
    """Load, merge and validate the configuration.

    Args:
        path: the ``--config`` flag, if given.
        overrides: flag values (``host``, ``port``, …) that win over everything else.

    Raises:
        ConfigError: unreadable file, bad YAML, missing ``${VAR}``, or a key that fails validation
            (the message names the first bad key; every missing ``${VAR}``).
    """
    file = find_config_file(path)
    data = _read_file(file) if file else {}
    source = str(file) if file else "configuration"
    if internal := next((k for k in ("-", "profile_dir", "profileDir") if k in data), None):
        raise ConfigError(f"{source}: {internal}: unknown key")
    given_by: dict[str, str] = {}  # key -> where its value came from, when not from the file
    for name, key, split in _ENV_KEYS:
        if value := _env(name):
            given_by[key] = f"environment variable {name}"
            data[key] = _split(value) if split else value
            if split and not data[key]:
                raise ConfigError(f"{given_by[key]}: no value in it, only commas and blanks")
    for key, value in (overrides or {}).items():
        if value is not None:
            data[key], given_by[key] = value, "flag --" + snake_case(key).replace("_", "-")
    for key in given_by:
        if (snake := snake_case(key)) != key:
            data.pop(snake, None)  # the file's snake_case spelling of a key set elsewhere
    base = file.resolve().parent if file else Path.cwd()
    _split_profiles(data, base, source)
    if isinstance(data.get("providers"), dict):
        from compat.acp.presets import with_preset

        data["providers"] = {k: with_preset(k, v) for k, v in data["providers"].items()}
    data["-"] = str(base)
    try:
        return convert(data, BridgeConfig)
    except SettingsError as exc:
        lines = []
        for p in exc.problems:
            origin = given_by.get(p.loc.partition(".")[0])
            lines.append(f"{origin}: {p.msg}" if origin else f"{source}: {p.loc or '(top level)'}: {p.msg}")
        raise ConfigError("\n".join(lines)) from exc


_ENV_KEYS = (
    ("BRIDGE_AUTH_TOKEN", "authTokens", True),
    ("ACP_ALLOWED_ORIGINS", "allowedOrigins", True),
    ("BRIDGE_HOST", "host", False),
    ("BRIDGE_PORT", "port", False),
)
"""Environment variables that override a key of the file: ``(name, key, comma-separated)``."""


def _split_profiles(data: dict[str, Any], base: Path, source: str) -> None:
    """Move exec profiles (``profiles:`` and ``providers.<id>: {type: profile}``) into
    ``data["profiles"]``, validated with the iLink key names; profiles and providers share one id
    space (with no ``providers:`` key, the preset ids are taken)."""
    from compat.acp.presets import PRESETS

    reserved = () if data.get("providers") is not None else (*PRESETS, "knowledge")
    try:
        profiles, providers = parse_profiles(
            data.pop("profiles", None), data.get("providers"), profile_dir=base, reserved=reserved, expand=False
        )  # _read_file expanded ${VAR}
    except ProfileConfigError as exc:
        raise ConfigError("\n".join(f"{source}: {line}" for line in str(exc).splitlines())) from exc
    if providers is not None:
        data["providers"] = providers
    data["profiles"] = profiles
