"""Workspace policy: where turns may run and which files they may attach (docs/api.md
"session.start": ``workingDirectory`` and ``attachments`` resolve, symlinks followed, inside the
workspace roots).

Must not import: ``bridge`` (except ``bridge.rpc``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.rpc.errors import InvalidParams
from compat.base import Attachment

if TYPE_CHECKING:  # pydantic: the params models are imported on first use (compat.settings)
    from orchestrator.models import AttachmentParam

log = logging.getLogger(__name__)
_MAX_SHOWN = 600  # characters of a client's path quoted back in an error


class Workspace:
    """The workspace roots and the checks every turn's paths pass.

    Args:
        roots: resolved absolute folders (``workspaceRoots``).
    """

    def __init__(self, roots: Sequence[Path]) -> None:
        self.roots = list(roots)

    def warn_missing(self) -> None:
        for root in self.roots:
            if not root.is_dir():
                log.warning("workspace root %s does not exist: turns cannot run there", root)

    def working_directory(self, requested: str | None) -> str:
        """The resolved directory a turn runs in (default: the first root that exists).

        Raises:
            InvalidParams: -32602 (``field: workingDirectory``), not an existing directory inside
                a root, or no root exists.
        """
        if requested is None:
            for root in self.roots:
                if root.is_dir():
                    return str(root)
            raise InvalidParams("no workspace root exists; create one or fix workspaceRoots", field="workingDirectory")
        real = _resolve(requested, "workingDirectory")
        if not real.is_dir():
            raise InvalidParams(
                f"workingDirectory is not an existing directory: {requested}"[:_MAX_SHOWN], field="workingDirectory"
            )
        if not self.contains(real):
            raise InvalidParams(
                f"workingDirectory is outside the workspace roots: {requested}"[:_MAX_SHOWN], field="workingDirectory"
            )
        return str(real)

    def usable_attachments(self, items: Sequence[AttachmentParam]) -> dict[int, Attachment]:
        """The entries whose path is usable on this host (it resolves, symlinks followed, to an
        existing file or folder inside a root), by index; the others need an inline copy
        (``orchestrator.attachments``)."""
        out = {}
        for index, item in enumerate(items):
            if not item.path:
                continue
            try:
                real = Path(os.path.expanduser(item.path)).resolve()
            except (ValueError, OSError):
                continue  # NUL bytes, over-long: not usable here
            if self.contains(real) and real.exists():
                out[index] = Attachment(item.name or real.name, str(real), item.description)
        return out

    def contains(self, path: Path) -> bool:
        return any(path == root or root in path.parents for root in self.roots)


def _resolve(path: str, field: str) -> Path:
    """``realpath`` of a client path; NUL bytes and over-long paths are -32602, not crashes."""
    try:
        return Path(os.path.expanduser(path)).resolve()
    except (ValueError, OSError) as exc:
        raise InvalidParams(f"{field} is not a usable path", field=field) from exc
