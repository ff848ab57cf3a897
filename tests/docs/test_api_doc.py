"""docs/api.md stays true: its JSON examples parse and match the models, its tables match the code."""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any, get_args

import msgspec
import orjson
import pytest
import yaml

from bridge.config import BridgeConfig
from bridge.methods import METHODS
from bridge.rpc.codec import loads
from bridge.rpc.errors import RPC_ERRORS, TURN_ERROR_CODES, UNAVAILABLE_CODES
from compat.knowledge.params import KnowledgeTurnParams
from compat.knowledge.settings import KnowledgeSettings, SourceDescriptor
from compat.settings import convert
from orchestrator.results import SessionUpdate

DOC = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text(encoding="utf-8")
EXAMPLE = re.compile(r"<!-- example: (?P<name>[\w-]+) -->\n```(?P<lang>json|yaml)\n(?P<body>.*?)```", re.S)
EXAMPLES = {m["name"]: (m["lang"], m["body"]) for m in EXAMPLE.finditer(DOC)}
SPEC = {spec.name: spec for spec in METHODS}
PARAMS = {  # example name -> the method whose params model it must fit
    "resolve-params": "xworkmate.routing.resolve",
    "turn-params": "session.start",
    "session-ref": "session.cancel",
    "permission-params": "session.permission",
    "gateway-params": "xworkmate.gateway.request",
    "knowledge-read-params": "knowledge.read",
    "llm-complete-params": "llm.complete",
    "llm-structured-params": "llm.completeStructured",
}
RESULTS = {  # example name -> the method whose result model it must fit
    "capabilities-result": "acp.capabilities",
    "resolve-result": "xworkmate.routing.resolve",
    "turn-result": "session.start",
    "turn-result-failed": "session.start",
    "system-logs-result": "system.logs",
    "llm-complete-result": "llm.complete",
    "llm-structured-result": "llm.completeStructured",
}


def table(name: str) -> list[list[str]]:
    block = DOC.split(f"<!-- table: {name} -->\n", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("|")][2:]
    return [[cell.strip().strip("`") for cell in row.strip("|").split("|")] for row in rows]


def fits(model: Any, data: Any) -> Any:
    """``data`` read as ``model`` (a result model, or a union of them: any arm may fit)."""
    arms = get_args(model) if isinstance(model, types.UnionType) else (model,)
    errors = []
    for arm in arms:
        try:
            return msgspec.convert(data, arm)
        except msgspec.ValidationError as exc:
            errors.append(exc)
    raise errors[0]


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_json_params_examples_match_the_registrys_params_models(name):
    params = SPEC[PARAMS[name]].params
    assert params is not None
    params.model.model_validate(orjson.loads(EXAMPLES[name][1]))


@pytest.mark.parametrize("name", sorted(RESULTS))
def test_json_result_examples_match_the_registrys_result_models(name):
    fits(SPEC[RESULTS[name]].result, orjson.loads(EXAMPLES[name][1]))


def test_the_knowledge_turn_params_and_the_update_examples_match_their_models():
    KnowledgeTurnParams.model_validate(orjson.loads(EXAMPLES["knowledge-turn-params"][1]))
    fits(SessionUpdate, orjson.loads(EXAMPLES["update-done"][1]))


def test_every_json_block_in_the_doc_parses():
    blocks = re.findall(r"```json\n(.*?)```", DOC, re.S)
    assert len(blocks) >= len(PARAMS) + len(RESULTS)
    for block in blocks:
        loads(block)


def test_config_example_is_a_valid_configuration(monkeypatch, tmp_path):
    for var in ("MY_BRIDGE_TOKEN", "GEMINI_API_KEY", "MY_API_KEY", "OPENCLAW_GATEWAY_TOKEN"):
        monkeypatch.setenv(var, "x" * 8)
    from bridge.config import load_config

    path = tmp_path / "bridge.yaml"
    path.write_text(EXAMPLES["config"][1])
    config = load_config(str(path))
    assert config.load_warnings == () and isinstance(config, BridgeConfig)


@pytest.mark.parametrize("name", ["llm-config", "principals-config"])
def test_the_llm_and_principals_examples_are_valid_configurations(name, monkeypatch):
    for variable in ("ALICE_TOKEN", "CI_TOKEN"):
        monkeypatch.setenv(variable, f"{variable.lower()}-0123456789")
    data = yaml.safe_load(EXAMPLES[name][1])
    for entry in data.get("authTokens", []):
        entry["token"] = "t-" + entry["name"] + "-0123456789"
    convert(data, BridgeConfig)


def test_gateway_config_example_is_the_defaults():
    from compat.gateway.settings import GatewaySettings

    data = yaml.safe_load(EXAMPLES["gateway-config"][1].replace("${OPENCLAW_GATEWAY_TOKEN}", "t"))
    documented = convert(data["gateway"], GatewaySettings)
    assert documented == GatewaySettings(url=documented.url, token="t")


def test_gateway_error_table_matches_the_code():
    from compat.gateway.protocol import GATEWAY_ERROR_CODES

    assert [row[0] for row in table("gateway-errors")] == list(GATEWAY_ERROR_CODES)


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
    assert [row[0] for row in table("unavailable-codes")] == list(UNAVAILABLE_CODES)


def test_the_methods_table_lists_exactly_the_registrys_methods_in_order():
    assert [row[0] for row in table("methods")] == [spec.name for spec in METHODS]


def test_the_architecture_pages_turn_table_is_the_machines():
    """docs/architecture.md shows the turn state machine's table; it must be the code's."""
    from orchestrator.machine import TRANSITIONS, Trigger, TurnState

    page = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = page.split("| state | trigger → next state |", 1)[1].split("\n\n", 1)[0]
    documented: dict[TurnState, dict[Trigger, TurnState]] = {}
    for row in block.splitlines()[2:]:
        state_cell, arrows = (cell.strip() for cell in row.strip("|").split("|"))
        row_table = documented.setdefault(TurnState[state_cell], {})
        for part in arrows.split(";"):
            if "→" not in part:
                continue  # "nothing: a turn never ends twice"
            triggers, target = part.split("→")
            target = re.sub(r"\(.*?\)", "", target).strip()
            for name in triggers.split(","):
                row_table[Trigger(name.strip())] = TurnState[target]
    assert documented == TRANSITIONS
