"""Fixtures for the exec-profile tests: adapters over the scripts in ``scripts/``, a recording sink,
and bounded waits on OS state (processes gone)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from compat.base import TextDelta, TurnOutcome, TurnRequest
from compat.profile.adapter import ProfileAdapter, ProfileSession
from compat.profile.settings import parse_profile
from compat.settings import Limits, Timeouts
from tests.compat.conftest import RecordingSink, process_alive, wait_gone

__all__ = ["SCRIPTS", "ProfileFactory", "RecordingSink", "deltas", "pids_in", "request", "run_turn", "wait_gone"]

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TEST_TIMEOUTS = {"turn_timeout": 60.0, "cancel_grace": 1.0}


def request(
    prompt: str = "hello", *, session_id: str = "s1", thread_id: str = "t1", cwd: Path | str = "/tmp", **fields: Any
) -> TurnRequest:
    return TurnRequest(
        session_id=session_id,
        thread_id=thread_id,
        turn_id=uuid.uuid4().hex,
        prompt=prompt,
        working_directory=str(cwd),
        **fields,
    )


def deltas(sink: RecordingSink) -> list[str]:
    return [e.text for e in sink.events if isinstance(e, TextDelta)]


async def run_turn(
    session: ProfileSession, prompt: str = "hello", sink: RecordingSink | None = None, **fields: Any
) -> tuple[TurnOutcome, RecordingSink]:
    sink = sink or RecordingSink()
    with anyio.fail_after(90):
        outcome = await session.run_turn(request(prompt, **fields), sink)
    return outcome, sink


def pids_in(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``."""
    members = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and process_alive(proc.pid):
                members.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


class ProfileFactory:
    """Builds ``ProfileAdapter``s (profile dir: ``scripts/``) and closes them after the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.adapters: list[ProfileAdapter] = []

    def __call__(
        self,
        *,
        limits: dict[str, Any] | None = None,
        timeouts: dict[str, Any] | None = None,
        profile_dir: Path = SCRIPTS,
        provider_id: str = "prof",
        **fields: Any,
    ) -> ProfileAdapter:
        profile = parse_profile(f"profiles.{provider_id}", fields)
        adapter = ProfileAdapter(
            provider_id,
            profile,
            Limits(**(limits or {})),
            Timeouts(**{**TEST_TIMEOUTS, **(timeouts or {})}),
            profile_dir=profile_dir,
        )
        self.adapters.append(adapter)
        return adapter

    def modes(self, mode: str, **fields: Any) -> ProfileAdapter:
        """The ``modes.py`` profile in ``mode``; its started pids go to ``<tmp>/pids``."""
        env = {"PROFILE_MODE": mode, "PIDS_FILE": str(self.tmp_path / "pids"), **fields.pop("env", {})}
        return self(script="modes.py", env=env, **fields)


@pytest.fixture
async def make_profile(tmp_path: Path) -> AsyncIterator[ProfileFactory]:
    factory = ProfileFactory(tmp_path)
    yield factory
    with anyio.fail_after(20):
        for adapter in factory.adapters:
            await adapter.aclose()
