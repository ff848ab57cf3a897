"""The knowledge source registry: sources and a runtime connection registered at run time.

``knowledge.sources.add|update|remove|select`` (and the settings page's REST surface, which runs
the same methods) change it; every change is written to ``<stateDir>/knowledge-registry.json``
(``compat.knowledge.registry_file``) before it takes effect, so a restarted bridge serves the same
sources. Registered sources join the configured ones in the ``KnowledgeService``: knowledge turns
use them and ``knowledge.sources`` lists them (``registered: true``). The registered runtime, when
set, replaces ``knowledge.runtime``; its API key stays on the server and is sent only as the
runtime's ``Authorization`` header.

Rules (docs/api.md "Knowledge source registry"): URLs obey the request-source origin policy
(``knowledge.requestSources.allowedOrigins``) and ``local-wiki`` roots must lie inside the
workspace roots (``compat.knowledge.policy.check_registered``); ids are unique among configured
and registered sources. A stored source that no longer passes (the configuration changed) is kept
in the file but not used (``usable: false`` with its ``reason``). Who may call it
(``adminPrincipals``) is checked by the method handlers.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio
import msgspec

from bridge.rpc.errors import InvalidParams, LimitReached, RpcError
from bridge.rpc.redact import register_secret
from compat.knowledge.errors import KnowledgeNotFound
from compat.knowledge.policy import check_registered
from compat.knowledge.registry_file import REGISTRY_FILE, RegistryData, RegistryFile, RuntimeConnection
from compat.knowledge.runtime import RuntimeClient
from compat.knowledge.settings import RuntimeSettings, SourceDescriptor
from compat.params import invalid_params
from compat.settings import SettingsError, convert

if TYPE_CHECKING:
    import httpx

    from compat.knowledge.service import KnowledgeService

log = logging.getLogger(__name__)
MAX_REGISTERED = 64
"""Registered sources at most (each may be asked on every turn)."""
UNSET: Any = object()


class KeyedRuntimeClient(RuntimeClient):
    """The runtime pool, sending the registered API key (``key``) on every call when one is set."""

    def __init__(self) -> None:
        super().__init__()
        self.key = ""

    def get(self) -> httpx.AsyncClient:
        client = super().get()
        if self.key:
            client.headers["authorization"] = f"Bearer {self.key}"
        else:
            client.headers.pop("authorization", None)
        return client


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc.lower()


def _runtime_url(url: str) -> str:
    """``url`` if it is an absolute http(s) URL without credentials.

    Raises:
        InvalidParams: -32602 SOURCE_URL_INVALID / SOURCE_URL_CREDENTIALS at ``runtime.baseUrl``.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidParams(
            "runtime baseUrl must be an absolute http(s) URL", field="runtime.baseUrl", reason="SOURCE_URL_INVALID"
        )
    if parts.username is not None or parts.password is not None:
        raise InvalidParams(
            "runtime baseUrl must not include credentials", field="runtime.baseUrl", reason="SOURCE_URL_CREDENTIALS"
        )
    return url


