"""Fixtures of the knowledge tests: the sample wiki, llmwiki-serve, the fake runtime, sinks."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compat.base import StatusEvent, TextDelta
from compat.knowledge.turn_sink import CollectingSink
from tests.knowledge.servers import FakeRuntime, LlmwikiServe, ThreadedServer, llmwiki_bin

WIKI = Path(__file__).resolve().parents[1] / "fixtures" / "wiki"


class RecordingSink(CollectingSink):
    """A sink with views the assertions need."""

    @property
    def statuses(self) -> list[StatusEvent]:
        return [e for e in self.events if isinstance(e, StatusEvent)]

    @property
    def deltas(self) -> list[str]:
        return [e.text for e in self.events if isinstance(e, TextDelta)]


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()


@pytest.fixture
def wiki_copy(tmp_path: Path) -> Path:
    """A private copy of the sample wiki (tests may change it)."""
    target = tmp_path / "wiki"
    shutil.copytree(WIKI, target)
    return target


@pytest.fixture(scope="session")
def llmwiki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlmwikiServe]:
    """The real llmwiki-serve 0.2.17 over the sample wiki (installed by scripts/install-llmwiki.sh)."""
    if not llmwiki_bin().exists():
        pytest.fail("llmwiki-serve is not installed: run `make test` (it runs scripts/install-llmwiki.sh)")
    with LlmwikiServe(WIKI, tmp_path_factory.mktemp("llmwiki")) as server:
        yield server


@pytest.fixture
def runtime() -> Iterator[tuple[FakeRuntime, str]]:
    """A fake OpenAI-compatible runtime and its base URL (``…/v1``)."""
    fake = FakeRuntime()
    with ThreadedServer(fake.app()) as server:
        yield fake, server.url + "/v1"


def artifact_of(outcome: Any) -> dict[str, Any]:
    return outcome.artifacts[0]
