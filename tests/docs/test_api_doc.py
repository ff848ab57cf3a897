"""docs/api.md stays true: its JSON examples parse and match the models, its tables match the code."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
import yaml

from bridge.config import BridgeConfig
from bridge.methods import METHODS
from bridge.rpc.codec import loads
from bridge.rpc.errors import RPC_ERRORS, TURN_ERROR_CODES
from compat.knowledge.params import KnowledgeTurnParams, ReadParams
from compat.knowledge.settings import KnowledgeSettings, SourceDescriptor
from compat.settings import convert
from orchestrator import models

DOC = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text(encoding="utf-8")
EXAMPLE = re.compile(r"<!-- example: (?P<name>[\w-]+) -->\n```(?P<lang>json|yaml)\n(?P<body>.*?)```", re.S)
EXAMPLES = {m["name"]: (m["lang"], m["body"]) for m in EXAMPLE.finditer(DOC)}
MODELS = {
    "capabilities-result": models.CapabilitiesResult,
    "resolve-params": models.ResolveParams,
    "resolve-result": models.ResolveResult,
    "turn-params": models.TurnParams,
    "turn-result": models.TurnResult,
    "turn-result-failed": models.TurnResult,
    "session-ref": models.SessionRef,
    "permission-params": models.PermissionParams,
    "gateway-params": models.GatewayParams,
    "update-done": models.SessionUpdate,
    "knowledge-turn-params": KnowledgeTurnParams,
    "knowledge-read-params": ReadParams,
}


def table(name: str) -> list[list[str]]:
    block = DOC.split(f"<!-- table: {name} -->\n", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("|")][2:]
    return [[cell.strip().strip("`") for cell in row.strip("|").split("|")] for row in rows]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_json_examples_match_the_models(name):
    lang, body = EXAMPLES[name]
    MODELS[name].model_validate(orjson.loads(body))


def test_every_json_block_in_the_doc_parses():
    blocks = re.findall(r"```json\n(.*?)```", DOC, re.S)
    assert len(blocks) >= len(MODELS)
    for block in blocks:
        loads(block)


def test_config_example_is_a_valid_configuration(monkeypatch):
    for var in ("MY_BRIDGE_TOKEN", "GEMINI_API_KEY", "MY_API_KEY"):
        monkeypatch.setenv(var, "x" * 8)
    from bridge.config import _expand

    convert(_expand(yaml.safe_load(EXAMPLES["config"][1]), ""), BridgeConfig)


def test_knowledge_config_example_is_valid():
    data = yaml.safe_load(EXAMPLES["knowledge-config"][1])
    convert(data["knowledge"], KnowledgeSettings)
    for source in data["knowledgeSources"]:
        convert(source, SourceDescriptor)


def test_profiles_config_example_loads(tmp_path, monkeypatch):
    from bridge.config import load_config

    monkeypatch.setenv("ANTHROPIC_API_KEY", "x" * 8)
    for name in ("hello.py", "mine.sh"):
        (tmp_path / name).write_text("echo hi\n")
    path = tmp_path / "bridge.yaml"
    path.write_text(EXAMPLES["profiles-config"][1].replace("command: hermes", "command: bash"))
    config = load_config(str(path))
    assert set(config.profiles) == {"hello", "hermes-oneshot", "claude-print", "mine"}


def test_rpc_error_table_matches_the_code():
    documented = {(int(code), name) for code, name, _ in table("rpc-errors")}
    assert documented == {(cls.code, cls.name) for cls in RPC_ERRORS}


def test_turn_error_table_matches_the_code():
    assert [row[0] for row in table("turn-errors")] == list(TURN_ERROR_CODES)


def test_every_method_is_documented():
    for method in METHODS:
        assert f"### {method}" in DOC or f"`{method}`" in DOC
