"""Remote workspaces (issue 20, finding 3): a client on another machine sends its own local path;
with ``remoteWorkspaces`` on, the turn runs in a folder of that principal and session only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bridge.rpc.errors import InvalidParams, LimitReached
from compat.settings import Limits, Timeouts
from orchestrator.models import TurnParams
from orchestrator.registry import ProviderRegistry
from orchestrator.service import Orchestrator
from tests.helpers import in_background
from tests.orchestrator.fake_adapter import FakeAdapter

pytestmark = pytest.mark.timeout(30)
APP_PATH = "/Users/someone/.xworkmate/threads/t1"  # the app's own machine: no such folder here


def make(tmp_path: Path, *, remote: bool, max_bytes: int = 1 << 20) -> Orchestrator:
    (tmp_path / "root").mkdir(exist_ok=True)
    registry = ProviderRegistry({"fake": FakeAdapter("fake")}, {"fake"})
    return Orchestrator(
        registry,
        [(tmp_path / "root").resolve()],
        Limits(max_remote_workspace_bytes=max_bytes),
        Timeouts(),
        remote_root=(tmp_path / "data" / "workspaces").resolve(),
        remote_workspaces=remote,
    )


async def turn(orch: Orchestrator, cwd: str, session: str = "s1", principal: str = "alice", prompt: str = "hi") -> Any:
    params = TurnParams.model_validate({"sessionId": session, "taskPrompt": prompt, "workingDirectory": cwd})
    return await orch.run_turn(params, principal, lambda *_: None, start=False)


async def test_an_outside_path_runs_in_the_sessions_own_folder_kept_for_its_turns(tmp_path: Path) -> None:
    async with in_background(make(tmp_path, remote=True)) as orch:
        first = await turn(orch, APP_PATH)
        folder = Path(first.resolved_working_directory)
        assert folder.parent == tmp_path / "data" / "workspaces" and folder.is_dir()
        assert "someone" not in folder.name and "s1" not in folder.name  # a hash, not client text
        again = await turn(orch, APP_PATH)
        hinted = await turn(orch, str(folder))  # the app sends resolvedWorkingDirectory back
        other = await turn(orch, APP_PATH, session="s2")
    assert again.resolved_working_directory == hinted.resolved_working_directory == str(folder)
    assert other.resolved_working_directory != str(folder)


@pytest.mark.parametrize("session,principal", [("s2", "alice"), ("s1", "bob")])
async def test_another_sessions_or_principals_folder_is_refused(tmp_path: Path, session: str, principal: str) -> None:
    async with in_background(make(tmp_path, remote=True)) as orch:
        folder = (await turn(orch, APP_PATH)).resolved_working_directory
        with pytest.raises(InvalidParams, match="outside the workspace roots"):
            await turn(orch, folder, session=session, principal=principal)
        with pytest.raises(InvalidParams, match="outside the workspace roots"):
            await turn(orch, str(Path(folder).parent), session=session, principal=principal)


async def test_with_remote_workspaces_off_outside_paths_get_one_message_whether_or_not_they_exist(
    tmp_path: Path,
) -> None:
    existing = tmp_path / "outside"
    existing.mkdir()
    async with in_background(make(tmp_path, remote=False)) as orch:
        messages = []
        for path in (str(existing), str(tmp_path / "absent"), "/root/.ssh", "/etc"):
            with pytest.raises(InvalidParams) as err:
                await turn(orch, path)
            messages.append(err.value.message.replace(path, "<path>"))
    assert len(set(messages)) == 1 and "outside the workspace roots" in messages[0]


async def test_the_folder_is_removed_with_its_session(tmp_path: Path) -> None:
    async with in_background(make(tmp_path, remote=True)) as orch:
        folder = Path((await turn(orch, APP_PATH)).resolved_working_directory)
        (folder / "made-by-the-agent.txt").write_text("x")
        await orch.close("s1", "alice")
    assert not folder.exists()


async def test_a_full_remote_workspace_is_a_clear_limit_error(tmp_path: Path) -> None:
    async with in_background(make(tmp_path, remote=True, max_bytes=1000)) as orch:
        folder = Path((await turn(orch, APP_PATH)).resolved_working_directory)
        (folder / "big.bin").write_bytes(b"x" * 1000)
        with pytest.raises(LimitReached) as err:
            await turn(orch, APP_PATH)
    assert err.value.data["limit"] == "maxRemoteWorkspaceBytes" and "full" in err.value.message


def test_remote_workspaces_default_on_only_off_loopback(tmp_path: Path) -> None:
    from bridge.config import BridgeConfig
    from bridge.wiring import build_orchestrator
    from compat.settings import convert

    base = {"providers": {}, "dataDir": str(tmp_path / "data")}
    local = build_orchestrator(convert({**base, "host": "127.0.0.1"}, BridgeConfig))
    exposed = build_orchestrator(convert({**base, "host": "0.0.0.0", "authTokens": ["t-0123456789"]}, BridgeConfig))
    forced = build_orchestrator(convert({**base, "remoteWorkspaces": True}, BridgeConfig))
    assert (local.workspace.remote, exposed.workspace.remote, forced.workspace.remote) == (False, True, True)
    assert exposed.workspace.remote_root == (tmp_path / "data" / "workspaces").resolve()


# ---- finding 4: the files a turn made come back as artifacts -------------------------------------


async def test_a_remote_turn_returns_the_files_it_made_newest_first(tmp_path: Path) -> None:
    async with in_background(make(tmp_path, remote=True)) as orch:
        first = await turn(orch, APP_PATH, prompt="write old.txt")
        folder = Path(first.resolved_working_directory)
        (folder / ".hidden").mkdir()
        (folder / "link.txt").symlink_to("/etc/hostname")
        result = await turn(orch, APP_PATH, prompt="write reports/a.md .hidden/secret node_modules/x.js")
    assert [a["relativePath"] for a in first.artifacts] == ["old.txt"]
    (a,) = result.artifacts  # old.txt unchanged; dot folders, node_modules and links skipped
    assert a["relativePath"] == "reports/a.md" and a["label"] == "a.md" and a["contentType"] == "text/markdown"
    assert a["encoding"] == "base64" and a["sizeBytes"] == len(b"made reports/a.md\n")
    import base64
    import hashlib

    data = base64.b64decode(a["content"], validate=True)  # strict, as the app decodes it
    assert data == b"made reports/a.md\n" and a["sha256"] == hashlib.sha256(data).hexdigest()


async def test_artifacts_past_the_result_cap_are_listed_without_content(tmp_path: Path) -> None:
    orch = make(tmp_path, remote=True)
    orch.limits = Limits(max_artifact_result_bytes=3000)
    async with in_background(orch):
        result = await turn(orch, APP_PATH, prompt="write a.bin:2000 b.bin:2000")
    with_content = [a for a in result.artifacts if "content" in a]
    assert len(result.artifacts) == 2 and len(with_content) == 1
    assert "maxArtifactResultBytes" in result.artifacts_omitted


async def test_too_many_files_give_no_artifacts_and_say_so(tmp_path: Path) -> None:
    orch = make(tmp_path, remote=True)
    orch.limits = Limits(max_artifact_scan_files=3)
    async with in_background(orch):
        result = await turn(orch, APP_PATH, prompt="write 1 2 3 4")
        again = await turn(orch, APP_PATH, prompt="write 5")
    assert result.artifacts == [] and "maxArtifactScanFiles" in result.artifacts_omitted
    assert again.artifacts == [] and "maxArtifactScanFiles" in again.artifacts_omitted


async def test_return_artifacts_lists_a_folder_under_a_root_but_never_a_root(tmp_path: Path) -> None:
    async with in_background(make(tmp_path, remote=False)) as orch:
        sub = tmp_path / "root" / "project"
        sub.mkdir()

        async def ask(cwd: Path, **extra: Any) -> Any:
            params = TurnParams.model_validate(
                {"sessionId": str(cwd), "taskPrompt": "write made.txt", "workingDirectory": str(cwd), **extra}
            )
            return await orch.run_turn(params, "alice", lambda *_: None, start=True)

        asked = await ask(sub, returnArtifacts=True)
        plain = await ask(sub)
        root = await ask(tmp_path / "root", returnArtifacts=True)
    from msgspec import UNSET

    assert [a["relativePath"] for a in asked.artifacts] == ["made.txt"]
    assert plain.artifacts is UNSET and root.artifacts is UNSET
