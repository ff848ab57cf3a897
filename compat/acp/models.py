"""Model selection for an ACP session, in the order real agents support it.

1. ``session/set_config_option`` on the config option whose ``category`` is ``model`` (the
   current spec; codex, opencode).
2. The legacy ``session/set_model`` when ``session/new`` returned ``models`` (gemini 0.61).
3. The provider's ``modelFlag`` on the command line; changing it needs a new process.

Source: acp-and-real-agents.md §0 (fact 1) and §1 "Sessions".

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from bridge.rpc.redact import redact
from compat.acp.connection import AcpConnection
from compat.base import StatusEvent, TurnEvent
from compat.peer import ResponseError

ModelApi = Literal["config", "models", "flag"]


class ModelState:
    """What the current ACP session offers for model selection, and what was applied."""

    def __init__(self, model_flag: str | None) -> None:
        self._flag = model_flag
        self._result: dict[str, Any] = {}
        self._applied: str | None = None
        self.api: ModelApi | None = None

    def remember(self, session_result: dict[str, Any]) -> None:
        """Take the ``session/new`` or ``session/load`` result of a new current session."""
        self._result = session_result
        self._applied = None
        if model_option(session_result) is not None:
            self.api = "config"
        elif isinstance(session_result.get("models"), dict):
            self.api = "models"
        else:
            self.api = "flag" if self._flag else None

    def needs_relaunch(self, conn: AcpConnection, model: str | None) -> bool:
        """Only a new command line can change the model of a flag-only agent."""
        return model is not None and self.api == "flag" and conn.launch_model != model

    async def apply(
        self,
        conn: AcpConnection,
        session_id: str,
        model: str | None,
        emit: Callable[[TurnEvent], None],
    ) -> str | None:
        """Apply ``model`` to the session if it is not already.

        A refusal is not a turn failure: the turn runs on the agent's current model and a
        ``StatusEvent("model_not_applied")`` says why.

        Returns:
            The applied model (``TurnOutcome.resolved_model``), or None if nothing was applied.
        """
        if model is None or self._applied == model:
            return model
        option = model_option(self._result)
        try:
            if option is not None:
                await self._set_option(conn, session_id, option, model)
            elif self.api == "models":
                if self._result["models"].get("currentModelId") != model:
                    await conn.set_model(session_id, model)
            elif conn.launch_model != model:
                emit(_not_applied("agent has no model selection", {"model": model}))
                return None
        except ResponseError as exc:
            emit(_not_applied(redact(exc.message), {"model": model, "code": exc.code}))
            return None
        self._applied = model
        return model

    async def apply_options(
        self,
        conn: AcpConnection,
        session_id: str,
        values: Mapping[str, str],
        emit: Callable[[TurnEvent], None],
    ) -> None:
        """Set the session's other config options (``{configId: value}``, an editor's choice of
        mode or thought level) where the agent's current value differs; a refusal is a
        ``StatusEvent("config_option_not_applied")``, not a turn failure."""
        options = self._result.get("configOptions")
        current = (
            {o.get("id"): o.get("currentValue") for o in options if isinstance(o, dict)}
            if isinstance(options, list)
            else {}
        )
        for config_id, value in values.items():
            if config_id not in current or current[config_id] == value:
                continue
            try:
                result = await conn.set_config_option(session_id, config_id, value)
            except ResponseError as exc:
                data = {"configId": config_id, "value": value, "code": exc.code}
                emit(StatusEvent(event="config_option_not_applied", message=redact(exc.message), data=data))
                continue
            if isinstance(result.get("configOptions"), list):
                self._result["configOptions"] = result["configOptions"]

    async def _set_option(self, conn: AcpConnection, session_id: str, option: dict[str, Any], model: str) -> None:
        if option.get("currentValue") == model:
            return
        result = await conn.set_config_option(session_id, option["id"], model)
        if isinstance(result.get("configOptions"), list):  # the answer is the complete list
            self._result["configOptions"] = result["configOptions"]


def model_option(session_result: dict[str, Any]) -> dict[str, Any] | None:
    """The first config option with ``category: "model"``, if any."""
    options = session_result.get("configOptions")
    for option in options if isinstance(options, list) else []:
        is_model = isinstance(option, dict) and option.get("category") == "model"
        if is_model and isinstance(option.get("id"), str):
            return option
    return None


def _not_applied(message: str, data: dict[str, Any]) -> StatusEvent:
    return StatusEvent("model_not_applied", message, data)
