"""The OpenRPC document (rpc.discover, docs/openrpc.json): valid against the OpenRPC meta-schema,
generated from the registry (names, params, results, errors), and the checked-in copy current."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from jsonschema import Draft7Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from bridge.config import BridgeConfig
from bridge.methods import METHODS, openrpc_document
from bridge.openrpc import without_version
from bridge.rpc.errors import RPC_ERRORS
from compat.settings import convert
from tests.helpers import dispatcher_of as bridge
from tests.helpers import rpc as call

HERE = Path(__file__).parent / "openrpc"
ROOT = Path(__file__).resolve().parents[2]


def validator() -> Draft7Validator:
    meta = json.loads((HERE / "openrpc-meta-schema.json").read_text())
    tools = Resource(
        contents=json.loads((HERE / "json-schema-tools-meta-schema.json").read_text()), specification=DRAFT7
    )
    registry = Registry().with_resources(
        [("https://meta.json-schema.tools", tools), ("https://meta.json-schema.tools/", tools)]
    )
    return Draft7Validator(meta, registry=registry)


def test_the_document_validates_against_the_openrpc_meta_schema():
    check = validator()
    errors = [f"{list(e.absolute_path)}: {e.message[:200]}" for e in check.iter_errors(openrpc_document())]
    assert errors == []
    broken = copy.deepcopy(openrpc_document())
    broken["methods"][0]["params"] = {"not": "a list"}
    assert list(check.iter_errors(broken)), "the meta-schema check must be able to fail"


def test_the_document_is_the_registry():
    doc = openrpc_document()
    assert [m["name"] for m in doc["methods"]] == [spec.name for spec in METHODS]
    schemas = doc["components"]["schemas"]
    for method, spec in zip(doc["methods"], METHODS, strict=True):
        if spec.params is None:
            assert method["params"] == []
        else:
            fields = spec.params.model.model_fields
            expected = [f.alias or name for name, f in fields.items()]
            assert [p["name"] for p in method["params"]] == expected, spec.name
        assert [e["$ref"].rsplit("/", 1)[1] for e in method["errors"]] == [e.name for e in spec.all_errors]
        for ref in _refs(method):
            assert ref.startswith("#/components/") and ref.rsplit("/", 1)[1] in {
                **schemas,
                **doc["components"]["errors"],
            }
    assert doc["components"]["errors"] == {
        cls.name: {"code": cls.code, "message": cls.default_message, "data": {"code": cls.name}} for cls in RPC_ERRORS
    }
    llm = next(m for m in doc["methods"] if m["name"] == "llm.completeStructured")
    assert {p["name"]: p["required"] for p in llm["params"]}["instructions"] is True
    assert "LlmResult" in schemas and "SessionUpdate" in schemas
    assert [n["name"] for n in doc["x-notifications"]] == [
        "session.update",
        "xworkmate.gateway.snapshot",
        "xworkmate.gateway.log",
        "xworkmate.gateway.push",
    ]
    assert "$defs" not in json.dumps(doc) and "prefixItems" not in json.dumps(doc)


def _refs(value):
    if isinstance(value, dict):
        if isinstance(value.get("$ref"), str):
            yield value["$ref"]
        for v in value.values():
            yield from _refs(v)
    elif isinstance(value, list):
        for v in value:
            yield from _refs(v)


def test_docs_openrpc_json_is_current():
    checked_in = json.loads((ROOT / "docs" / "openrpc.json").read_text())
    assert checked_in == without_version(openrpc_document()), "regenerate: xworkmate-bridge openrpc > docs/openrpc.json"


async def test_rpc_discover_answers_the_document(tmp_path):
    config = convert({"stateDir": str(tmp_path / "state")}, BridgeConfig)
    async with bridge(config) as rpc:
        result = await call(rpc, "rpc.discover", {})
    assert result["openrpc"] == "1.3.2" and [m["name"] for m in result["methods"]] == [s.name for s in METHODS]


@pytest.mark.timeout(60)
async def test_rpc_discover_needs_the_token(tmp_path):
    from bridge.cli import build_app
    from bridge.client import call as http_call
    from tests.helpers import real_server

    config = convert({"stateDir": str(tmp_path / "state"), "authTokens": ["discover-token-0123456789"]}, BridgeConfig)
    async with real_server(config, build_app(config)) as port:
        refused = await http_call(f"http://127.0.0.1:{port}", "rpc.discover", {}, timeout=20)
        allowed = await http_call(
            f"http://127.0.0.1:{port}", "rpc.discover", {}, token="discover-token-0123456789", timeout=20
        )
    assert refused["error"]["code"] == -32001
    assert allowed["result"]["info"]["title"] == "xworkmate-bridge"
