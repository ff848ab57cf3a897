"""The bridge's configuration: YAML file, environment overrides, validation with named keys.

Precedence (docs/api.md "Configuration"): command-line flags, then environment variables
(``BRIDGE_AUTH_TOKEN``, ``ACP_ALLOWED_ORIGINS``, ``BRIDGE_HOST``, ``BRIDGE_PORT``; empty values are
ignored), then the file (``--config``, else ``BRIDGE_CONFIG_PATH``, else ``./xworkmate-bridge.yaml``
when present). String values in the file may reference the environment as shells do
(``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``$$`` for ``$``); a variable that is not set
is an error, one that is set but empty a warning (an error in ``authTokens``).

Every problem of a file is reported in one run, each with its key path and line, and with a
"quote it" hint where YAML turned a value meant as text into a boolean, number or time
(``off``, ``no``, ``1.10``, ``0755``, ``22:22``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from compat.gateway.settings import GatewaySettings
from compat.knowledge.settings import KnowledgeSettings, RuntimeSettings, SourceDescriptor
from compat.llm.settings import KNOWLEDGE_RUNTIME_ID, LlmSettings, ModelRuntime, PrincipalSettings
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
    expand_env,
    provider_id_problems,
    snake_case,
)

DEFAULT_ORIGINS = ("https://xworkmate.svc.plus", "http://localhost:*", "http://127.0.0.1:*")
DEFAULT_FILE = "xworkmate-bridge.yaml"
LOCAL_PRINCIPAL = "local"
"""The principal of requests with no token (loopback) and of ``acp-stdio``; reserved."""


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file and the bad key."""


def token_principal(token: str) -> str:
    """The principal of a token configured without a name: ``token-`` and the first 12 hex
    digits of its SHA-256, stable whatever its place in the list (its sessions stay its own when
    other tokens are added or removed)."""
    return "token-" + hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()[:12]