class KnowledgeRegistry:
    """The registered sources and runtime of one ``KnowledgeService`` (``service.registry``).

    Args:
        service: the service whose sources and runtime it extends; its configured sources and
            settings at this moment are the base the registry adds to.
        file: where the registry is kept.
    """

    def __init__(self, service: KnowledgeService, file: RegistryFile) -> None:
        self.service = service
        self.file = file
        self.configured = dict(service.descriptors)
        self.base_settings = service.settings
        self.pool = KeyedRuntimeClient()
        service.runtime_pool = self.pool
        self.data = file.load()
        self.usable: dict[str, SourceDescriptor] = {}
        self.blocked: dict[str, str] = {}  # stored id -> why it is not used
        self._lock = anyio.Lock()
        self._runtime_listeners: list[Callable[[RuntimeConnection | None], None]] = []
        self._apply()
        service.registry = self

    @classmethod
    def attach(cls, service: KnowledgeService, state_dir: Path) -> KnowledgeRegistry:
        """The registry kept in ``state_dir``, attached to ``service``."""
        return cls(service, RegistryFile(state_dir / REGISTRY_FILE))

    @property
    def ids(self) -> set[str]:
        return {str(raw.get("id")) for raw in self.data.sources}

    # ---- validation -------------------------------------------------------------------------------

    def _validated(self, raw: dict[str, Any], field: str) -> SourceDescriptor:
        try:
            desc = convert(raw, SourceDescriptor, field)
        except SettingsError as exc:
            raise invalid_params(exc) from exc
        if desc.id in self.configured:
            raise InvalidParams(
                f"knowledge source id {desc.id!r} is configured; choose another id",
                field=f"{field}.id",
                reason="DUPLICATE_SOURCE_ID",
            )
        policy = self.base_settings.request_sources
        return check_registered(desc, field, policy, self.service.roots)

    def _stored(self, source_id: str) -> int:
        for index, raw in enumerate(self.data.sources):
            if raw.get("id") == source_id:
                return index
        if source_id in self.configured:
            raise InvalidParams(
                "this knowledge source is configured, not registered", field="sourceId", reason="SOURCE_NOT_REGISTERED"
            )
        raise KnowledgeNotFound("no registered knowledge source has this id", sourceId=source_id)

    # ---- the methods ------------------------------------------------------------------------------

    async def add(self, source: dict[str, Any], probe: bool = True) -> dict[str, Any]:
        """``knowledge.sources.add``.

        Raises:
            InvalidParams: -32602, a bad or refused descriptor, or an id already in use
                (``DUPLICATE_SOURCE_ID``).
            LimitReached: -32006, :data:`MAX_REGISTERED` sources are registered.
        """
        async with self._lock:
            desc = self._validated(source, "source")
            if desc.id in self.ids:
                raise InvalidParams(
                    f"knowledge source id {desc.id!r} is already registered",
                    field="source.id",
                    reason="DUPLICATE_SOURCE_ID",
                )
            if len(self.data.sources) >= MAX_REGISTERED:
                raise LimitReached(f"{MAX_REGISTERED} knowledge sources are registered", limit="registeredSources")
            await self._commit([*self.data.sources, msgspec.to_builtins(desc)], self.data.runtime, {desc.id})
        return await self._answer(desc.id, probe)

    async def update(self, source_id: str, changes: dict[str, Any], probe: bool = True) -> dict[str, Any]:
        """``knowledge.sources.update``: ``changes`` replaces fields of the stored source.

        Raises:
            KnowledgeNotFound: -32004, no registered source has this id.
            InvalidParams: -32602, a configured id, an id change, or a refused result.
        """
        async with self._lock:
            index = self._stored(source_id)
            if changes.get("id", source_id) != source_id:
                raise InvalidParams("a source's id cannot change", field="source.id", reason="SOURCE_ID_CHANGED")
            merged = {**self.data.sources[index], **changes}
            desc = self._validated(merged, "source")
            sources = list(self.data.sources)
            sources[index] = msgspec.to_builtins(desc)
            await self._commit(sources, self.data.runtime, {source_id})
        return await self._answer(source_id, probe)

    async def remove(self, source_id: str) -> dict[str, Any]:
        """``knowledge.sources.remove``.

        Raises:
            KnowledgeNotFound / InvalidParams: as for :meth:`update`.
        """
        async with self._lock:
            index = self._stored(source_id)
            sources = [s for i, s in enumerate(self.data.sources) if i != index]
            await self._commit(sources, self.data.runtime, {source_id})
        return self.view()

    async def select(self, source_ids: Sequence[str] | None = None, runtime: Any = UNSET) -> dict[str, Any]:
        """``knowledge.sources.select``: which registered sources turns use (``source_ids``: the
        others are disabled; None leaves them) and the runtime (a dict sets it, None clears it,
        :data:`UNSET` leaves it). With neither it only returns the registry.

        Raises:
            KnowledgeNotFound / InvalidParams: an id that is not registered; a bad runtime URL.
        """
        async with self._lock:
            sources, changed = self.data.sources, set()
            if source_ids is not None:
                for source_id in source_ids:
                    self._stored(source_id)
                wanted = set(source_ids)
                sources = [{**s, "enabled": s.get("id") in wanted} for s in self.data.sources]
                changed = {str(s["id"]) for s, o in zip(sources, self.data.sources, strict=True) if s != o}
            connection = self.data.runtime if runtime is UNSET else self._connection(runtime)
            if source_ids is not None or runtime is not UNSET:
                await self._commit(sources, connection, changed)
        return self.view()

    def _connection(self, runtime: dict[str, Any] | None) -> RuntimeConnection | None:
        if runtime is None:
            return None
        base_url = _runtime_url(runtime["base_url"])
        old = self.data.runtime
        key = runtime.get("api_key")
        if key is None:  # kept only for the same origin: a key is never sent to a new host unasked
            key = old.api_key if old is not None and _origin(old.base_url) == _origin(base_url) else ""
        timeout = runtime.get("timeout_seconds") or (old.timeout_seconds if old else 0) or 60.0
        return RuntimeConnection(base_url=base_url, model=runtime["model"], api_key=key, timeout_seconds=timeout)

    # ---- state ------------------------------------------------------------------------------------

    async def _commit(
        self, sources: list[dict[str, Any]], runtime: RuntimeConnection | None, changed: set[str]
    ) -> None:
        """Persist, then serve: a write that fails changes nothing."""
        data = RegistryData(sources=sources, runtime=runtime)
        await anyio.to_thread.run_sync(self.file.save, data)
        self.data = data
        self._apply()
        for source_id in changed:
            self.service.forget(source_id)

    def on_runtime(self, listener: Callable[[RuntimeConnection | None], None]) -> None:
        """Call ``listener`` with the registered runtime connection (None: none is registered)
        now and whenever it changes: the bridge points the ``llm.runtimes`` entry the knowledge
        runtime names at it (bridge.wiring)."""
        self._runtime_listeners.append(listener)
        listener(self.data.runtime)

    def _apply(self) -> None:
        for listener in self._runtime_listeners:
            listener(self.data.runtime)
        self.usable, self.blocked = {}, {}
        for index, raw in enumerate(self.data.sources):
            try:
                desc = self._validated(raw, f"sources.{index}")
            except RpcError as exc:
                errors = exc.data.get("errors") or [{}]
                self.blocked[str(raw.get("id"))] = str(exc.data.get("reason") or errors[0].get("type") or "INVALID")
                continue
            self.usable[desc.id] = desc
        self.service.descriptors = {**self.configured, **self.usable}
        runtime = self.data.runtime
        if runtime is None:
            self.service.settings, self.pool.key = self.base_settings, ""
            return
        register_secret(runtime.api_key)
        settings = RuntimeSettings(
            base_url=runtime.base_url, model=runtime.model, timeout_seconds=runtime.timeout_seconds
        )
        self.service.settings = msgspec.structs.replace(self.base_settings, runtime=settings)
        self.pool.key = runtime.api_key

    async def _answer(self, source_id: str, probe: bool) -> dict[str, Any]:
        view = self.view()
        entry = next(s for s in view["sources"] if s["id"] == source_id)
        if probe and entry["usable"] and entry["enabled"]:
            entry["status"] = await self.probe(source_id)
        return {**view, "source": entry}

    async def probe(self, source_id: str) -> dict[str, Any]:
        """Ask one source what it can do: ``{ready, capabilities, reason?}``."""
        caps = await self.service.capabilities(self.service.source(source_id))
        status: dict[str, Any] = {"ready": caps.error is None, "capabilities": sorted(caps.values)}
        if caps.error is not None:
            status["reason"] = caps.error.reason
        return status

    def view(self) -> dict[str, Any]:
        """The registry for an admin: sources with their URL or root, and the runtime without its
        key (``apiKeyConfigured``)."""
        sources = []
        for raw in self.data.sources:
            source_id = str(raw.get("id"))
            entry = {k: raw[k] for k in ("id", "label", "protocol", "url", "root", "capabilities") if raw.get(k)}
            entry.update(enabled=raw.get("enabled", True) is not False, usable=source_id in self.usable)
            if source_id in self.blocked:
                entry["reason"] = self.blocked[source_id]
            sources.append(entry)
        return {"sources": sources, "runtime": self.runtime_view()}

    def runtime_view(self) -> dict[str, Any]:
        runtime = self.service.settings.runtime
        if self.data.runtime is not None:
            origin, key = "registry", bool(self.data.runtime.api_key)
        else:
            origin = "config" if runtime.configured else "none"
            key = bool(runtime.api_key_env and os.environ.get(runtime.api_key_env, "").strip())
        parts = urlsplit(runtime.base_url or "")
        base = parts._replace(netloc=parts.netloc.rpartition("@")[2], query="", fragment="").geturl()
        return {
            "origin": origin,
            "baseUrl": base if runtime.base_url else None,
            "model": runtime.model,
            "apiKeyConfigured": key,
            "timeoutSeconds": runtime.timeout_seconds,
        }
