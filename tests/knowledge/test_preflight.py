"""Everything that rejects a knowledge turn before it starts: -32602 from ``preflight``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bridge.rpc.errors import InvalidParams
from compat.knowledge.adapter import KnowledgeAdapter
from compat.knowledge.errors import RetrievalModeUnsupported
from compat.knowledge.settings import RequestSourcesPolicy, SourceDescriptor
from tests.knowledge.helpers import make_service, run, wiki_descriptor
from tests.knowledge.servers import SlowSources, ThreadedServer

pytestmark = pytest.mark.timeout(30)
VECTOR = {"schemaVersion": "llmwiki.retrieval.v1", "searchMode": "vector", "fallback": "none"}


async def preflight(params: dict[str, Any], **service_args: Any) -> None:
    async with make_service(**service_args) as service:
        await KnowledgeAdapter("knowledge", service).preflight(params)


async def rejected(params: dict[str, Any], **service_args: Any) -> dict[str, Any]:
    with pytest.raises(InvalidParams) as caught:
        await preflight(params, **service_args)
    error = caught.value.to_error()
    assert error["code"] == -32602
    return error["data"]


async def test_an_unknown_orchestration_mode_is_invalid_params() -> None:
    data = await rejected({"orchestrationMode": "creative"})
    assert data["code"] == "INVALID_PARAMS" and data["errors"][0]["loc"] == "orchestrationMode"


async def test_the_apps_own_mode_param_is_ignored() -> None:
    await preflight({"mode": "craft", "provider": "x"})


async def test_delegated_mode_needs_a_configured_runtime() -> None:
    data = await rejected({"orchestrationMode": "delegated-runtime"})
    assert data["reason"] == "RUNTIME_NOT_CONFIGURED"


@pytest.mark.parametrize(
    "retrieval",
    [
        {"schemaVersion": "v0"},
        {"schemaVersion": "llmwiki.retrieval.v1", "embeddingModel": "x"},
        {"schemaVersion": "llmwiki.retrieval.v1", "search": {"limit": 51}},
        {"schemaVersion": "llmwiki.retrieval.v1", "search": {"queryVariants": ["a", "b", "c"]}},
    ],
)
async def test_a_malformed_retrieval_intent_is_invalid_params(retrieval: dict[str, Any]) -> None:
    data = await rejected({"retrieval": retrieval})
    assert data["errors"][0]["loc"].startswith("retrieval")


async def test_query_variants_with_a_non_lexical_mode_are_rejected() -> None:
    data = await rejected(
        {
            "retrieval": {
                "schemaVersion": "llmwiki.retrieval.v1",
                "searchMode": "literal",
                "search": {"queryVariants": ["chargeback"]},
            }
        }
    )
    assert data["code"] == "RETRIEVAL_MODE_UNSUPPORTED" and data["field"] == "retrieval.search.queryVariants"


async def test_fallback_none_rejects_an_unsupported_mode_before_any_query() -> None:
    fake = SlowSources()
    with ThreadedServer(fake.app()) as server:
        remote = SourceDescriptor(id="remote", protocol="llmwiki-http", url=f"{server.url}/remote")
        with pytest.raises(RetrievalModeUnsupported) as caught:
            await preflight({"retrieval": VECTOR}, sources=[wiki_descriptor(), remote])
        async with make_service([wiki_descriptor(), remote]) as service:
            outcome, sink = await run(service, "refunds", retrieval=VECTOR)
    data = caught.value.to_error()["data"]
    assert data["code"] == "RETRIEVAL_MODE_UNSUPPORTED"
    assert data["sources"] == [
        {"id": "acme", "protocol": "local-wiki", "missingCapability": "llmwiki_search_mode_vector"},
        {"id": "remote", "protocol": "llmwiki-http", "missingCapability": "llmwiki_retrieval_v1"},
    ]
    assert not any("/query" in call for call in fake.calls)
    assert outcome.error.code == "RETRIEVAL_MODE_UNSUPPORTED" and sink.events == []


async def test_fallback_lexical_sends_the_plain_request_and_records_a_diagnostic() -> None:
    retrieval = {**VECTOR, "fallback": "lexical"}
    async with make_service() as service:
        outcome, _ = await run(service, "refunds over 500 USD", retrieval=retrieval)
    artifact = outcome.artifacts[0]
    [diagnostic] = artifact["diagnostics"]
    assert outcome.status == "completed" and diagnostic["phase"] == "retrieval" and diagnostic["severity"] == "warning"
    obs = {o["name"]: o["value"] for o in diagnostic["observations"]}
    assert obs == {
        **obs,
        "requestedMode": "vector",
        "appliedMode": "lexical",
        "capabilityMetadataSource": "fresh",
        "capabilityStatus": "missing_search_mode",
        "missingCapability": "llmwiki_search_mode_vector",
    }
    assert artifact["steps"][1]["diagnostic"] == diagnostic and artifact["citations"]


async def test_request_sources_are_refused_unless_the_operator_enabled_them() -> None:
    data = await rejected({"knowledgeSources": [{"id": "x", "protocol": "llmwiki-http", "url": "http://127.0.0.1:1"}]})
    assert data["reason"] == "REQUEST_SOURCES_DISABLED"
    await preflight({"knowledgeSources": []})  # explicitly no source is always allowed


POLICY = RequestSourcesPolicy(
    enabled=True, protocols=("llmwiki-http", "local-wiki"), allowed_origins=("http://127.0.0.1:*",)
)


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ({"id": "a", "protocol": "llmwiki-http", "url": "http://u:p@127.0.0.1:9"}, "SOURCE_URL_CREDENTIALS"),
        ({"id": "a", "protocol": "llmwiki-http", "url": "http://10.0.0.8:9"}, "SOURCE_ORIGIN_NOT_ALLOWED"),
        ({"id": "a", "protocol": "llmwiki-http", "url": "ftp://127.0.0.1:9"}, "SOURCE_URL_INVALID"),
        ({"id": "a", "protocol": "llmwiki-http", "url": "/relative"}, "SOURCE_URL_INVALID"),
        ({"id": "a", "protocol": "mcp", "url": "http://127.0.0.1:9/mcp"}, "PROTOCOL_NOT_ALLOWED"),
        ({"id": "a", "protocol": "local-wiki", "root": "/etc"}, "SOURCE_ROOT_NOT_ALLOWED"),
    ],
)
async def test_a_disallowed_request_source_is_invalid_params(source: dict[str, Any], reason: str) -> None:
    data = await rejected({"knowledgeSources": [source]}, request_sources=POLICY)
    assert data["reason"] == reason and data["field"].startswith("knowledgeSources.0")


async def test_a_malformed_request_source_is_invalid_params_naming_the_field() -> None:
    data = await rejected({"knowledgeSources": [{"id": "a", "protocol": "llmwiki-http"}]}, request_sources=POLICY)
    assert data["errors"] == [
        {"loc": "knowledgeSources.0.url", "type": "value_error", "msg": "a llmwiki-http source needs url"}
    ]
    data = await rejected(
        {"knowledgeSources": [{"id": "a", "protocol": "mcp", "url": "http://x", "token": "t"}]}, request_sources=POLICY
    )
    assert data["errors"] == [{"loc": "knowledgeSources.0.token", "type": "extra_forbidden", "msg": "unknown key"}]
    data = await rejected({"knowledgeSources": [{"id": "a", "url": "http://x"}]}, request_sources=POLICY)
    assert data["errors"] == [{"loc": "knowledgeSources.0.protocol", "type": "missing", "msg": "missing required key"}]


async def test_duplicate_request_source_ids_are_invalid_params(tmp_path: Path) -> None:
    sources = [
        {"id": "a", "protocol": "llmwiki-http", "url": "http://127.0.0.1:9"},
        {"id": "a", "protocol": "llmwiki-http", "url": "http://127.0.0.1:10"},
    ]
    data = await rejected({"knowledgeSources": sources}, request_sources=POLICY)
    assert data["reason"] == "DUPLICATE_SOURCE_ID" and data["field"] == "knowledgeSources.1.id"


async def test_a_request_local_wiki_inside_the_workspace_answers(wiki_copy: Path) -> None:
    source = {"id": "mine", "protocol": "local-wiki", "root": str(wiki_copy)}
    async with make_service(request_sources=POLICY) as service:
        outcome, _ = await run(service, "How fast must we respond to a chargeback?", knowledgeSources=[source])
    assert outcome.artifacts[0]["citations"][0]["id"] == "mine:ops/billing/chargebacks"


def test_configured_sources_must_have_unique_ids() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        make_service([wiki_descriptor(), wiki_descriptor()])
