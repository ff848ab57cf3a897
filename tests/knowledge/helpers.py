"""Builders shared by the knowledge turn tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compat.base import TurnOutcome, TurnRequest
from compat.knowledge.adapter import KnowledgeAdapter, KnowledgeSession
from compat.knowledge.service import KnowledgeService
from compat.knowledge.settings import KnowledgeSettings, RuntimeSettings, SourceDescriptor
from tests.knowledge.conftest import WIKI, RecordingSink


def wiki_descriptor(root: Path = WIKI, source_id: str = "acme") -> SourceDescriptor:
    return SourceDescriptor(id=source_id, label="Acme Ops Wiki", protocol="local-wiki", root=str(root))


def make_service(
    sources: Sequence[SourceDescriptor] | None = None,
    *,
    runtime_url: str | None = None,
    runtime_timeout: float = 5.0,
    api_key_env: str | None = None,
    **knowledge: Any,
) -> KnowledgeService:
    runtime = RuntimeSettings(
        base_url=runtime_url,
        model="mock-model" if runtime_url else None,
        timeout_seconds=runtime_timeout,
        api_key_env=api_key_env,
    )
    settings = KnowledgeSettings(runtime=runtime, **knowledge)
    return KnowledgeService(settings, [wiki_descriptor()] if sources is None else list(sources), roots=[Path("/tmp")])


def request(prompt: str, turn: str = "turn-1", **extra: Any) -> TurnRequest:
    return TurnRequest(
        session_id="s1", thread_id="th1", turn_id=turn, prompt=prompt, working_directory="/tmp", extra=extra
    )


def session_of(service: KnowledgeService) -> KnowledgeSession:
    return KnowledgeAdapter("knowledge", service).open_session("s1")


async def run(
    service: KnowledgeService, prompt: str, sink: RecordingSink | None = None, **extra: Any
) -> tuple[TurnOutcome, RecordingSink]:
    sink = sink or RecordingSink()
    outcome = await session_of(service).run_turn(request(prompt, **extra), sink)
    return outcome, sink
