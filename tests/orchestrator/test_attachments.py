"""Inline attachments (issue 20, finding 2): an attachment whose path is not usable on this host
is taken from its inline copy, written under the working directory without following links."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import pytest

from bridge.rpc.errors import InvalidParams
from compat.base import Attachment, TurnRequest
from compat.settings import Limits, Timeouts
from orchestrator.attachments import safe_name
from orchestrator.models import TurnParams
from orchestrator.registry import ProviderRegistry
from orchestrator.service import Orchestrator
from tests.helpers import in_background
from tests.orchestrator.fake_adapter import FakeAdapter

pytestmark = pytest.mark.timeout(30)
NOTES = b"hello from the app's machine\n"


@pytest.fixture
async def orch(tmp_path: Path):
    adapter = FakeAdapter("fake")
    registry = ProviderRegistry({"fake": adapter}, {"fake"})
    limits = Limits(max_attachment_bytes=1000, max_turn_attachment_bytes=1500)
    async with in_background(Orchestrator(registry, [tmp_path.resolve()], limits, Timeouts())) as o:
        o.adapter = adapter  # type: ignore[attr-defined]
        yield o


def inline(name: str, data: bytes, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "mimeType": "text/plain",
        "content": base64.b64encode(data).decode(),
        "sizeBytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        **extra,
    }


async def turn(orch: Orchestrator, cwd: Path, attachments: list, inline_attachments: list, session: str = "s1") -> Any:
    params = TurnParams.model_validate(
        {
            "sessionId": session,
            "taskPrompt": "summarise",
            "workingDirectory": str(cwd),
            "attachments": attachments,
            "inlineAttachments": inline_attachments,
        }
    )
    return await orch.run_turn(params, "local", lambda *_: None, start=True)


def sent(orch: Any) -> tuple[Attachment, ...]:
    return orch.adapter.sessions[-1].turns[-1].attachments


async def test_a_path_from_another_machine_is_taken_from_its_inline_copy(orch, tmp_path: Path) -> None:
    source = "/Users/someone/Desktop/notes.txt"
    entry = {"name": "notes.txt", "description": "text/plain", "path": source}
    result = await turn(orch, tmp_path, [entry], [inline("notes.txt", NOTES, sourcePath=source)])
    assert result.status == "completed"
    written = tmp_path / ".xworkmate" / "attachments" / result.turn_id / "notes.txt"
    assert written.read_bytes() == NOTES
    assert sent(orch) == (Attachment("notes.txt", str(written), "text/plain"),)


async def test_a_data_url_and_an_empty_path_match_by_name(orch, tmp_path: Path) -> None:
    copy = inline("a.txt", NOTES)
    copy["content"] = "data:text/plain;base64," + copy["content"]
    result = await turn(orch, tmp_path, [{"name": "a.txt", "path": ""}], [copy])
    assert Path(sent(orch)[0].path).read_bytes() == NOTES and result.status == "completed"


async def test_a_usable_local_path_writes_no_copy(orch, tmp_path: Path) -> None:
    local = tmp_path / "notes.txt"
    local.write_bytes(NOTES)
    entry = {"name": "notes.txt", "path": str(local)}
    await turn(orch, tmp_path, [entry], [inline("notes.txt", NOTES, sourcePath=str(local))])
    assert sent(orch)[0].path == str(local.resolve())
    assert not (tmp_path / ".xworkmate").exists()


async def test_an_entry_with_neither_a_usable_path_nor_an_inline_copy_is_refused(orch, tmp_path: Path) -> None:
    with pytest.raises(InvalidParams) as err:
        await turn(orch, tmp_path, [{"name": "x", "path": "/elsewhere/x"}], [inline("other", NOTES)])
    assert err.value.data["field"] == "attachments.0.path"


@pytest.mark.parametrize(
    "change,field,limit",
    [
        ({"sha256": "0" * 64}, "inlineAttachments.0.sha256", None),
        ({"sizeBytes": 3}, "inlineAttachments.0.sizeBytes", None),
        ({"content": "not base64!"}, "inlineAttachments.0.content", None),
        (
            {"content": base64.b64encode(b"x" * 1001).decode(), "sizeBytes": None, "sha256": None},
            None,
            "maxAttachmentBytes",
        ),
    ],
)
async def test_a_bad_or_oversized_inline_copy_is_refused_and_nothing_is_written(
    orch, tmp_path: Path, change, field, limit
) -> None:
    copy = {**inline("n.txt", NOTES), **change}
    with pytest.raises(InvalidParams) as err:
        await turn(orch, tmp_path, [{"name": "n.txt", "path": ""}], [copy])
    if field:
        assert err.value.data["field"] == field
    if limit:
        assert err.value.data["limit"] == limit
    assert not (tmp_path / ".xworkmate").exists()


async def test_the_per_turn_cap_counts_every_copy(orch, tmp_path: Path) -> None:
    entries = [{"name": f"{i}.bin", "path": ""} for i in range(2)]
    with pytest.raises(InvalidParams) as err:
        await turn(orch, tmp_path, entries, [inline(f"{i}.bin", b"y" * 800) for i in range(2)])
    assert err.value.data["limit"] == "maxTurnAttachmentBytes"


@pytest.mark.parametrize("planted", [".xworkmate", ".xworkmate/attachments"])
async def test_a_symlinked_folder_is_never_followed(orch, tmp_path: Path, planted: str) -> None:
    cwd, target = tmp_path / "repo", tmp_path / "elsewhere"
    cwd.mkdir()
    target.mkdir()
    link = cwd / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    with pytest.raises(InvalidParams, match="symbolic link"):
        await turn(orch, cwd, [{"name": "n.txt", "path": ""}], [inline("n.txt", NOTES)])
    assert list(target.iterdir()) == []


async def test_names_are_sanitised_and_kept_apart(orch, tmp_path: Path) -> None:
    entries = [{"name": n, "path": ""} for n in ("../../etc/passwd", ".bashrc", "passwd")]
    copies = [inline(n, NOTES) for n in ("../../etc/passwd", ".bashrc", "passwd")]
    await turn(orch, tmp_path, entries, copies)
    names = [Path(a.path).name for a in sent(orch)]
    assert names == ["passwd", "bashrc", "passwd-2"]
    assert all(Path(a.path).parent.parent == tmp_path / ".xworkmate" / "attachments" for a in sent(orch))


def test_safe_name_bounds_length_and_strips_control_characters() -> None:
    assert safe_name("a\x00b\nc.txt", set()) == "a_b_c.txt"
    assert safe_name("", set()) == "attachment"
    assert len(safe_name("é" * 500 + ".pdf", set()).encode()) <= 200


async def test_the_copies_are_removed_with_their_session(orch, tmp_path: Path) -> None:
    result = await turn(orch, tmp_path, [{"name": "n.txt", "path": ""}], [inline("n.txt", NOTES)])
    folder = tmp_path / ".xworkmate" / "attachments" / result.turn_id
    assert folder.is_dir()
    await orch.close("s1", "local")
    assert not folder.exists() and not (tmp_path / ".xworkmate").exists()


def test_text_only_providers_get_a_note_with_the_paths() -> None:
    request = TurnRequest(
        session_id="s",
        thread_id="s",
        turn_id="t",
        prompt="summarise",
        working_directory="/w",
        attachments=(Attachment("n.txt", "/w/.xworkmate/attachments/t/n.txt", "text/plain"),),
    )
    assert (
        request.text_prompt() == "summarise\n\nAttached files:\n- n.txt: /w/.xworkmate/attachments/t/n.txt (text/plain)"
    )