def host_port(host: str, port: int) -> str:
    """``host:port`` as a URL's authority: an IPv6 address in brackets (RFC 3986 §3.2.2)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class NamedToken(Settings, frozen=True):
    name: Annotated[str, msgspec.Meta(min_length=1)]
    token: Annotated[str, msgspec.Meta(min_length=1)]


class TracingSettings(Settings, frozen=True):
    """``tracing:``: OpenTelemetry spans, exported over OTLP/HTTP to ``otlp_endpoint``
    (``http://collector:4318/v1/traces``). Absent: tracing is off and nothing of it is loaded."""

    otlp_endpoint: str | None = None
    service_name: str = "xworkmate-bridge"


class BridgeConfig(Settings, frozen=True):
    """The whole validated configuration (see docs/api.md for every key); build it with
    :func:`load_config` (or :func:`compat.settings.convert` for data already in memory)."""

    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8787
    auth_tokens: list[NamedToken | str] = []  # a bare token is named token-<hash> (token_principal)
    allowed_origins: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_ORIGINS))
    workspace_roots: list[str] = []
    providers: dict[str, ProviderConfig | None] | None = None  # None: every preset found on PATH
    profiles: dict[str, ProfileConfig] = {}  # exec profiles (iLink layout)
    gateway: GatewaySettings | None = None  # the OpenClaw gateway (docs/api.md "Gateway")
    knowledge: KnowledgeSettings = msgspec.field(default_factory=KnowledgeSettings)
    knowledge_sources: list[SourceDescriptor] | None = None  # None: the embedded documentation
    llm: LlmSettings = msgspec.field(default_factory=LlmSettings)
    """Model runtimes for ``llm.*`` and the knowledge provider (docs/api.md "Model calls")."""
    principals: dict[str, PrincipalSettings] = {}
    """What each principal may use (docs/api.md "Principals"); names from ``authTokens`` or ``local``."""
    timeouts: Timeouts = msgspec.field(default_factory=Timeouts)
    limits: Limits = msgspec.field(default_factory=Limits)
    ws_ping_interval: Seconds = 20.0
    ws_ping_timeout: Seconds = 20.0
    sse_keepalive: Seconds = 15.0
    log_level: str = "info"
    log_format: Literal["text", "json"] = "text"
    """``json``: one JSON object per log line (bridge.logs.JsonFormatter)."""
    allow_insecure_no_auth: bool = False
    data_dir: str | None = None
    """The bridge's own files (default ``$XDG_DATA_HOME/xworkmate-bridge``, else
    ``~/.local/share/xworkmate-bridge``)."""
    remote_workspaces: bool | None = None
    """A ``workingDirectory`` outside every root runs in a folder of the caller's session under
    ``remoteWorkspaceRoot`` (default: on when the bridge listens off loopback)."""
    remote_workspace_root: str | None = None  # default: <dataDir>/workspaces
    state_dir: str | None = None
    """Where sessions, turns and update logs are stored (default ``<dataDir>/state``)."""
    persist_sessions: bool = True
    """False: sessions live in memory only and are gone with the process."""
    audit_log: bool | str = False
    """True: one JSON line per request in ``<stateDir>/audit.jsonl`` (a string: that file), with
    an allow-list of fields, never a prompt or a secret (bridge.audit)."""
    io_log: str | None = None
    """A file for the whole exchange of every request, secrets redacted (local debugging)."""
    tracing: TracingSettings | None = None
    """OpenTelemetry tracing (docs/api.md "Tracing"); off when absent."""
    metrics_public: bool = False
    """True: ``GET /metrics`` needs no token (it shows every principal's activity; default: only
    ``adminPrincipals`` may read it)."""
    admin_principals: list[str] = msgspec.field(default_factory=lambda: [LOCAL_PRINCIPAL])
    """Principals that administer the bridge: read ``system.logs`` (and, later, the knowledge
    source registry and metrics)."""
    profile_dir: str = msgspec.field(default_factory=os.getcwd, name="-")
    """Where relative profile paths start: the config file's folder. Set by :func:`load_config`
    (which overwrites a ``-`` key of the file), not a configuration key."""
    only: str | None = msgspec.field(default=None, name="-only")
    """``serve --only PROVIDER``: the one provider this bridge enables (the knowledge provider and
    the gateway only when they are it); not a configuration key (:func:`only_provider`)."""
    load_warnings: tuple[str, ...] = msgspec.field(default=(), name="-warnings")
    """What :func:`load_config` warns of (a variable set but empty), for the caller to log once
    logging is set up; not a configuration key."""

    def __post_init__(self) -> None:
        named = [NamedToken(name=token_principal(t), token=t) if isinstance(t, str) else t for t in self.auth_tokens]
        if any(not t.token for t in named):
            raise FieldInvalid("authTokens", "a token must not be empty")
        if any(t.name == LOCAL_PRINCIPAL for t in named):
            raise FieldInvalid(
                "authTokens", f"a token cannot be named {LOCAL_PRINCIPAL!r} (the principal with no token)"
            )
        names = [t.name for t in named]
        if twice := next((n for n in names if names.count(n) > 1), None):
            raise FieldInvalid(
                "authTokens", f"two tokens are named {twice!r} (a bare token is named token-<hash of it>)"
            )
        msgspec.structs.force_setattr(self, "auth_tokens", named)
        for name in self.principals:
            if name != LOCAL_PRINCIPAL and name not in names:
                known = ", ".join([LOCAL_PRINCIPAL, *names])
                raise FieldInvalid(f"principals.{name}", f"no authTokens entry is named {name!r} (principals: {known})")
        self._link_knowledge_runtime()
        if self.providers is not None:  # `codex:` with nothing under it is the preset as it is
            providers = {k: ProviderConfig() if v is None else v for k, v in self.providers.items()}
            msgspec.structs.force_setattr(self, "providers", providers)

    def _link_knowledge_runtime(self) -> None:
        """Make ``knowledge.runtime`` one of ``llm.runtimes``: ``{id}`` refers to an entry (an
        ``openai`` one: the knowledge provider streams chat completions); the older shorthand
        (``baseUrl``, ``model``, ``apiKeyEnv``, ``timeoutSeconds``) defines the entry ``knowledge``."""
        runtime, llm = self.knowledge.runtime, self.llm
        if runtime.id is not None:
            entry = llm.runtime(runtime.id)
            if entry is not None and (runtime.base_url, runtime.model) == (entry.base_url, entry.model):
                return  # linked already (msgspec.structs.replace runs this again)
            if runtime.base_url or runtime.model or runtime.api_key_env:
                raise FieldInvalid("knowledge.runtime", "give either id (an llm.runtimes entry) or baseUrl and model")
            entry = llm.runtime(runtime.id)
            if entry is None:
                raise FieldInvalid("knowledge.runtime.id", f"no llm.runtimes entry has the id {runtime.id!r}")
            if entry.kind != "openai":
                raise FieldInvalid(
                    "knowledge.runtime.id",
                    f"runtime {entry.id} is {entry.kind}; the knowledge provider needs an openai one",
                )
            linked = RuntimeSettings(
                id=entry.id,
                base_url=entry.base_url,
                model=entry.model,
                api_key_env=entry.api_key_env,
                timeout_seconds=entry.timeout_seconds or runtime.timeout_seconds,
            )
        elif runtime.configured:
            if llm.runtime(KNOWLEDGE_RUNTIME_ID) is not None:
                raise FieldInvalid(
                    "knowledge.runtime",
                    f"llm.runtimes has an entry {KNOWLEDGE_RUNTIME_ID!r}; write knowledge.runtime: "
                    f"{{id: {KNOWLEDGE_RUNTIME_ID}}} instead of baseUrl and model",
                )
            assert runtime.base_url is not None and runtime.model is not None
            try:
                entry = ModelRuntime(
                    id=KNOWLEDGE_RUNTIME_ID,
                    base_url=runtime.base_url,
                    model=runtime.model,
                    api_key_env=runtime.api_key_env,
                    timeout_seconds=runtime.timeout_seconds,
                )
            except FieldInvalid as exc:
                raise FieldInvalid(f"knowledge.runtime.{exc.field}", exc.message) from None
            llm = msgspec.structs.replace(llm, runtimes=(*llm.runtimes, entry))
            linked = msgspec.structs.replace(runtime, id=KNOWLEDGE_RUNTIME_ID)
        else:
            return
        msgspec.structs.force_setattr(self, "llm", llm)
        msgspec.structs.force_setattr(self, "knowledge", msgspec.structs.replace(self.knowledge, runtime=linked))

    @property
    def named_tokens(self) -> list[NamedToken]:
        """``authTokens``, each named (``__post_init__`` names the bare ones)."""
        return [t for t in self.auth_tokens if isinstance(t, NamedToken)]

    def data_path(self) -> Path:
        """``dataDir``, resolved."""
        if self.data_dir:
            return Path(os.path.expanduser(self.data_dir)).resolve()
        base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
        return (Path(base) / "xworkmate-bridge").resolve()

    def remote_root(self) -> Path:
        """``remoteWorkspaceRoot``, resolved (default ``<dataDir>/workspaces``)."""
        if self.remote_workspace_root:
            return Path(os.path.expanduser(self.remote_workspace_root)).resolve()
        return self.data_path() / "workspaces"

    def state_path(self) -> Path:
        """``stateDir``, resolved (default ``<dataDir>/state``)."""
        if self.state_dir:
            return Path(os.path.expanduser(self.state_dir)).resolve()
        return self.data_path() / "state"

    def audit_path(self) -> Path | None:
        """``auditLog``'s file, or None when it is off."""
        if self.audit_log is False:
            return None
        if self.audit_log is True:
            return self.state_path() / "audit.jsonl"
        return Path(os.path.expanduser(self.audit_log)).resolve()

    def gateway_identity_path(self) -> Path:
        """``gateway.identityFile``, resolved (default ``<dataDir>/gateway/device.pem``)."""
        if self.gateway is not None and self.gateway.identity_file:
            return Path(os.path.expanduser(self.gateway.identity_file)).resolve()
        return self.data_path() / "gateway" / "device.pem"

    def roots(self) -> list[Path]:
        """Workspace roots as resolved paths (default: the home and the system temp directory)."""
        if self.workspace_roots:
            raw = self.workspace_roots
        else:
            import tempfile  # ~2.5 ms of the cold start (bench case 6) when the roots are set

            raw = [str(Path.home()), tempfile.gettempdir()]
        return [Path(os.path.expanduser(r)).resolve() for r in raw]


