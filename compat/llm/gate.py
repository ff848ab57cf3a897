"""The trust gate: what a principal may ask for (docs/api.md "Principals").

``llm.*`` fails closed: a principal gets the default runtime and its model, and naming another
runtime or model is refused unless its ``principals.<name>.llm`` entry allows that one override
(a model allowed does not allow a provider). ``session.*`` turns stay open by default; a
``principals.<name>.turns`` entry narrows the providers and models they may use.

Source: the issue "One-shot model calls for clients" (the trust gate), after Hermes' plugin
``ctx.llm`` gate.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from collections.abc import Mapping

from bridge.rpc.errors import InvalidParams, LlmOverrideDenied, NotFound
from compat.llm.settings import ANY, LlmGrant, LlmSettings, ModelRuntime, PrincipalSettings, TurnGrant, allows

_OPEN = PrincipalSettings()


class Gate:
    """The ``principals`` table, with defaults for a principal it does not name."""

    def __init__(self, principals: Mapping[str, PrincipalSettings] | None = None) -> None:
        self._principals = dict(principals or {})

    def settings(self, principal: str) -> PrincipalSettings:
        return self._principals.get(principal, _OPEN)

    def llm(self, principal: str) -> LlmGrant:
        return self.settings(principal).llm

    def turns(self, principal: str) -> TurnGrant:
        return self.settings(principal).turns

    def turn_provider(self, principal: str, provider_id: str) -> bool:
        """Whether ``principal``'s turns may run on ``provider_id``."""
        return allows(self.turns(principal).allowed_providers, provider_id)

    def turn_model(self, principal: str, model: str) -> bool:
        """Whether ``principal``'s turns may name ``model`` (an empty name is the provider's own)."""
        grant = self.turns(principal)
        return not model or (grant.allow_model_override and allows(grant.allowed_models, model))

    def choose(
        self, settings: LlmSettings, principal: str, provider: str | None, model: str | None
    ) -> tuple[ModelRuntime, str]:
        """The runtime and model of a call that named ``provider`` and ``model`` (None: the default).

        Raises:
            LlmOverrideDenied: -32007, the principal may not name them (``data.argument``,
                ``data.configKey``), or may not call ``llm.*`` at all.
            NotFound: -32004, no runtime is configured (``llm.runtimes``).
            InvalidParams: -32602, an allowed ``provider`` that is not a configured runtime.
        """
        grant = self.llm(principal)
        if not grant.enabled:
            raise _denied(principal, "method", "enabled", "this principal may not call llm.*")
        default = settings.default_runtime
        if default is None:
            raise NotFound("no model runtime is configured (llm.runtimes)")
        runtime = default
        if provider and provider != default.id:
            if not grant.allow_provider_override:
                raise _denied(
                    principal, "provider", "allowProviderOverride", f"provider {provider[:100]} is not allowed"
                )
            if not allows(grant.allowed_providers, provider):
                raise _denied(principal, "provider", "allowedProviders", f"provider {provider[:100]} is not allowed")
            found = settings.runtime(provider)
            if found is None:
                known = ", ".join(r.id for r in settings.runtimes)
                raise InvalidParams(f"unknown provider {provider[:100]} (configured: {known})", field="provider")
            runtime = found
        if model and model != runtime.model:
            if not grant.allow_model_override:
                raise _denied(principal, "model", "allowModelOverride", f"model {model[:100]} is not allowed")
            if not allows(grant.allowed_models, model):
                raise _denied(principal, "model", "allowedModels", f"model {model[:100]} is not allowed")
            return runtime, model
        return runtime, runtime.model

    def llm_view(self, settings: LlmSettings, principal: str) -> dict[str, object]:
        """What ``acp.capabilities`` tells ``principal`` about ``llm.*``: ``{available,
        defaultProvider, defaultModel, providers, allowModelOverride, allowedModels}``."""
        grant = self.llm(principal)
        default = settings.default_runtime
        if default is None or not grant.enabled:
            return {"available": False, "providers": [], "allowModelOverride": False}
        providers = [default.id]
        if grant.allow_provider_override:
            providers += [
                r.id for r in settings.runtimes if r.id != default.id and allows(grant.allowed_providers, r.id)
            ]
        view: dict[str, object] = {
            "available": True,
            "defaultProvider": default.id,
            "defaultModel": default.model,
            "providers": providers,
            "allowModelOverride": grant.allow_model_override,
        }
        if grant.allow_model_override:
            view["allowedModels"] = ANY if grant.allowed_models == ANY else list(grant.allowed_models)
        return view


def _denied(principal: str, argument: str, key: str, what: str) -> LlmOverrideDenied:
    config_key = f"principals.{principal}.llm.{key}"
    return LlmOverrideDenied(
        f"{what} for {principal} (set {config_key} to allow it)", argument=argument, configKey=config_key
    )
