"""xworkmate.routing.resolve: the original bridge's nine scenarios and the contract's rules."""

from __future__ import annotations

import pytest

from orchestrator.results import ResolveResult
from orchestrator.routing import RoutingInput, resolve
from tests.helpers import conforms

SKILLS = [
    {"id": "pptx", "label": "PPTX", "installed": True},
    {"id": "docx", "label": "DOCX", "installed": True},
    {"id": "xlsx", "label": "XLSX", "installed": True},
    {"id": "pdf", "label": "PDF", "installed": True},
    {"id": "image-resizer", "label": "image-resizer", "installed": True},
    {"id": "browser-automation", "label": "Browser Automation", "installed": True},
]
AUTO = {"routingMode": "auto", "preferredGatewayProviderId": "openclaw", "availableSkills": SKILLS}

NINE = [
    ("create a powerpoint deck for this launch", "single-agent", "", "local_match", ["PPTX"], False),
    ("draft a word document memo", "single-agent", "", "local_match", ["DOCX"], False),
    ("build an excel workbook with formulas", "single-agent", "", "local_match", ["XLSX"], False),
    ("merge and fill this pdf form", "single-agent", "", "local_match", ["PDF"], False),
    ("batch resize image assets", "single-agent", "", "local_match", ["image-resizer"], False),
    ("use image-cog to generate consistent characters", "gateway", "openclaw", "find_skills", [], True),
    ("wan 图生视频并做视频编辑", "gateway", "openclaw", "find_skills", [], True),
    ("translate video subtitles and dub the clip", "gateway", "openclaw", "find_skills", [], True),
    ("跨浏览器执行并搜索最新资讯采集结果", "gateway", "openclaw", "local_match", ["Browser Automation"], False),
]


def run(prompt: str, routing: dict | None, available=("codex", "gemini"), gateway=True) -> dict:
    result = resolve(RoutingInput.from_params(prompt, routing), list(available), gateway).to_wire()
    conforms(ResolveResult, result)
    return result


@pytest.mark.parametrize("prompt,target,gateway,source,skills,install", NINE)
def test_nine_scenarios_with_a_gateway(prompt, target, gateway, source, skills, install):
    r = run(prompt, AUTO)
    assert (r["resolvedExecutionTarget"], r["resolvedGatewayProviderId"]) == (target, gateway)
    assert (r["skillResolutionSource"], r["resolvedSkills"], r["needsSkillInstall"]) == (source, skills, install)
    assert bool(r["skillInstallRequestId"]) == install
    assert r["status"] == "available"


@pytest.mark.parametrize("prompt", [row[0] for row in NINE if row[1] == "gateway"])
def test_without_a_gateway_online_prompts_go_to_the_first_agent(prompt):
    r = run(prompt, AUTO, gateway=False)
    assert r["resolvedExecutionTarget"] == "single-agent" and r["resolvedProviderId"] == "codex"


def test_explicit_provider_and_model_are_honoured_in_auto_mode():
    r = run("hello", {"routingMode": "auto", "explicitProviderId": "gemini", "explicitModel": "m1"})
    assert (r["resolvedProviderId"], r["resolvedModel"]) == ("gemini", "m1")


def test_unavailable_explicit_provider_is_not_substituted_even_with_one_provider():
    r = run("hello", {"explicitProviderId": "claude"}, available=("codex",))
    assert r["status"] == "unavailable" and r["unavailableCode"] == "PROVIDER_UNAVAILABLE"
    assert r["unavailable"] is True


@pytest.mark.parametrize(
    "target,expected",
    [
        ("singleAgent", "single-agent"),
        ("single-agent", "single-agent"),
        ("agent", "single-agent"),
        ("multi", "single-agent"),
    ],
)
def test_explicit_execution_targets(target, expected):
    r = run("search the news", {"routingMode": "explicit", "explicitExecutionTarget": target})
    assert r["resolvedExecutionTarget"] == expected


def test_explicit_gateway_without_a_gateway_is_unavailable():
    r = run("hi", {"routingMode": "explicit", "explicitExecutionTarget": "gateway"}, gateway=False)
    assert r["unavailableCode"] == "GATEWAY_NOT_CONFIGURED" and r["status"] == "unavailable"


def test_explicit_target_is_ignored_in_auto_mode():
    r = run("hi", {"routingMode": "auto", "explicitExecutionTarget": "gateway"})
    assert r["resolvedExecutionTarget"] == "single-agent"


def test_absent_routing_is_auto_and_picks_the_first_available_provider():
    assert run("hi", None)["resolvedProviderId"] == "codex"
    assert run("hi", None, available=(), gateway=False)["unavailableCode"] == "PROVIDER_UNAVAILABLE"
    to_gateway = run("hi", None, available=())  # no agent can run, a gateway can
    assert to_gateway["resolvedExecutionTarget"] == "gateway" and to_gateway["unavailableCode"] == ""


def test_keywords_match_whole_words_only():
    assert run("I want to research this", AUTO)["resolvedExecutionTarget"] == "single-agent"


def test_explicit_skills_win_and_are_deduplicated():
    r = run("anything", {"explicitSkills": ["a", "a", " b "]})
    assert r["resolvedSkills"] == ["a", "b"] and r["skillResolutionSource"] == "local_match"
