"""Preset provider entries for the known ACP agents.

Launch commands come from acp-and-real-agents.md §0 and §4; where the commands are found:
``compat.process.commands``.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from compat.settings import ProviderConfig, snake_case

PRESETS: Mapping[str, ProviderConfig] = {
    "codex": ProviderConfig(command="codex-acp", args=[], label="Codex"),
    "opencode": ProviderConfig(command="opencode", args=["acp"], label="OpenCode"),
    "gemini": ProviderConfig(command="gemini", args=["--acp"], label="Gemini", model_flag="-m"),
    "hermes": ProviderConfig(command="hermes", args=["acp"], label="Hermes"),
    "claude": ProviderConfig(command="claude-agent-acp", args=[], label="Claude"),
}

PRESET_KEYS = ("command", "args", "label", "modelFlag")
"""The keys a preset fills in a ``providers.<id>`` entry of the same id that leaves them out."""


def with_preset(provider_id: str, raw: Mapping[str, Any] | None) -> Any:
    """A raw (YAML-loaded) ``providers.<id>`` entry with the keys of :data:`PRESET_KEYS` it
    leaves out taken from the preset of the same id; a key given as ``null`` stays null (so
    ``modelFlag: null`` turns the preset's off). Other ids, and entries that are not mappings
    (reported by validation), are returned unchanged."""
    preset = PRESETS.get(provider_id)
    if preset is None or not isinstance(raw, Mapping | None):
        return raw
    entry = dict(raw or {})
    for key in PRESET_KEYS:
        snake = snake_case(key)
        if key not in entry and snake not in entry:
            entry[key] = msgspec.to_builtins(getattr(preset, snake))
    return entry
