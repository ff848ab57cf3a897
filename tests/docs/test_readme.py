"""The README's promises: its prerequisites are listed, its configuration example loads (and
keeps the knowledge provider), and it runs the CLI one way throughout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bridge.config import load_config
from bridge.wiring import provider_configs

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_the_readme_lists_what_a_new_machine_needs() -> None:
    section = README.split("## Prerequisites", 1)[1].split("\n## ", 1)[0]
    for needed in ("Python 3.11", "venv", "make", "Node.js 20", "npm"):
        assert needed in section


def test_the_readme_configuration_example_loads_and_keeps_knowledge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_BRIDGE_TOKEN", "t" * 16)
    monkeypatch.setenv("GEMINI_API_KEY", "g" * 16)
    example = README.split("## Configuration", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "xworkmate-bridge.yaml"
    path.write_text(example)
    entries, enabled = provider_configs(load_config(str(path)))
    assert "knowledge" in enabled and {"codex", "gemini", "mine"} <= set(entries)


def test_the_readme_runs_the_cli_one_way() -> None:
    runs = re.findall(r"(\S*)xworkmate-bridge (serve|chat|call|providers|acp-stdio)\b", README)
    assert runs and {prefix.strip("`(") for prefix, _ in runs} <= {".venv/bin/", "/path/to/xworkmate-bridge/.venv/bin/"}
