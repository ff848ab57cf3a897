"""The one place where concrete adapters are chosen: configuration → registry → orchestrator.

With no ``providers`` key, every preset whose command is found (on PATH or in the ``make agents``
cache) is enabled; the rest stay listed as unavailable. A configured entry named like a preset
inherits the preset's command, args, label and modelFlag where it leaves them out
(bridge.config.load_config, compat.acp.presets.with_preset).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

from bridge import CONTRACT_VERSION, __version__
from bridge.auth import is_loopback
from bridge.config import BridgeConfig, ConfigError, provider_problems
from bridge.logs import keep_recent
from bridge.methods import METHOD_NAMES
from bridge.rpc.redact import register_secret
from compat.acp.capacity import AgentCapacity
from compat.base import ProviderAdapter
from compat.knowledge.registry import KnowledgeRegistry
from compat.knowledge.service import KnowledgeService
from compat.llm.gate import Gate
from compat.llm.service import LlmService
from compat.llm.settings import KNOWLEDGE_RUNTIME_ID
from compat.process.descendants import reap_orphans_forever
from compat.profile.adapter import ProfileAdapter
from compat.settings import ProviderConfig
from compat.telemetry import METRICS
from orchestrator.registry import ProviderRegistry
from orchestrator.service import Orchestrator
from orchestrator.store import Retention, SqliteStore

KNOWLEDGE_ID = "knowledge"  # the embedded knowledge provider's id


def provider_configs(config: BridgeConfig) -> tuple[dict[str, ProviderConfig], set[str]]:
    """The effective provider entries and the ids that are enabled.

    With no ``providers`` key: every ACP preset; with one, the entries it lists. Either way the
    embedded ``knowledge`` provider is added (all knowledge sources, no server or key needed)
    unless the id ``knowledge`` is taken by an entry or a profile, or ``knowledge.enabled`` is
    false, which also leaves every ``type: knowledge`` entry listed but disabled.
    """
    from compat.acp.presets import PRESETS

    if config.only is not None:
        return _only(config)
    if config.providers is None:
        entries: dict[str, ProviderConfig] = dict(PRESETS)
        enabled = set(entries)
    else:
        if problems := provider_problems(config.providers):  # load_config reports them; a config built in code too
            raise ConfigError("\n".join(problems))
        entries = {}
        for provider_id, entry in config.providers.items():
            assert entry is not None  # BridgeConfig.__post_init__
            entries[provider_id] = entry
        enabled = {i for i, e in entries.items() if e.enabled}
    if not config.knowledge.enabled:
        return entries, {i for i in enabled if entries[i].type != "knowledge"}
    if KNOWLEDGE_ID not in entries and KNOWLEDGE_ID not in config.profiles:
        entries[KNOWLEDGE_ID] = ProviderConfig(type="knowledge", label="Knowledge")
        enabled.add(KNOWLEDGE_ID)
    return entries, enabled


def _only(config: BridgeConfig) -> tuple[dict[str, ProviderConfig], set[str]]:
    """``provider_configs`` for ``serve --only``: the one entry (enabled), or none when the one
    provider is a profile or the gateway."""
    from compat.acp.presets import PRESETS

    only = config.only
    assert only is not None
    configured = config.providers if config.providers is not None else PRESETS
    entry = configured.get(only) or PRESETS.get(only)
    if entry is None and only == KNOWLEDGE_ID and only not in config.profiles:
        entry = ProviderConfig(type="knowledge", label="Knowledge")
    if entry is None:
        return {}, set()
    return {only: entry}, {only}


def build_adapter(
    provider_id: str,
    entry: ProviderConfig,
    config: BridgeConfig,
    knowledge: KnowledgeService,
    capacity: AgentCapacity | None = None,
) -> ProviderAdapter:
    """The adapter of one ``providers`` entry; ACP agents share ``capacity`` (``maxLiveAgents``)."""
    if entry.type == "acp":
        from compat.acp.adapter import AcpAdapter

        return AcpAdapter(
            provider_id, entry, config.limits, config.timeouts, client_version=__version__, capacity=capacity
        )
    if entry.type == "knowledge":
        from compat.knowledge.adapter import KnowledgeAdapter

        unknown = [s for s in entry.sources or [] if s not in knowledge.descriptors]
        if unknown:
            raise ConfigError(f"providers.{provider_id}.sources: unknown knowledge source {unknown[0]!r}")
        return KnowledgeAdapter(provider_id, knowledge, label=entry.label, sources=entry.sources)
    raise ConfigError(f"providers.{provider_id}.type: '{entry.type}' providers are not supported by this build yet")


def build_knowledge(config: BridgeConfig) -> KnowledgeService:
    """The knowledge service of ``config``, with the source registry kept in ``stateDir``."""
    try:
        knowledge = KnowledgeService(config.knowledge, config.knowledge_sources, config.roots())
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    KnowledgeRegistry.attach(knowledge, config.state_path())
    return knowledge


def build_llm(config: BridgeConfig, knowledge: KnowledgeService) -> LlmService:
    """The ``llm.*`` service of ``config``. The knowledge registry's runtime connection, when one
    is registered, replaces the ``llm.runtimes`` entry the knowledge runtime names (one table of
    runtimes: a connection set at run time serves ``llm.*`` with that id too)."""
    llm = LlmService(config.llm, Gate(config.principals))
    runtime_id = config.knowledge.runtime.id or KNOWLEDGE_RUNTIME_ID
    configured = config.llm.runtime(runtime_id)

    def link(connection: Any) -> None:
        if connection is None:
            llm.restore_runtime(runtime_id, configured)
        else:
            llm.set_runtime(
                runtime_id,
                base_url=connection.base_url,
                model=connection.model,
                timeout_seconds=connection.timeout_seconds,
                api_key=connection.api_key,
            )

    if knowledge.registry is not None:
        knowledge.registry.on_runtime(link)
    return llm


def build_orchestrator(config: BridgeConfig) -> Orchestrator:
    """Everything the transports need behind the method table; use it with ``async with``.

    The knowledge service is entered and left with the orchestrator (``orch.knowledge``).
    """
    for named in config.named_tokens:
        register_secret(named.token)
    if config.knowledge.runtime.api_key_env:
        register_secret(os.environ.get(config.knowledge.runtime.api_key_env))
    knowledge = build_knowledge(config)
    llm = build_llm(config, knowledge)
    entries, enabled = provider_configs(config)
    adapters: dict[str, ProviderAdapter] = {}
    capacity = AgentCapacity(config.limits.max_live_agents, config.timeouts.agent_capacity_timeout)
    for provider_id, entry in entries.items():
        adapters[provider_id] = build_adapter(provider_id, entry, config, knowledge, capacity)
    profiles = {k: v for k, v in config.profiles.items() if config.only in (None, k)}
    for profile_id, profile in profiles.items():
        adapters[profile_id] = ProfileAdapter(
            profile_id, profile, config.limits, config.timeouts, profile_dir=config.profile_dir, roots=config.roots()
        )
        enabled.add(profile_id)
    background: list[Callable[[], Coroutine[Any, Any, None]]] = [
        reap_orphans_forever
    ]  # daemons an agent left behind that exited on their own
    gateway = None
    if config.gateway is not None and config.gateway.enabled and config.only in (None, "openclaw"):
        from compat.gateway.adapter import PROVIDER_ID, GatewayAdapter
        from compat.gateway.runtimes import GatewayRuntimes

        register_secret(config.gateway.token)
        register_secret(config.gateway.password)
        adapter = GatewayAdapter(config.gateway, config.gateway_identity_path(), version=__version__)
        adapters[PROVIDER_ID] = adapter
        enabled.add(PROVIDER_ID)
        background.append(adapter.client.run)  # the connection's supervisor: idle until wanted
        gateway = GatewayRuntimes(adapter)
    registry = ProviderRegistry(adapters, enabled, config.timeouts.probe_interval)
    keep_recent()  # the log lines system.logs returns
    info: dict[str, Any] = {"name": "xworkmate-bridge", "version": __version__, "contractVersion": CONTRACT_VERSION}
    orch = Orchestrator(
        registry,
        config.roots(),
        config.limits,
        config.timeouts,
        bridge_info=info,
        methods=list(METHOD_NAMES),
        knowledge=knowledge,
        llm=llm,
        background=background,
        gateway=gateway,
        admin_principals=config.admin_principals,
        remote_root=config.remote_root(),
        remote_workspaces=remote if (remote := config.remote_workspaces) is not None else not is_loopback(config.host),
        store=build_store(config),
    )
    watch_sessions(orch)
    return orch


def watch_sessions(orch: Orchestrator) -> None:
    """The sessions gauge reads ``orch`` (weakly: a test's orchestrators come and go)."""
    ref = weakref.ref(orch)

    def loaded() -> int:
        found = ref()
        return len(found.sessions) if found is not None else 0

    def running() -> int:
        found = ref()
        return found.limits.max_running_turns - int(found.running.value) if found is not None else 0

    METRICS.sessions.set_function(loaded, "loaded")
    METRICS.sessions.set_function(running, "running")


def build_store(config: BridgeConfig) -> SqliteStore | None:
    """The session store of ``config`` (``stateDir``), or None with ``persistSessions: false``."""
    if not config.persist_sessions:
        return None
    limits = config.limits
    retention = Retention(
        max_log_updates=limits.max_log_updates,
        max_log_bytes=limits.max_log_bytes,
        max_turn_results=limits.max_turn_results,
        session_retention=config.timeouts.session_retention,
        max_bytes=limits.state_max_bytes,
    )
    return SqliteStore(config.state_path() / "sessions.db", retention)