def _expand(value: Any, problems: list[str], warnings: list[str]) -> Any:
    """``value`` with every string's environment references replaced (:func:`expand_env`); each
    variable not set is a problem, each set but empty a warning (a problem under ``authTokens``),
    both naming the key."""

    def walk(item: Any, at: str) -> Any:
        if isinstance(item, str):
            expanded = expand_env(item)
            for name in expanded.missing:
                problems.append(f"{at}: environment variable ${{{name}}} is not set")
            for name in expanded.empty:
                if at.split(".")[0] in ("authTokens", "auth_tokens"):
                    problems.append(f"{at}: environment variable ${{{name}}} is empty (a token must not be)")
                else:
                    warnings.append(f"{at}: environment variable ${{{name}}} is set but empty")
            return expanded.text
        if isinstance(item, dict):
            return {k: walk(v, f"{at}.{k}" if at else str(k)) for k, v in item.items()}
        if isinstance(item, list):
            return [walk(v, f"{at}.{i}") for i, v in enumerate(item)]
        return item

    return walk(value, "")


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


def _read_file(path: Path) -> tuple[dict[str, Any], list[str]]:
    """The file's top-level mapping, and a warning for each key given twice in one mapping (the
    last value is used, as YAML and JSON readers do; the warning names both lines).

    A file that is plain JSON (JSON is YAML) is read with the stdlib's ``json`` and PyYAML is not
    imported: importing and running PyYAML's pure-Python loader was ~10 ms of a 110 ms budget in
    bench case 6 (cold start, target <= 1.5x the baseline server), whose configs, like most
    generated ones, are JSON. Everything else goes to PyYAML (:func:`_read_json`).

    Raises:
        ConfigError: unreadable, not YAML, nested too deeply, or not a mapping (nothing else can
            be checked then).
    """
    try:
        with path.open(encoding="utf-8") as stream:  # a stream, so YAML errors name the file
            text = stream.read()
            if (parsed := _read_json(text)) is not None:
                return _mapping(parsed, path), []
            stream.seek(0)
            raw, repeated = _load_yaml(stream, path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    return _mapping(raw, path), repeated


class _NotPlainJson(Exception):
    pass


def _read_json(text: str) -> Any:
    """``text`` as JSON when it is a JSON object PyYAML would read the same way, else None (PyYAML
    reads it then): not JSON (YAML's flow style, ``{host: 0.0.0.0}``), a float or a NaN (YAML 1.1
    reads ``1e3`` as text), or a key given twice in one object (PyYAML's reader warns, naming the
    lines). Integers stay exact, as in PyYAML."""
    if not text.lstrip().startswith("{"):
        return None

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        mapping = dict(items)
        if len(mapping) < len(items):
            raise _NotPlainJson
        return mapping

    def refuse(literal: str) -> Any:
        raise _NotPlainJson

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_float=refuse, parse_constant=refuse)
    except (_NotPlainJson, ValueError):  # json.JSONDecodeError is a ValueError
        return None


