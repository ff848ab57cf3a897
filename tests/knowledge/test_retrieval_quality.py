"""Retrieval quality of the embedded docs source: questions a user asks about the bridge, each
with the section of README.md or docs/api.md that answers it (a question two sections answer
equally is left out). The turn's top citation must be that section for at least ``MIN_HIT_RATE``
of them, and the rate is printed. Questions about what the docs do not cover must get "I found no
section about …", not an unrelated section presented as the answer.

When a docs change moves a heading, update the section ids here (``compat.knowledge.doc_pages``
derives them from the heading path).
"""

from __future__ import annotations

import pytest

from compat.knowledge.service import KnowledgeService
from tests.knowledge.conftest import artifact_of
from tests.knowledge.helpers import run

pytestmark = pytest.mark.timeout(120)
MIN_HIT_RATE = 0.9
QUESTIONS = [  # (question, the page id of the section that answers it)
    ("how do I set an auth token?", "docs/api/auth-and-origins"),
    ("what does permissionPolicy ask do?", "docs/api/configuration"),
    ("where does an agent's API key go?", "readme/configuration"),
    ("which environment variables does an exec profile process get?", "docs/api/exec-profiles"),
    ("what does the gateway error OFFLINE mean?", "docs/api/gateway/gateway-error-codes"),
    ("what does error -32005 SESSION_BUSY mean?", "docs/api/errors/json-rpc-errors"),
    ("what is the default turnTimeout?", "docs/api/limits-and-time-bounds"),
    ("how do I use the bridge from Zed?", "readme/editors"),
    ("what does session.cancel do to a running turn?", "docs/api/methods/session-cancel"),
    ("how do I resume an SSE stream after the connection dropped?", "docs/api/resumable-streams-and-durable-sessions"),
    ("which origins may connect by default?", "docs/api/auth-and-origins"),
    ("what does acp.capabilities return?", "docs/api/methods/acp-capabilities"),
    ("how does auto routing choose a provider for a prompt?", "docs/api/methods/xworkmate-routing-resolve"),
    ("what do I need installed before make test?", "readme/prerequisites"),
    ("what does the bridge do when the gateway refuses its token?", "docs/api/gateway"),
    ("how do I add an OpenClaw gateway to the configuration?", "readme/configuration/an-openclaw-gateway"),
    ("how do I send attachments with a turn?", "docs/api/methods/session-start-and-session-message"),
    ("what is the largest message the bridge accepts?", "docs/api/limits-and-time-bounds"),
    ("which fields does every session.update notification carry?", "docs/api/update-stream"),
    ("which transports does the bridge serve?", "docs/api/transports"),
    ("what does the envelope seq count?", "docs/api/envelope"),
    ("how do I answer a permission request?", "docs/api/methods/session-permission"),
    ("who may read system.logs?", "docs/api/methods/system-logs"),
    ("how does the knowledge provider answer without a model?", "docs/api/knowledge-sources"),
    ("how do I walk a knowledge source's tree with knowledge.read?", "docs/api/knowledge-sources/knowledge-read"),
    ("which tools does the MCP endpoint offer?", "docs/api/knowledge-sources/mcp"),
    ("what exit code does serve return when its port is in use?", "docs/api/command-line"),
    ("what does the turn error AGENT_EXITED mean?", "docs/api/errors/turn-error-codes"),
    ("what does the unavailableCode GATEWAY_NOT_CONFIGURED mean?", "docs/api/errors/unavailable-codes"),
    ("how does an editor get ACP instead of the bridge's own methods?", "docs/api/editor-mode"),
    ("what does session.close do?", "docs/api/methods/session-close"),
    ("how do I run the linters?", "readme/development"),
    ("what happens to running turns when serve gets SIGTERM?", "docs/api/resumable-streams-and-durable-sessions"),
    ("how do I give an environment variable a default value in the config file?", "docs/api/configuration"),
    ("what does knowledge.sources return?", "docs/api/knowledge-sources/knowledge-sources"),
    ("where are sessions stored?", "docs/api/resumable-streams-and-durable-sessions"),
    ("how do I start the bridge?", "readme/quick-start"),
    ("what are remote workspaces?", "docs/api/methods/session-start-and-session-message"),
    ("which methods does the bridge have?", "docs/api/methods"),
    ("what does the HTTP check order look like?", "docs/api/transports"),
    ("what does GET /api/ping return?", "docs/api/transports"),
    ("which ACP methods does editor mode support?", "docs/api/editor-mode"),
    ("what does the PROFILE_TIMEOUT error mean?", "docs/api/errors/turn-error-codes"),
    ("how many sessions can one token hold?", "docs/api/limits-and-time-bounds"),
    ("what does a knowledge turn's llmwiki_agent_result artifact contain?", "docs/api/knowledge-sources"),
    ("what is the contract version of the API?", "docs/api"),
    (
        "what is the difference between session.start and session.message?",
        "docs/api/methods/session-start-and-session-message",
    ),
    ("what does the done update contain?", "docs/api/update-stream"),
    ("which JSON-RPC error means the origin is not allowed?", "docs/api/errors/json-rpc-errors"),
    ("how do I run the soak test?", "readme/development"),
]
NOT_IN_THE_DOCS = [
    "how do I deploy the bridge to kubernetes?",
    "which GPU does the bridge need?",
    "how do I rotate my AWS credentials?",
    "what is the pricing for the cloud plan?",
    "how do I enable two-factor login for the dashboard?",
    "how do I export my chat history to PDF?",
]


async def test_the_top_citation_is_the_section_that_answers_the_question(capsys: pytest.CaptureFixture[str]) -> None:
    misses, unanswered = [], []
    async with KnowledgeService() as service:
        for question, section in QUESTIONS:
            artifact = artifact_of((await run(service, question))[0])
            top = artifact["citations"][0]["pageId"] if artifact["citations"] else None
            if top != section:
                misses.append(f"{question!r}: top {top}, answered by {section}")
            if artifact["answer"].startswith("I found no section"):
                unanswered.append(question)
    rate = 1 - len(misses) / len(QUESTIONS)
    report = f"retrieval hit rate {len(QUESTIONS) - len(misses)}/{len(QUESTIONS)} = {rate:.0%}" + "".join(
        f"\n  miss: {m}" for m in misses
    )
    with capsys.disabled():
        print(f"\n{report}")
    assert len(QUESTIONS) >= 30 and rate >= MIN_HIT_RATE, report
    assert len(unanswered) <= len(QUESTIONS) * (1 - MIN_HIT_RATE), f"said no section answers: {unanswered}"


@pytest.mark.parametrize("question", NOT_IN_THE_DOCS)
async def test_a_question_the_docs_do_not_cover_is_answered_as_such(question: str) -> None:
    async with KnowledgeService() as service:
        artifact = artifact_of((await run(service, question))[0])
    assert artifact["answer"].startswith(f"I found no section about “{question}”"), artifact["answer"][:300]
