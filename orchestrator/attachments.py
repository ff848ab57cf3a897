"""Attachments from another machine: the desktop app's ``inlineAttachments`` written into the
turn's working directory (docs/api.md "Attachments").

For each ``attachments`` entry the app sends the file's path on *its* machine (or ``""``) and, in
``inlineAttachments``, the bytes (base64, possibly a data URL). An entry whose path is usable here
(it resolves inside the workspace roots to an existing file or folder) is used from that path and its inline copy is
not written, so a local user's repository gets no extra files. Otherwise the inline copy with the
same ``sourcePath`` (failing that, the same ``name``) is decoded, checked (``sizeBytes``,
``sha256``, the per-file and per-turn caps) and written to
``<working directory>/.xworkmate/attachments/<turnId>/<sanitised name>``.

Writing never follows a symbolic link: each folder is opened relative to its parent's descriptor
with ``O_NOFOLLOW`` and each file created with ``O_CREAT | O_EXCL | O_NOFOLLOW``, so everything
written lies inside the working directory even when a component is a link planted there
(``orchestrator.files``). The folder of a turn's copies is removed with its session
(``Session.attachment_folders``), again never through a link.

Must not import: ``bridge`` (except ``bridge.rpc``).
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from bridge.rpc.errors import InvalidParams
from compat.base import Attachment
from orchestrator import files

if TYPE_CHECKING:  # pydantic: the params models are imported on first use
    from orchestrator.models import AttachmentParam, InlineAttachmentParam

log = logging.getLogger(__name__)
FOLDER = (".xworkmate", "attachments")
"""Where inline copies go, under the working directory: ``.xworkmate/attachments/<turnId>/``."""
NAME_BYTES = 200  # a written file's name, at most (UTF-8)
_UNSAFE = re.compile(r"[\x00-\x1f\x7f/\\:]")


class InlineCopy(msgspec.Struct, frozen=True):
    """An inline copy to write for ``attachments`` entry ``index``: ``inlineAttachments[source]``."""

    index: int
    source: int
    name: str
    description: str


def match(
    items: Sequence[AttachmentParam], inline: Sequence[InlineAttachmentParam], usable: dict[int, Attachment]
) -> list[InlineCopy]:
    """The inline copy each entry without a usable path takes: the one with its ``sourcePath``
    (its ``path``), else the one with its ``name`` (no I/O, no decoding).

    Args:
        items: the ``attachments`` entries.
        inline: the ``inlineAttachments`` entries.
        usable: the entries whose path is usable on this host, resolved (by index).

    Raises:
        InvalidParams: -32602 (``field: attachments.<n>.path``), an entry has neither.
    """
    by_source = {c.source_path: m for m, c in enumerate(inline) if c.source_path}
    by_name: dict[str, int] = {}
    for m, c in enumerate(inline):
        by_name.setdefault(c.name, m)
    copies = []
    for index, item in enumerate(items):
        if index in usable:
            continue
        m = by_source.get(item.path) if item.path else None
        if m is None and item.name:
            m = by_name.get(item.name)
        if m is None:
            raise InvalidParams(
                "attachment path is missing or outside the workspace roots, and no inlineAttachments entry "
                "has its sourcePath or name",
                field=f"attachments.{index}.path",
            )
        name = inline[m].name or item.name or Path(item.path).name
        copies.append(InlineCopy(index, m, name, item.description or inline[m].mime_type))
    return copies


def decode_all(
    copies: Sequence[InlineCopy], inline: Sequence[InlineAttachmentParam], *, max_file_bytes: int, max_turn_bytes: int
) -> list[bytes]:
    """Each copy's bytes, checked (blocking for large ones: run it in a worker thread).

    Args:
        max_file_bytes / max_turn_bytes: ``limits.maxAttachmentBytes`` and
            ``limits.maxTurnAttachmentBytes`` (decoded bytes).

    Raises:
        InvalidParams: -32602 (``field: inlineAttachments.<m>.…``): not base64, a ``sizeBytes`` or
            ``sha256`` that does not match, or a cap passed (``data.limit`` names it).
    """
    out, total = [], 0
    for copy in copies:
        data = _decode(inline[copy.source], copy.source, max_file_bytes)
        total += len(data)
        if total > max_turn_bytes:
            raise InvalidParams(
                f"inline attachments pass maxTurnAttachmentBytes ({max_turn_bytes} bytes)",
                field=f"inlineAttachments.{copy.source}.content",
                limit="maxTurnAttachmentBytes",
                value=max_turn_bytes,
            )
        out.append(data)
    return out


def _decode(copy: InlineAttachmentParam, m: int, max_file_bytes: int) -> bytes:
    field = f"inlineAttachments.{m}.content"
    text = copy.content.rpartition(",")[2]  # a data URL: what follows the last comma
    if len(text) > 4 * (max_file_bytes // 3 + 1) + len(text) // 76 * 2:  # before decoding: no huge copy
        raise InvalidParams(
            f"inline attachment passes maxAttachmentBytes ({max_file_bytes} bytes)",
            field=field,
            limit="maxAttachmentBytes",
            value=max_file_bytes,
        )
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidParams("inline attachment content is not base64", field=field) from None
    if len(data) > max_file_bytes:
        raise InvalidParams(
            f"inline attachment passes maxAttachmentBytes ({max_file_bytes} bytes)",
            field=field,
            limit="maxAttachmentBytes",
            value=max_file_bytes,
        )
    if copy.size_bytes is not None and copy.size_bytes != len(data):
        raise InvalidParams(
            f"inline attachment is {len(data)} bytes, not sizeBytes {copy.size_bytes}",
            field=f"inlineAttachments.{m}.sizeBytes",
        )
    if copy.sha256 and hashlib.sha256(data).hexdigest() != copy.sha256.strip().lower():
        raise InvalidParams("inline attachment does not match its sha256", field=f"inlineAttachments.{m}.sha256")
    return data


def safe_name(name: str, taken: set[str]) -> str:
    """``name`` as a file name of its own: its last path component, without control characters,
    separators or leading dots, at most :data:`NAME_BYTES` bytes, ``attachment`` when nothing is
    left, and ``-2``, ``-3`` … before the suffix when ``taken`` has it."""
    base = re.split(r"[/\\]", name)[-1]
    base = _UNSAFE.sub("_", base).strip().lstrip(".") or "attachment"
    stem, dot, suffix = base.rpartition(".") if "." in base else (base, "", "")
    if len(suffix.encode()) > 32:  # not an extension: part of the name, cut with it
        stem, dot, suffix = base, "", ""
    budget = NAME_BYTES - len((dot + suffix).encode()) - 4
    stem = stem.encode()[: max(budget, 16)].decode("utf-8", "ignore") or "attachment"
    candidate, n = f"{stem}{dot}{suffix}", 1
    while candidate.lower() in taken:
        n += 1
        candidate = f"{stem}-{n}{dot}{suffix}"
    taken.add(candidate.lower())
    return candidate


def write(cwd: str, turn_id: str, copies: Sequence[InlineCopy], data: Sequence[bytes]) -> list[Attachment]:
    """Write ``copies`` (with their ``data``) into ``<cwd>/.xworkmate/attachments/<turn_id>/``
    (blocking: run it in a worker thread); returns the attachments, in order.

    Raises:
        InvalidParams: -32602 (``field: attachments``), a component of the folder is a symbolic
            link or not a folder, or the files cannot be written (the message says which).
    """
    folder = os.path.join(cwd, *FOLDER, turn_id)
    try:
        with files.folder_beneath(cwd, (*FOLDER, turn_id), create=True) as fd:
            taken: set[str] = set()
            out = []
            for copy, content in zip(copies, data, strict=True):
                name = safe_name(copy.name, taken)
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                with os.fdopen(os.open(name, flags, 0o600, dir_fd=fd), "wb") as file:
                    file.write(content)
                out.append(Attachment(copy.name, os.path.join(folder, name), copy.description))
            return out
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EEXIST):
            why = "a symbolic link or not a folder"
        else:
            why = exc.strerror or str(exc)
        log.warning("cannot write inline attachments under %s: %s", cwd, exc)
        raise InvalidParams(
            f"cannot write inline attachments into {os.path.join(*FOLDER)} of the working directory: {why}",
            field="attachments",
        ) from None


def remove(written: Sequence[tuple[str, str]]) -> None:
    """Remove the folders of written copies, ``(working directory, turn id)`` each (blocking),
    never through a link (``orchestrator.files.remove_beneath``); failures are logged."""
    for cwd, turn_id in written:
        try:
            files.remove_beneath(cwd, (*FOLDER, turn_id))
        except OSError as exc:
            log.warning("cannot remove the inline attachments of %s under %s: %s", turn_id, cwd, exc)
