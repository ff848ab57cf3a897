"""The embedded ``knowledge`` provider stays available when a file lists its own providers, and
goes only when ``knowledge: {enabled: false}`` says so (bridge.wiring.provider_configs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config import ConfigError, load_config
from bridge.wiring import provider_configs


def configs(tmp_path: Path, text: str):
    path = tmp_path / "bridge.yaml"
    path.write_text(text)
    return provider_configs(load_config(str(path)))


def test_the_knowledge_provider_is_kept_beside_a_providers_list_that_does_not_name_it(tmp_path: Path) -> None:
    entries, enabled = configs(tmp_path, "providers:\n  codex: {}\n")
    assert entries["knowledge"].type == "knowledge" and enabled == {"codex", "knowledge"}


def test_knowledge_enabled_false_removes_it_with_or_without_a_providers_list(tmp_path: Path) -> None:
    entries, enabled = configs(tmp_path, "knowledge: {enabled: false}\n")
    assert "knowledge" not in entries and "knowledge" not in enabled and "codex" in enabled
    entries, enabled = configs(tmp_path, "knowledge: {enabled: false}\nproviders:\n  codex: {}\n")
    assert set(entries) == {"codex"} and enabled == {"codex"}


def test_knowledge_enabled_false_leaves_listed_knowledge_providers_disabled(tmp_path: Path) -> None:
    text = "knowledge: {enabled: false}\nproviders:\n  codex: {}\n  team: {type: knowledge}\n"
    entries, enabled = configs(tmp_path, text)
    assert "team" in entries and enabled == {"codex"}


def test_an_entry_or_profile_that_takes_the_id_knowledge_is_not_replaced(tmp_path: Path) -> None:
    entries, enabled = configs(tmp_path, "providers:\n  knowledge: {type: knowledge, label: Docs}\n")
    assert entries["knowledge"].label == "Docs" and enabled == {"knowledge"}
    script = tmp_path / "k.sh"
    script.write_text("echo hi\n")
    entries, _ = configs(tmp_path, "providers:\n  codex: {}\nprofiles:\n  knowledge: {script: ./k.sh}\n")
    assert "knowledge" not in entries  # the profile keeps the id


def test_a_misspelt_enabled_key_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"knowledge\.enable: unknown key \(did you mean enabled\?\)"):
        configs(tmp_path, "knowledge: {enable: false}\n")
