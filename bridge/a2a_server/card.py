"""The bridge's A2A v1 agent card (A2A v1 §8 "Agent Discovery"), served publicly at
``/.well-known/agent-card.json``.

It names the two endpoints (JSON-RPC at ``/a2a``, HTTP+JSON at the bridge's root, so
``/message:send`` and ``/message:stream``), the knowledge skill, and, when the bridge has tokens,
that they are bearer tokens: never a token, a source URL or a path. Endpoint URLs are absolute,
built from the URL the card was asked at (A2A v1 §5.6: interface URLs are absolute).

Imported only once the A2A surface is first used. Must not import: ``orchestrator``, ``compat``.
"""

from __future__ import annotations

from typing import Any

from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)

from bridge import __version__

CARD_PATH = "/.well-known/agent-card.json"
RPC_PATH = "/a2a"
PROTOCOL_VERSION = "1.0"
BEARER = "bearer"
MODES = ["text/plain", "application/json"]


def agent_card(base_url: str, *, secured: bool) -> AgentCard:
    """The card for a bridge reached at ``base_url`` (``http://host:port``, no trailing slash).

    Args:
        base_url: scheme, host and port the client used.
        secured: the bridge has tokens: the card says requests need a bearer token.
    """
    card = AgentCard(
        name="xworkmate-bridge knowledge",
        description="Answers questions from this bridge's knowledge sources with cited evidence; "
        "the answer's trace, citations and graph are in the llmwiki_agent_result artifact.",
        version=__version__,
        supported_interfaces=[
            AgentInterface(url=base_url + RPC_PATH, protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION),
            AgentInterface(url=base_url, protocol_binding="HTTP+JSON", protocol_version=PROTOCOL_VERSION),
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=MODES,
        default_output_modes=MODES,
        skills=[_skill()],
    )
    if secured:
        scheme = HTTPAuthSecurityScheme(scheme="Bearer", description="a token from the bridge's authTokens")
        card.security_schemes[BEARER].CopyFrom(SecurityScheme(http_auth_security_scheme=scheme))
        card.security_requirements.append(SecurityRequirement(schemes={BEARER: StringList()}))
    return card


def _skill() -> AgentSkill:
    return AgentSkill(
        id="knowledge-answer",
        name="Answer from knowledge sources",
        description="One knowledge turn: the question is the message text (or data.query); a data "
        "part may set mode (evidence-only, delegated-runtime, hybrid), knowledgeSources, retrieval and "
        "messages as the LLMWiki agent bridge's /message:send does.",
        tags=["knowledge", "llmwiki", "citations"],
        examples=["How do I set an auth token?"],
        input_modes=MODES,
        output_modes=MODES,
    )


def card_json(base_url: str, *, secured: bool) -> dict[str, Any]:
    """The card as the JSON the SDK serves."""
    from a2a.server.request_handlers.response_helpers import agent_card_to_dict

    return agent_card_to_dict(agent_card(base_url, secured=secured))
