"""Where commands are found: ``PATH``, then the ``make agents`` cache.

``make agents`` (scripts/install-agents.sh) installs the pinned agents into a cache outside the
work tree, one prefix per agent and version: npm agents expose ``<prefix>/node_modules/.bin/<name>``,
hermes is a virtualenv with ``<prefix>/bin/hermes``.

Must not import: ``bridge`` or ``orchestrator``.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path


def agents_dir() -> Path:
    """The ``make agents`` cache: ``$XWORKMATE_AGENTS_DIR``, else
    ``${XDG_CACHE_HOME:-~/.cache}/xworkmate-bridge/agents``."""
    explicit = os.environ.get("XWORKMATE_AGENTS_DIR")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "xworkmate-bridge" / "agents"


def find_command(name: str | None) -> str | None:
    """Resolve a command to an executable path.

    A name with a path separator must itself be an executable file. Otherwise ``PATH`` is
    searched first, then the ``make agents`` cache (``*/node_modules/.bin/<name>``, then
    ``*/bin/<name>``), newest version first.

    Returns:
        The absolute path, or None when nothing executable matches.
    """
    if not name:
        return None
    if os.sep in name or (os.altsep and os.altsep in name):
        path = Path(name).expanduser()
        return os.path.abspath(path) if _executable(path) else None
    found = shutil.which(name)
    if found:
        return found
    root = agents_dir()
    for pattern in (f"*/node_modules/.bin/{name}", f"*/bin/{name}"):
        candidates = sorted(
            root.glob(pattern),
            key=lambda path: version_key(path.relative_to(root).parts[0]),
            reverse=True,
        )
        for path in candidates:
            if _executable(path):
                return str(path)
    return None


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def version_key(install_dir: str) -> list[tuple[int, int | str]]:
    # "gemini-cli-0.61.0" sorts after "gemini-cli-0.9.0": digit runs compare as numbers.
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", install_dir) if p]
