"""``xworkmate.routing.resolve``: choose an execution target, a provider, a model and skills.

Source: docs/api.md "xworkmate.routing.resolve", after the original bridge's era-B router
(../shared/reference/xworkmate-original.md §4) with the contract's changes: an unavailable explicit
provider is never silently substituted, and with no gateway configured, prompts that would go to
the gateway go to the first available agent (with no agent available and a gateway configured,
auto routing goes to the gateway). Keywords match on word boundaries (so ``wan`` does not
match "want"); CJK keywords match as substrings.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import msgspec

LOCAL_KEYWORDS = (
    "ppt",
    "pptx",
    "powerpoint",
    "word",
    "docx",
    "excel",
    "xlsx",
    "pdf",
    "image-resizer",
    "resize image",
    "compress image",
    "crop image",
)
ONLINE_KEYWORDS = (
    "image-cog",
    "wan",
    "video-translator",
    "browser",
    "search",
    "news",
    "资讯采集",
    "跨浏览器",
    "文生图",
    "文生视频",
    "图生视频",
    "视频翻译",
    "translate video",
    "dub video",
    "subtitles",
)


class BuiltinSkill(msgspec.Struct, frozen=True):
    id: str
    label: str
    keywords: tuple[str, ...]


BUILTIN_SKILLS = (
    BuiltinSkill("pptx", "PPTX", ("pptx", "ppt", "powerpoint", "slides", "slide deck", "deck")),
    BuiltinSkill("docx", "DOCX", ("docx", "word document", "word", "memo")),
    BuiltinSkill("xlsx", "XLSX", ("xlsx", "excel", "spreadsheet", "workbook")),
    BuiltinSkill("pdf", "PDF", ("pdf",)),
    BuiltinSkill("image-resizer", "image-resizer", ("image-resizer", "resize image", "compress image", "crop image")),
    BuiltinSkill("image-cog", "image-cog", ("image-cog", "consistent characters")),
    BuiltinSkill(
        "image-video-generation-editting",
        "image-video-generation-editting",
        ("wan", "文生图", "文生视频", "图生视频", "视频编辑", "video generation"),
    ),
    BuiltinSkill(
        "video-translator", "video-translator", ("video-translator", "translate video", "dub", "subtitles", "视频翻译")
    ),
    BuiltinSkill("browser-automation", "Browser Automation", ("browser", "跨浏览器", "browser automation", "资讯采集")),
    BuiltinSkill("find-skills", "find-skills", ("find-skills", "find skills")),
)

# Routing reads only the start of a prompt and a bounded skill list: a pasted 3 MB prompt or 2,000
# skills must not hold the event loop (every other client waits while routing runs).
ROUTING_PROMPT_CHARS = 8192
MAX_AVAILABLE_SKILLS = 256

TARGET_ALIASES = {
    "singleagent": "single-agent",
    "single-agent": "single-agent",
    "agent": "single-agent",
    "gateway": "gateway",
}


@lru_cache(maxsize=1024)
def _keyword_re(keywords: tuple[str, ...]) -> re.Pattern[str]:
    parts = []
    for word in keywords:
        escaped = re.escape(word.lower())
        parts.append(escaped if not word.isascii() else rf"(?<![\w-]){escaped}(?![\w-])")
    return re.compile("|".join(parts)) if parts else re.compile(r"(?!x)x")


_LOCAL_RE = _keyword_re(tuple(LOCAL_KEYWORDS))
_ONLINE_RE = _keyword_re(tuple(ONLINE_KEYWORDS))
_BUILTIN_RES = {skill.id: _keyword_re(skill.keywords) for skill in BUILTIN_SKILLS}


class RoutingInput(msgspec.Struct, frozen=True):
    prompt: str = ""
    routing_mode: str = "auto"
    explicit_execution_target: str = ""
    explicit_provider_id: str = ""
    explicit_model: str = ""
    explicit_skills: tuple[str, ...] = ()
    available_skills: tuple[dict[str, Any], ...] = ()
    preferred_gateway_provider_id: str = ""
    preferred_provider_id: str = ""

    @classmethod
    def from_params(
        cls, prompt: str, routing: dict[str, Any] | None, model: str | None = None, preferred: str = ""
    ) -> RoutingInput:
        """Read the ``routing`` object; ``preferred`` is the request's top-level provider
        preference (``TurnParams.preferred_provider``).

        Raises:
            ValueError: a routing field has the wrong type (the caller reports -32602): an
                explicit choice that cannot be read must not fall back to auto routing.
        """
        r = routing or {}

        def text(key: str) -> str:
            value = r.get(key)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"routing.{key} must be a string")
            return value.strip()[:200] if isinstance(value, str) else ""

        skills = _list(r.get("explicitSkills"))
        available = _list(r.get("availableSkills"))
        return cls(
            prompt=(prompt or "")[:ROUTING_PROMPT_CHARS],
            routing_mode=(text("routingMode") or "auto").lower(),
            explicit_execution_target=text("explicitExecutionTarget"),
            explicit_provider_id=text("explicitProviderId"),
            explicit_model=text("explicitModel") or (model or "").strip(),
            explicit_skills=tuple(
                s.strip()[:200] for s in skills[:MAX_AVAILABLE_SKILLS] if isinstance(s, str) and s.strip()
            ),
            available_skills=tuple(s for s in available[:MAX_AVAILABLE_SKILLS] if isinstance(s, dict)),
            preferred_gateway_provider_id=text("preferredGatewayProviderId"),
            preferred_provider_id=preferred.strip()[:200],
        )


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


class Resolution(msgspec.Struct):
    """The fields of ``xworkmate.routing.resolve`` (docs/api.md)."""

    resolved_execution_target: str = "single-agent"
    resolved_provider_id: str = ""
    resolved_gateway_provider_id: str = ""
    resolved_model: str = ""
    resolved_skills: list[str] = msgspec.field(default_factory=list)
    unavailable_code: str = ""
    unavailable_message: str = ""
    skill_resolution_source: str = "none"
    needs_skill_install: bool = False
    skill_install_request_id: str = ""
    preferred_provider_id: str = ""
    preferred_provider_unavailable: bool = False
    preferred_provider_message: str = ""

    @property
    def unavailable(self) -> bool:
        return bool(self.unavailable_code)

    @property
    def provider_key(self) -> str:
        """The registry id of the provider that runs the turn: the agent, or the gateway provider."""
        return self.resolved_provider_id or self.resolved_gateway_provider_id

    def preference(self) -> dict[str, Any]:
        """The preference fields, as keyword arguments of the result structs."""
        return {
            "preferred_provider_id": self.preferred_provider_id,
            "preferred_provider_unavailable": self.preferred_provider_unavailable,
            "preferred_provider_message": self.preferred_provider_message,
        }

    def to_wire(self) -> dict[str, Any]:
        return {
            "resolvedExecutionTarget": self.resolved_execution_target,
            "resolvedProviderId": self.resolved_provider_id,
            "resolvedGatewayProviderId": self.resolved_gateway_provider_id,
            "resolvedModel": self.resolved_model,
            "resolvedSkills": list(self.resolved_skills),
            "status": "unavailable" if self.unavailable else "available",
            "unavailable": self.unavailable,
            "unavailableCode": self.unavailable_code,
            "unavailableMessage": self.unavailable_message,
            "skillResolutionSource": self.skill_resolution_source,
            "needsSkillInstall": self.needs_skill_install,
            "skillInstallRequestId": self.skill_install_request_id,
            "preferredProviderId": self.preferred_provider_id,
            "preferredProviderUnavailable": self.preferred_provider_unavailable,
            "preferredProviderMessage": self.preferred_provider_message,
        }


def _target(inp: RoutingInput, gateway_configured: bool) -> str:
    if inp.routing_mode == "explicit" and inp.explicit_execution_target:
        return TARGET_ALIASES.get(inp.explicit_execution_target.lower(), "single-agent")
    prompt = inp.prompt.lower()
    if _LOCAL_RE.search(prompt):
        return "single-agent"
    if _ONLINE_RE.search(prompt) and gateway_configured:
        return "gateway"
    return "single-agent"


def _skill_keywords(skill: dict[str, Any]) -> re.Pattern[str]:
    sid, label = str(skill.get("id") or "")[:100], str(skill.get("label") or "")[:100]
    words = [w for w in (sid, label) if w]
    haystack = f"{sid} {label}".lower()
    for builtin in BUILTIN_SKILLS:
        if builtin.id in haystack or builtin.label.lower() in haystack:
            words.extend(builtin.keywords)
    return _keyword_re(tuple(words))


def _skills(inp: RoutingInput, res: Resolution) -> None:
    if inp.explicit_skills:
        res.resolved_skills = list(dict.fromkeys(inp.explicit_skills))
        res.skill_resolution_source = "local_match"
        return
    prompt = inp.prompt.lower()
    local = [s for s in inp.available_skills if _skill_keywords(s).search(prompt)]
    if local:
        res.resolved_skills = [str(s.get("label") or s.get("id")) for s in local]
        res.skill_resolution_source = "local_match"
        return
    found = [b for b in BUILTIN_SKILLS if b.id != "find-skills" and _BUILTIN_RES[b.id].search(prompt)]
    if not found:
        return
    available_ids = {str(s.get("id") or "").lower() for s in inp.available_skills}
    matched = [s for s in inp.available_skills if str(s.get("id") or "").lower() in {b.id for b in found}]
    res.skill_resolution_source = "find_skills"
    if matched:
        res.resolved_skills = [str(s.get("label") or s.get("id")) for s in matched]
        return
    missing = sorted(b.id.lower() for b in found if b.id.lower() not in available_ids)
    res.needs_skill_install = True
    res.skill_install_request_id = "skill-install:" + ",".join(missing)


def resolve(
    inp: RoutingInput,
    available: Sequence[str],
    gateway_configured: bool,
    auto_available: Sequence[str] | None = None,
) -> Resolution:
    """Resolve a route.

    Args:
        inp: the prompt and the ``routing`` object.
        available: ids of providers that can run now, in catalog order (explicit choices).
        gateway_configured: whether an OpenClaw gateway is configured.
        auto_available: the providers auto routing may pick (default ``available``).

    Returns:
        A Resolution; ``unavailable_code`` is ``PROVIDER_UNAVAILABLE`` or
        ``GATEWAY_NOT_CONFIGURED`` when the route cannot run (never an error).
    """
    res = Resolution(resolved_model=inp.explicit_model)
    res.resolved_execution_target = _target(inp, gateway_configured)
    _skills(inp, res)
    if res.resolved_execution_target == "gateway":
        res.resolved_gateway_provider_id = "openclaw"
        if not gateway_configured:
            res.unavailable_code = "GATEWAY_NOT_CONFIGURED"
            res.unavailable_message = "no OpenClaw gateway is configured"
        return res
    if inp.explicit_provider_id:
        if inp.explicit_provider_id in available:
            res.resolved_provider_id = inp.explicit_provider_id
        else:
            res.resolved_provider_id = inp.explicit_provider_id
            res.unavailable_code = "PROVIDER_UNAVAILABLE"
            res.unavailable_message = f"explicit provider is unavailable: {inp.explicit_provider_id}"
        return res
    preferred = inp.preferred_provider_id
    if preferred:
        res.preferred_provider_id = preferred
        if preferred in available:
            res.resolved_provider_id = preferred
            return res
        res.preferred_provider_unavailable = True  # a preference, unlike a choice, gives way to auto
        res.preferred_provider_message = f"preferred provider is unavailable: {preferred}"
    candidates = available if auto_available is None else auto_available
    if candidates:
        res.resolved_provider_id = candidates[0]
    elif gateway_configured and inp.routing_mode != "explicit":  # no agent can run: the gateway can
        res.resolved_execution_target = "gateway"
        res.resolved_gateway_provider_id = "openclaw"
    else:
        res.unavailable_code = "PROVIDER_UNAVAILABLE"
        res.unavailable_message = "no single-agent provider is available"
    return res
