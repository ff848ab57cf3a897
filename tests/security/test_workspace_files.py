"""What an attacker found in the remote-workspace, attachment and artifact code (issue 20's
surfaces, tried as the hostile-clients issue asks): each case that broke, now held."""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from bridge.rpc.errors import InvalidParams
from compat.settings import Limits, Timeouts
from orchestrator import artifacts, files
from orchestrator.attachments import safe_name
from orchestrator.models import TurnParams
from orchestrator.registry import ProviderRegistry
from orchestrator.service import Orchestrator
from tests.helpers import in_background
from tests.orchestrator.fake_adapter import FakeAdapter

pytestmark = pytest.mark.timeout(30)
APP_PATH = "/Users/someone/project"


def make(tmp_path: Path, remote_inside_root: bool = False) -> Orchestrator:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    remote = (root if remote_inside_root else tmp_path) / "data" / "workspaces"
    registry = ProviderRegistry({"fake": FakeAdapter("fake")}, {"fake"})
    return Orchestrator(
        registry, [root.resolve()], Limits(), Timeouts(), remote_root=remote.resolve(), remote_workspaces=True
    )


async def turn(orch: Orchestrator, principal: str, session: str = "s1", **params: Any) -> Any:
    body = {"sessionId": session, "taskPrompt": "hi", "workingDirectory": APP_PATH, **params}
    return await orch.run_turn(TurnParams.model_validate(body), principal, lambda *_: None, start=False)


def test_a_fifo_is_never_read_so_it_cannot_hang_the_artifact_scan(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")  # opened blocking, this would wait for a writer for ever
    assert files.read_beneath(str(tmp_path), "pipe", 100) is None


def test_a_link_on_the_way_to_a_file_is_never_followed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "passwd").write_text("secret")
    (tmp_path / "sub").symlink_to(tmp_path / "real")
    assert files.read_beneath(str(tmp_path), "real/passwd", 100) == b"secret"
    assert files.read_beneath(str(tmp_path), "sub/passwd", 100) is None


def test_folders_count_toward_the_scan_bound(tmp_path: Path) -> None:
    for n in range(5):
        (tmp_path / f"d{n}").mkdir()
    with pytest.raises(artifacts.TooManyFiles):
        artifacts.listing(str(tmp_path), 3)


def test_a_long_extension_is_cut_with_the_name() -> None:
    for name in ("x." + "b" * 300, "x." + "中" * 100):
        assert len(safe_name(name, set()).encode()) <= 200


async def test_refused_requests_leave_no_remote_folder(tmp_path: Path) -> None:
    async with in_background(make(tmp_path)) as orch:
        with pytest.raises(InvalidParams):
            await turn(orch, "bob", attachments=[{"name": "x", "path": ""}])
        unknown = {"routingMode": "explicit", "explicitExecutionTarget": "agent", "explicitProviderId": "nope"}
        assert (await turn(orch, "bob", session="s2", routing=unknown)).status == "unavailable"
    workspaces = tmp_path / "data" / "workspaces"
    assert not workspaces.exists() or list(workspaces.iterdir()) == []


async def test_another_remote_folder_is_no_attachment_and_no_artifact_even_below_a_root(tmp_path: Path) -> None:
    async with in_background(make(tmp_path, remote_inside_root=True)) as orch:
        alice = Path((await turn(orch, "alice")).resolved_working_directory)
        (alice / "secret.txt").write_text("TOPSECRET")
        with pytest.raises(InvalidParams) as err:
            await turn(orch, "bob", attachments=[{"name": "s", "path": str(alice / "secret.txt")}])
        assert err.value.data["field"] == "attachments.0.path"
        data = tmp_path / "root" / "data"  # an ancestor of the remote root, inside the root
        written = f"write workspaces/{alice.name}/new.txt mine.txt"  # as if alice wrote during bob's turn
        body = {"sessionId": "b2", "taskPrompt": written, "workingDirectory": str(data), "returnArtifacts": True}
        result = await orch.run_turn(TurnParams.model_validate(body), "bob", lambda *_: None, start=True)
    assert (alice / "new.txt").exists()
    assert [a["relativePath"] for a in result.artifacts] == ["mine.txt"]


async def test_closing_never_deletes_through_a_planted_link(tmp_path: Path) -> None:
    async with in_background(make(tmp_path)) as orch:
        copy = {"name": "n.txt", "content": base64.b64encode(b"x").decode()}
        result = await turn(orch, "alice", attachments=[{"name": "n.txt", "path": ""}], inlineAttachments=[copy])
        cwd = Path(result.resolved_working_directory)
        victim = tmp_path / "other" / "target"
        (victim / "attachments" / result.turn_id).mkdir(parents=True)
        (victim / "attachments" / result.turn_id / "important.txt").write_text("keep me")
        shutil.rmtree(cwd / ".xworkmate")
        (cwd / ".xworkmate").symlink_to(victim)
        await orch.close("s1", "alice")  # removes the attachments, then the remote folder: neither follows the link
    assert (victim / "attachments" / result.turn_id / "important.txt").read_text() == "keep me"
