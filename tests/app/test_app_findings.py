"""The desktop app's real uses that broke (issue 20), each against the whole bridge with the fake
ACP agent as the provider."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.test_app_integration import make_app, start

pytestmark = pytest.mark.timeout(60)


def rpc(client: TestClient, method: str, params: dict[str, Any] | None = None, **headers: str) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
    response = client.post("/acp/rpc", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


# ---- 1. an unreachable gateway fails its own turns, once each, and stops no other turn -----------


def test_an_unreachable_gateway_fails_each_gateway_turn_once_and_stops_no_other(tmp_path: Path) -> None:
    gateway = {"url": "ws://127.0.0.1:1", "token": "t0k3n-for-tests", "connectTimeout": 1}
    with TestClient(make_app(tmp_path, gateway=gateway)) as client:
        caps = rpc(client, "acp.capabilities")["result"]
        assert caps["availableExecutionTargets"] == ["agent", "gateway"]
        routing = {"routingMode": "explicit", "explicitExecutionTarget": "gateway"}
        for _ in range(2):
            turn = client.post("/acp/rpc", json=start("g1", routing=routing)).json()["result"]
            assert turn["status"] == "failed" and turn["error"]["code"] == "GATEWAY_UNAVAILABLE"
            assert "cannot reach ws://127.0.0.1:1" in turn["error"]["message"]
        later = client.post("/acp/rpc", json=start("s2")).json()["result"]
    assert later["status"] == "completed"


# ---- 5. provider ids in the app's normalised form ------------------------------------------------


def test_ids_are_resolved_in_the_form_the_app_sends_them_back(tmp_path: Path) -> None:
    with TestClient(_app_with_provider(tmp_path, "My_Agent")) as client:
        routing = {"routingMode": "explicit", "explicitExecutionTarget": "agent", "explicitProviderId": "my-agent"}
        resolved = rpc(client, "xworkmate.routing.resolve", {"taskPrompt": "hi", "routing": routing})["result"]
        assert resolved["resolvedProviderId"] == "My_Agent" and resolved["unavailable"] is False
        turn = client.post("/acp/rpc", json=start("s1", routing=routing)).json()["result"]
    assert turn["status"] == "completed" and turn["resolvedProviderId"] == "My_Agent"


def _app_with_provider(tmp_path: Path, provider_id: str) -> Any:
    from bridge.cli import build_app
    from bridge.config import BridgeConfig
    from compat.settings import convert
    from tests.test_app_integration import config_dict

    data = config_dict(tmp_path)
    data["providers"] = {provider_id: data["providers"]["fake"]}
    return build_app(convert(data, BridgeConfig))


@pytest.mark.parametrize(
    "ids,message",
    [
        (["my_agent", "My-Agent"], "providers.My-Agent: the id 'My-Agent' is the same as 'my_agent' once normalised"),
        (["__"], "providers.__: the id '__' has no letter or digit"),
    ],
)
def test_ids_that_collide_or_vanish_once_normalised_are_refused_at_load(tmp_path: Path, ids, message) -> None:
    import sys

    from bridge.config import ConfigError, load_config

    entries = "".join(f"  {i!r}: {{command: {sys.executable!r}}}\n" for i in ids)
    path = tmp_path / "cfg.yaml"
    path.write_text(f"providers:\n{entries}")
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert message in str(err.value)


# ---- 6. the provider the user picked ---------------------------------------------------------------


def test_the_top_level_provider_is_a_preference_when_routing_names_none(tmp_path: Path) -> None:
    data_app = _app_with_two(tmp_path)
    with TestClient(data_app) as client:
        picked = client.post("/acp/rpc", json=start("s1", provider="second")).json()["result"]
        older = client.post("/acp/rpc", json=start("s2", gatewayProviderId="second")).json()["result"]
        gone = client.post("/acp/rpc", json=start("s3", provider="absent")).json()["result"]
        explicit = {"routingMode": "explicit", "explicitExecutionTarget": "agent", "explicitProviderId": "first"}
        chosen = client.post("/acp/rpc", json=start("s4", provider="second", routing=explicit)).json()["result"]
    assert picked["resolvedProviderId"] == "second" and picked["preferredProviderUnavailable"] is False
    assert older["resolvedProviderId"] == "second"
    assert gone["status"] == "completed" and gone["resolvedProviderId"] == "first"
    assert gone["preferredProviderId"] == "absent" and gone["preferredProviderUnavailable"] is True
    assert "unknown provider: absent" in gone["preferredProviderMessage"]
    assert "auto routing chose first" in gone["preferredProviderMessage"]
    assert chosen["resolvedProviderId"] == "first"  # an explicit choice wins over the preference


def _app_with_two(tmp_path: Path) -> Any:
    from bridge.cli import build_app
    from bridge.config import BridgeConfig
    from compat.settings import convert
    from tests.test_app_integration import config_dict

    data = config_dict(tmp_path)
    fake = data["providers"]["fake"]
    data["providers"] = {"first": fake, "second": {**fake, "label": "Second"}}
    return build_app(convert(data, BridgeConfig))


# ---- 7. the log panel ------------------------------------------------------------------------------


def test_system_logs_answers_the_panel_with_recent_redacted_lines_for_admins_only(tmp_path: Path) -> None:
    import logging

    from bridge.rpc.redact import register_secret

    tokens = [{"name": "ops", "token": "ops-token-123456"}, {"name": "guest", "token": "guest-token-123456"}]
    with TestClient(make_app(tmp_path, authTokens=tokens, adminPrincipals=["ops"])) as client:
        register_secret("sk-panel-secret-0123456789")
        logging.getLogger("xworkmate_bridge").warning("panel check sk-panel-secret-0123456789 done")
        ops = rpc(client, "system.logs", {}, Authorization="Bearer ops-token-123456")["result"]
        guest = rpc(client, "system.logs", {}, Authorization="Bearer guest-token-123456")["result"]
    assert ops["bridgeStatus"] == "ok" and ops["gatewayStatus"] == "unknown"
    line = next(x for x in ops["bridgeLogs"] if "panel check" in x)
    assert "sk-panel-secret" not in line and isinstance(line, str)
    assert guest["bridgeLogs"] == [] and guest["bridgeStatus"] == "ok"


def test_a_token_cannot_take_the_reserved_name_local(tmp_path: Path) -> None:
    from bridge.config import BridgeConfig
    from compat.settings import SettingsError, convert

    with pytest.raises(SettingsError, match="cannot be named 'local'"):
        convert({"authTokens": [{"name": "local", "token": "t-123456789"}]}, BridgeConfig)


# ---- 9. smaller things the app reads ---------------------------------------------------------------


def test_ping_has_a_build_date_and_routing_answers_carry_provider_agent_and_metadata(tmp_path: Path) -> None:
    with TestClient(make_app(tmp_path)) as client:
        ping = client.get("/api/ping").json()
        resolved = rpc(client, "xworkmate.routing.resolve", {"taskPrompt": "hi"})["result"]
        turn = client.post("/acp/rpc", json=start("s1", workingDirectory=str(tmp_path))).json()["result"]
    assert ping["buildDate"].endswith("Z") and ping["status"] == "ok"
    assert resolved["providerId"] == resolved["agentId"] == "fake"
    assert resolved["metadata"]["dispatch"]["executionTarget"] == "agent"
    assert turn["resolvedWorkingDirectory"] == str(tmp_path.resolve())