def _load_yaml(stream: Any, path: Path) -> tuple[Any, list[str]]:
    import yaml

    from bridge.config_lines import load_yaml

    try:
        return load_yaml(stream)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc


def _mapping(raw: Any, path: Path) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return raw


def load_config(path: str | None = None, overrides: dict[str, Any] | None = None) -> BridgeConfig:
    """Load, merge and validate the configuration.

    Args:
        path: the ``--config`` flag, if given.
        overrides: flag values (``host``, ``port``, …) that win over everything else.

    Returns:
        The configuration; its ``load_warnings`` are for the caller to log.

    Raises:
        ConfigError: unreadable file or bad YAML (alone), or every problem found: each variable
            not set, each key that fails validation, each unusable profile or provider, one line
            each (``<file>:<line>: <key path>: <message>``).
    """
    file = find_config_file(path)
    data, repeated = _read_file(file) if file else ({}, [])
    source = str(file) if file else "configuration"
    problems: list[str] = []  # "<key path>: <message>" of the file's content
    elsewhere: list[str] = []  # lines about values from the environment or flags
    warnings: list[str] = list(repeated)
    try:
        data = _expand(data, problems, warnings)
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None

    internal_keys = ("-", "-warnings", "-only", "profile_dir", "profileDir", "load_warnings", "only")
    for internal in [k for k in internal_keys if k in data]:
        problems.append(f"{internal}: unknown key")
        del data[internal]
    given_by: dict[str, str] = {}  # key -> where its value came from, when not from the file
    for name, key, split in _ENV_KEYS:
        if value := _env(name):
            given_by[key] = f"environment variable {name}"
            data[key] = _split(value) if split else value
            if split and not data[key]:
                elsewhere.append(f"{given_by[key]}: no value in it, only commas and blanks")
                del data[key]
    for key, value in (overrides or {}).items():
        if value is not None:
            data[key], given_by[key] = value, "flag --" + snake_case(key).replace("_", "-")
    for key in given_by:
        if (snake := snake_case(key)) != key:
            data.pop(snake, None)  # the file's snake_case spelling of a key set elsewhere
    base = file.resolve().parent if file else Path.cwd()
    problems += provider_id_problems(_provider_ids(data))
    problems += _split_profiles(data, base)
    reported = [line.partition(": ")[0] for line in problems]  # validation need not repeat these
    if isinstance(data.get("providers"), dict):
        from compat.acp.presets import with_preset

        data["providers"] = {k: with_preset(k, v) for k, v in data["providers"].items()}
    data["-"] = str(base)
    config: BridgeConfig | None = None
    try:
        config = convert(data, BridgeConfig)
    except SettingsError as exc:
        for p in exc.problems:
            origin = given_by.get(p.loc.partition(".")[0])
            if origin:
                elsewhere.append(f"{origin}: {p.msg}")
            elif not any(_covers(loc, p.loc) for loc in reported):
                problems.append(f"{p.loc or '(top level)'}: {p.msg}")
    if isinstance(data.get("providers"), dict):
        found = [line.partition(": ")[0] for line in problems]
        entries = {k: v for k, v in data["providers"].items() if not any(_covers(f"providers.{k}", f) for f in found)}
        problems += provider_problems(entries)  # only for entries with no problem of their own yet
    if problems or elsewhere:
        from bridge.config_lines import locate_lines  # PyYAML, imported once a file has problems

        located = locate_lines(problems, file) if file else [f": {line}" for line in problems]
        raise ConfigError("\n".join([*(f"{source}{line}" for line in located), *elsewhere]))
    assert config is not None
    limits = config.limits
    carried = 4 * -(-limits.max_turn_attachment_bytes // 3) + 1024 * 1024  # base64, plus 1 MiB for the rest
    if limits.max_message_bytes < carried:
        warnings.append(
            f"limits.maxMessageBytes ({limits.max_message_bytes}) cannot carry maxTurnAttachmentBytes "
            f"({limits.max_turn_attachment_bytes}) of inline attachments as base64 (that needs {carried}): "
            "requests with large attachments will be refused as too large"
        )
    if config.gateway is not None and config.providers is not None and "openclaw" in config.providers:
        raise ConfigError(f"{source}: providers.openclaw: the id openclaw names the gateway (gateway:); pick another")
    msgspec.structs.force_setattr(config, "load_warnings", tuple(f"{source}: {w}" for w in warnings))
    return config


def only_provider(config: BridgeConfig, provider_id: str) -> BridgeConfig:
    """``config`` with ``provider_id`` as its one provider (``serve --only``, the
    ``*-acp-adapter`` scripts): a configured provider or profile, a preset, ``knowledge`` (the
    built-in knowledge provider) or ``openclaw`` (the configured gateway).

    Raises:
        ConfigError: no provider has that id.
    """
    from compat.acp.presets import PRESETS

    known = [*(config.providers if config.providers is not None else PRESETS), *config.profiles]
    known += [p for p in PRESETS if p not in known]
    if config.knowledge.enabled and "knowledge" not in known:
        known.append("knowledge")
    if config.gateway is not None and config.gateway.enabled:
        known.append("openclaw")
    if provider_id not in known:
        raise ConfigError(f"--only {provider_id}: no such provider (known: {', '.join(known)})")
    return msgspec.structs.replace(config, only=provider_id)


def _covers(a: str, b: str) -> bool:
    """Whether key paths ``a`` and ``b`` are one the other's part (``providers.x`` and
    ``providers.x.env``): a problem at one makes one at the other a consequence, not news."""
    return a == b or b.startswith(a + ".") or a.startswith(b + ".")


def provider_problems(providers: dict[str, Any]) -> list[str]:
    """``providers.<id>.command: required …`` for each ACP entry with no command (a preset's
    entries got theirs from the preset), with the preset it was probably meant to be.

    Args:
        providers: ``providers`` as validated (:class:`ProviderConfig` entries) or as loaded
            (mappings; other shapes are validation's to report).
    """
    from compat.acp.presets import PRESETS

    problems = []
    for provider_id, entry in providers.items():
        if isinstance(entry, ProviderConfig):
            kind, command = entry.type, entry.command
        elif isinstance(entry, dict) or entry is None:
            kind, command = (entry or {}).get("type", "acp"), (entry or {}).get("command")
        else:
            continue
        if kind == "acp" and not command:
            if provider_id in PRESETS:
                problems.append(f"providers.{provider_id}.command: required (it is given as null)")
                continue
            import difflib  # only on this error path

            close = difflib.get_close_matches(provider_id, list(PRESETS), n=1, cutoff=0.75)
            guess = f"; did you mean the preset {close[0]}?" if close else f"; the presets are {', '.join(PRESETS)}"
            if provider_id == "knowledge":  # a knowledge provider is a type, not an agent command
                guess = "; a knowledge provider is written {type: knowledge}"
            problems.append(f"providers.{provider_id}.command: required (the provider is not a preset{guess})")
    return problems


_ENV_KEYS = (
    ("BRIDGE_AUTH_TOKEN", "authTokens", True),
    ("ACP_ALLOWED_ORIGINS", "allowedOrigins", True),
    ("BRIDGE_HOST", "host", False),
    ("BRIDGE_PORT", "port", False),
)
"""Environment variables that override a key of the file: ``(name, key, comma-separated)``."""


def _provider_ids(data: dict[str, Any]) -> dict[str, str]:
    """``{provider id: key path}`` of every provider and profile the file names, in file order."""
    ids: dict[str, str] = {}
    for section in ("providers", "profiles"):
        entries = data.get(section)
        if isinstance(entries, dict):
            ids.update({str(k): f"{section}.{k}" for k in entries if str(k) not in ids})
    return ids


def _split_profiles(data: dict[str, Any], base: Path) -> list[str]:
    """Move exec profiles (``profiles:`` and ``providers.<id>: {type: profile}``) into
    ``data["profiles"]``, validated with the iLink key names; profiles and providers share one id
    space (with no ``providers:`` key, the preset ids are taken). Returns the problems of the
    profiles that cannot be used (those are left out, so the rest can still be checked)."""
    from compat.acp.presets import PRESETS

    reserved = () if data.get("providers") is not None else (*PRESETS, "knowledge")
    try:
        profiles, providers = parse_profiles(
            data.pop("profiles", None), data.get("providers"), profile_dir=base, reserved=reserved, expand=False
        )  # load_config expanded the environment references
        problems: list[str] = []
    except ProfileConfigError as exc:
        profiles, providers, problems = exc.found, exc.rest, str(exc).splitlines()
    if providers is not None:
        data["providers"] = providers
    data["profiles"] = profiles
    return problems
