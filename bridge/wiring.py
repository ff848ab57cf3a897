"""The one place where concrete adapters are chosen: configuration → registry → orchestrator.

With no ``providers`` key, every preset whose command is found (on PATH or in the ``make agents``
cache) is enabled; the rest stay listed as unavailable. A configured entry named like a preset
inherits the preset's command, args and label.
"""

from __future__ import annotations

from typing import Any

from bridge import CONTRACT_VERSION, __version__
from bridge.config import BridgeConfig, ConfigError
from bridge.methods import METHODS
from bridge.rpc.redact import register_secret
from compat.base import ProviderAdapter
from compat.settings import ProviderConfig
from orchestrator.registry import ProviderRegistry
from orchestrator.service import Orchestrator


def provider_configs(config: BridgeConfig) -> tuple[dict[str, ProviderConfig], set[str]]:
    """The effective provider entries and the ids that are enabled."""
    from compat.presets import PRESETS

    if config.providers is None:
        return dict(PRESETS), set(PRESETS)
    entries: dict[str, ProviderConfig] = {}
    for provider_id, entry in config.providers.items():
        preset = PRESETS.get(provider_id)
        if preset is not None:
            explicit = entry.model_dump(exclude_unset=True)
            entry = preset.model_copy(update=explicit)
        elif entry.type == "acp" and not entry.command:
            raise ConfigError(f"providers.{provider_id}.command: required for a provider that is not a preset")
        entries[provider_id] = entry
    return entries, {i for i, e in entries.items() if e.enabled}


def build_adapter(provider_id: str, entry: ProviderConfig, config: BridgeConfig) -> ProviderAdapter:
    if entry.type == "acp":
        from compat.acp import AcpAdapter

        return AcpAdapter(provider_id, entry, config.limits, config.timeouts)
    raise ConfigError(f"providers.{provider_id}.type: '{entry.type}' providers are not supported by this build yet")


def build_orchestrator(config: BridgeConfig) -> Orchestrator:
    """Everything the transports need behind the method table; use it with ``async with``."""
    for named in config.auth_tokens:
        register_secret(named.token)
    entries, enabled = provider_configs(config)
    adapters: dict[str, ProviderAdapter] = {}
    for provider_id, entry in entries.items():
        adapters[provider_id] = build_adapter(provider_id, entry, config)
    registry = ProviderRegistry(adapters, enabled, config.timeouts.probe_interval)
    info: dict[str, Any] = {"name": "xworkmate-bridge", "version": __version__, "contractVersion": CONTRACT_VERSION}
    return Orchestrator(
        registry, config.roots(), config.limits, config.timeouts,
        gateway_configured=bool(config.gateway), bridge_info=info, methods=list(METHODS),
    )  # fmt: skip
