"""``GET /metrics``: counters and histogram counts move with a scripted set of requests and
turns, no label carries a prompt or a token, and only administrators may read it."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.cli import build_app
from bridge.client import call
from bridge.config import BridgeConfig
from compat.settings import convert
from tests.fakes.fake_llm import FakeLLM
from tests.helpers import real_server

pytestmark = pytest.mark.timeout(90)
ADMIN = "admin-token-0123456789abcdef"
USER = "user-token-0123456789abcdef"
PROMPT = "how do I set an auth token? zebra-quartz-marker"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(scrape, name: str, **labels: str) -> float:
    return scrape.get((name, tuple(sorted(labels.items()))), 0.0)


async def scrape(url: str, token: str | None = ADMIN) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient() as client:
        return await client.get(f"{url}/metrics", headers=headers, timeout=20)


async def test_metrics_move_with_requests_and_turns_and_carry_no_secret(tmp_path):
    with FakeLLM(reply="a short summary") as llm:
        raw = {
            "stateDir": str(tmp_path / "state"),
            "authTokens": [{"name": "ops", "token": ADMIN}, {"name": "alice", "token": USER}],
            "adminPrincipals": ["ops"],
            "llm": {"runtimes": [{"id": "main", "baseUrl": f"{llm.base_url}/v1", "model": "mock-model"}]},
        }
        config = convert(raw, BridgeConfig)
        async with real_server(config, build_app(config)) as port:
            url = f"http://127.0.0.1:{port}"
            before = samples((await scrape(url)).text)
            routing = {"routingMode": "explicit", "explicitExecutionTarget": "agent", "explicitProviderId": "knowledge"}
            turn = await call(
                url, "session.start", {"sessionId": "m-1", "taskPrompt": PROMPT, "routing": routing}, token=USER
            )
            assert turn["result"]["success"] is True
            bad = await call(url, "session.cancel", {}, token=USER)
            assert bad["error"]["code"] == -32602
            model = await call(url, "llm.complete", {"messages": [{"role": "user", "content": PROMPT}]}, token=USER)
            assert model["result"]["text"] == "a short summary"
            response = await scrape(url)
            refused = await scrape(url, USER)
            anonymous = await scrape(url, None)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    after = samples(response.text)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("xworkmate_requests_total", method="session.start", outcome="ok") == 1
    assert moved("xworkmate_requests_total", method="session.cancel", outcome="INVALID_PARAMS") == 1
    assert moved("xworkmate_requests_total", method="llm.complete", outcome="ok") == 1
    assert moved("xworkmate_request_duration_seconds_count", method="session.start") == 1
    assert moved("xworkmate_turns_total", provider="knowledge", status="completed") == 1
    assert moved("xworkmate_turn_duration_seconds_count", provider="knowledge") == 1
    assert moved("xworkmate_turn_first_delta_seconds_count", provider="knowledge") == 1
    assert moved("xworkmate_knowledge_source_calls_total", source_type="local-wiki", outcome="ok") == 1
    assert moved("xworkmate_model_calls_total", runtime="main", outcome="ok") == 1
    assert moved("xworkmate_model_tokens_total", runtime="main", direction="output") >= 1
    assert moved("xworkmate_updates_sent_total") >= 2
    assert value(after, "xworkmate_sessions", state="loaded") >= 1
    assert value(after, "xworkmate_connections", transport="http") >= 1  # the scrape itself
    assert value(after, "process_resident_memory_bytes") > 0
    for secret in (PROMPT, "zebra", ADMIN, USER, "alice", "ops", str(tmp_path)):
        assert secret not in response.text
    assert refused.status_code == 403 and refused.json()["error"]["data"]["reason"] == "ADMIN_REQUIRED"
    assert anonymous.status_code == 401


async def test_metrics_public_needs_no_token(tmp_path):
    config = convert({"stateDir": str(tmp_path / "s"), "authTokens": [ADMIN], "metricsPublic": True}, BridgeConfig)
    async with real_server(config, build_app(config)) as port:
        response = await scrape(f"http://127.0.0.1:{port}", None)
    assert response.status_code == 200 and "xworkmate_requests_total" in response.text


def test_label_values_are_bounded():
    from compat.telemetry import MAX_SERIES, Counter

    counter = Counter("x_total", "x", ("method",))
    for index in range(MAX_SERIES + 50):
        counter.inc(f"m{index}")
    assert len(counter.values) == MAX_SERIES + 1 and counter.value("other") == 50
