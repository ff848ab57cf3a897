"""Reading untrusted JSON from knowledge sources: a member that should be an object or a list,
or an empty one of that kind when it is anything else. No I/O.

Must not import: ``bridge`` or ``orchestrator``.
"""

from __future__ import annotations

from typing import Any


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else ``{}``."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """``value`` when it is a JSON array, else ``[]``."""
    return value if isinstance(value, list) else []
