"""Files a turn made, returned as result ``artifacts`` so a client on another machine can show and
save them (docs/api.md "Artifacts"; the original bridge's shape, xworkmate-original.md).

Before the turn the working directory is listed (size and modification time of each file), after
it listed again; files that are new or changed are the turn's artifacts, newest first. Listing
never follows a symbolic link and skips ``.xworkmate/``, dot folders, ``node_modules``, ``build``
and ``.dart_tool``; it stops at ``limits.maxArtifactScanFiles`` files, and then the result has no
artifacts and says so (``artifactsOmitted``). Each artifact is
``{relativePath, label, contentType, encoding: "base64", content, sizeBytes, sha256}``; once the
result's content would pass ``limits.maxArtifactResultBytes`` (base64), or for a file larger than
:data:`MAX_FILE_BYTES`, the file is listed without ``encoding`` and ``content``.

Blocking (it walks and reads files): run both steps in a worker thread.

Must not import: ``bridge`` (except ``bridge.rpc``).
"""

from __future__ import annotations

import base64
import hashlib
import mimetypes
import os
import stat
from typing import Any

from orchestrator import files

MAX_ARTIFACTS = 24  # the original bridge's bounds
MAX_FILE_BYTES = 2 * 1024 * 1024
SKIPPED = frozenset({"node_modules", "build", ".dart_tool", ".git", ".xworkmate"})

Listing = dict[str, tuple[int, int]]
"""``{relative path: (size in bytes, modification time in ns)}``."""


class TooManyFiles(Exception):
    """The working directory holds more files than the scan may read."""


def listing(root: str, max_files: int, skip: str | None = None) -> Listing:
    """The regular files under ``root`` (links not followed, skipped folders left out, and the
    folder ``skip``: the remote workspaces, when ``root`` holds them).

    Raises:
        TooManyFiles: more than ``max_files`` entries (files and folders both count, so a tree
            of empty folders costs no more than one of files).
    """
    found: Listing = {}
    stack, seen = [""], 0
    while stack:
        rel = stack.pop()
        where = os.path.join(root, rel) if rel else root
        try:
            entries = list(os.scandir(where))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > max_files:
                raise TooManyFiles
            path = f"{rel}/{entry.name}" if rel else entry.name
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                if entry.name not in SKIPPED and not entry.name.startswith(".") and entry.path != skip:
                    stack.append(path)
            elif stat.S_ISREG(info.st_mode):
                found[path] = (info.st_size, info.st_mtime_ns)
    return found


def changed(
    root: str, before: Listing, max_files: int, max_result_bytes: int, skip: str | None = None
) -> tuple[list[dict[str, Any]], str]:
    """The artifacts of the files new or changed since ``before``, and why some are missing
    ("" when none is): at most :data:`MAX_ARTIFACTS`, newest first."""
    try:
        after = listing(root, max_files, skip)
    except TooManyFiles:
        return [], f"more than {max_files} files in the working directory (maxArtifactScanFiles): no artifacts"
    fresh = sorted((p for p, v in after.items() if before.get(p) != v), key=lambda p: after[p][1], reverse=True)
    note = f"{len(fresh)} files changed; the newest {MAX_ARTIFACTS} are returned" if len(fresh) > MAX_ARTIFACTS else ""
    out, budget = [], max_result_bytes
    for rel in fresh[:MAX_ARTIFACTS]:
        artifact, cost = _artifact(root, rel, after[rel][0], budget)
        if artifact is not None:
            out.append(artifact)
            budget -= cost
            if "content" not in artifact and not note:
                note = f"some files are listed without content (maxArtifactResultBytes {max_result_bytes}, or over {MAX_FILE_BYTES} bytes)"
    return out, note


def _artifact(root: str, rel: str, size: int, budget: int) -> tuple[dict[str, Any] | None, int]:
    kind = mimetypes.guess_type(rel)[0] or "application/octet-stream"
    artifact: dict[str, Any] = {
        "relativePath": rel,
        "label": os.path.basename(rel),
        "contentType": kind,
        "sizeBytes": size,
    }
    encoded_size = 4 * -(-size // 3)
    if size > MAX_FILE_BYTES or encoded_size > budget:
        return artifact, 0
    data = files.read_beneath(root, rel, MAX_FILE_BYTES)  # never through a link, never a FIFO
    if data is None:
        return None, 0  # gone, or replaced by a link or a FIFO since the listing
    if len(data) > MAX_FILE_BYTES:
        return artifact, 0
    artifact.update(
        encoding="base64",
        content=base64.b64encode(data).decode("ascii"),
        sizeBytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )
    return artifact, len(artifact["content"])
