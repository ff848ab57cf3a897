"""Method params validated with their pydantic models, and a failure as -32602 (docs/api.md,
"Errors": ``data.errors`` lists ``loc``, ``type``, ``msg``).

pydantic is imported with the first params model a request needs, not at start (compat.settings
says why), so this module imports it only inside :func:`validated`.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from bridge.rpc.errors import InvalidParams
from compat.settings import SettingsError

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound="BaseModel")


def validated(model: type[M], data: Any, prefix: str = "") -> M:
    """``model.model_validate(data)``.

    Args:
        model: A params model (orchestrator.models, compat.knowledge.params).
        data: The params object (or the part of it at ``prefix``).
        prefix: The dotted location of ``data`` in the params, prefixed to each ``loc``.

    Raises:
        InvalidParams: -32602 (see :func:`invalid_params`).
    """
    from pydantic import ValidationError  # loaded with the model

    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid_params(exc, prefix) from exc


def invalid_params(exc: ValidationError | SettingsError, prefix: str = "") -> InvalidParams:
    """A pydantic or settings error as -32602: ``message`` names the first failing field, and
    ``data.errors`` lists every failure as ``{loc, type, msg}``.

    Args:
        exc: The validation failure; a ``SettingsError`` is already located (compat.settings.convert).
        prefix: For a pydantic error, the dotted location of the validated data in the params.
    """
    if isinstance(exc, SettingsError):
        errors = [{"loc": p.loc, "type": p.type, "msg": p.msg} for p in exc.problems]
    else:
        errors = [
            {"loc": ".".join(str(p) for p in (prefix, *err["loc"]) if p != ""), "type": err["type"], "msg": err["msg"]}
            for err in exc.errors(include_url=False, include_input=False)
        ]
    first = errors[0] if errors else {"loc": prefix, "msg": "invalid"}
    where = f"{first['loc']}: " if first["loc"] else ""
    return InvalidParams(f"Invalid params: {where}{first['msg']}", errors=errors)
