"""``KnowledgeService``: the source registry and every knowledge operation callers use.

One service per bridge, shared by the ``knowledge`` provider adapters, the ``knowledge.read`` /
``knowledge.sources`` methods and the MCP surface. It owns the configured source objects and a
short-lived capability cache (``capabilityTtlSeconds``). Request sources (``knowledgeSources`` in
``session.start``) are built per turn and closed after it.

Use as ``async with KnowledgeService(...)`` or call ``aclose()``.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from bridge.rpc.errors import InvalidParams, RpcError
from compat.base import TurnError, TurnOutcome, TurnSink
from compat.knowledge import retrieval
from compat.knowledge.engine import KnowledgeTurn, TurnInput, TurnPlan
from compat.knowledge.errors import KnowledgeNotFound, SourceError
from compat.knowledge.policy import request_sources
from compat.knowledge.runtime import RuntimeClient
from compat.knowledge.settings import KnowledgeSettings, SourceDescriptor, default_sources
from compat.knowledge.sources import build_source
from compat.knowledge.sources.base import Capabilities, KnowledgeSource, fallback_capabilities
from compat.knowledge.tree import Tree, normalize
from compat.params import validated

if TYPE_CHECKING:
    from compat.knowledge.params import KnowledgeTurnParams

log = logging.getLogger(__name__)
T = TypeVar("T")
SUMMARY_FILL = 16


MAX_RUNNING_TURNS = 128
"""Knowledge turns running at once, from every surface (the default ``maxRunningTurns``)."""


class KnowledgeService:
    """The knowledge sources of one bridge.

    Args:
        settings: the ``knowledge:`` configuration.
        sources: the ``knowledgeSources:`` list (None: the embedded documentation source).
        roots: workspace roots (resolved); request ``local-wiki`` roots must lie inside.

    Raises:
        ValueError: two configured sources share an id.
    """

    def __init__(
        self,
        settings: KnowledgeSettings | None = None,
        sources: Sequence[SourceDescriptor] | None = None,
        roots: Sequence[Path] = (),
    ) -> None:
        self.settings = settings or KnowledgeSettings()
        self.roots = [Path(r).resolve() for r in roots]
        descriptors = list(default_sources() if sources is None else sources)
        self.descriptors: dict[str, SourceDescriptor] = {}
        for desc in descriptors:
            if desc.id in self.descriptors:
                raise ValueError(f"knowledgeSources: duplicate source id {desc.id!r}")
            self.descriptors[desc.id] = desc
        self._sources: dict[str, KnowledgeSource] = {}
        self.runtime_pool = RuntimeClient()  # one HTTP pool for every delegated turn's model call
        self.turn_slots = anyio.CapacityLimiter(MAX_RUNNING_TURNS)
        self._caps: dict[tuple[str, str, str], tuple[float, Capabilities]] = {}
        self.registry: Any = None  # the KnowledgeRegistry attached to it (compat.knowledge.registry)
        self._retired: list[KnowledgeSource] = []  # replaced while a turn may still use them

    async def __aenter__(self) -> KnowledgeService:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # ---- registry -------------------------------------------------------------------------------

    def enabled(self, ids: Sequence[str] | None = None) -> list[SourceDescriptor]:
        """Enabled configured sources, in configuration order (optionally only ``ids``)."""
        return [d for d in self.descriptors.values() if d.enabled and (ids is None or d.id in ids)]

    def _new(self, desc: SourceDescriptor) -> KnowledgeSource:
        return build_source(desc, timeout_s=self.settings.source_timeout_seconds)

    def source(self, source_id: str) -> KnowledgeSource:
        """The configured, enabled source ``source_id``.

        Raises:
            KnowledgeNotFound: -32004, no such enabled source.
        """
        desc = self.descriptors.get(source_id)
        if desc is None or not desc.enabled:
            raise KnowledgeNotFound("unknown knowledge source", sourceId=source_id)
        if source_id not in self._sources:
            self._sources[source_id] = self._new(desc)
        return self._sources[source_id]

    async def bounded(self, call: Awaitable[T]) -> T:
        """Await one source call within ``sourceTimeoutSeconds``.

        Raises:
            SourceError: ``timeout`` when it takes longer.
        """
        with anyio.move_on_after(self.settings.source_timeout_seconds):
            return await call
        raise SourceError("timeout", "did not answer in time")

    async def capabilities(self, source: KnowledgeSource) -> Capabilities:
        """What ``source`` advertises, asked at most every ``capabilityTtlSeconds``; when it
        cannot be asked, the descriptor's claim (``origin: descriptor``) with the error."""
        desc = source.descriptor
        key = (desc.id, desc.protocol, desc.url or desc.root or "")
        cached = self._caps.get(key)
        if cached and time.monotonic() - cached[0] < self.settings.capability_ttl_seconds:
            return cached[1]
        try:
            caps = await self.bounded(source.discover())
        except SourceError as exc:
            caps = fallback_capabilities(desc, exc)
        except Exception as exc:  # discovery must never break a turn
            log.warning("capability discovery of %s failed: %s", desc.id, type(exc).__name__)
            caps = fallback_capabilities(desc, SourceError("error", "failed unexpectedly"))
        if caps.error is None:
            self._caps[key] = (time.monotonic(), caps)
        return caps

    def forget(self, source_id: str) -> None:
        """Drop the source object and capabilities of ``source_id`` (its descriptor changed or
        went); the object is closed with the service, since a running turn may hold it."""
        if (source := self._sources.pop(source_id, None)) is not None:
            self._retired.append(source)
        self._caps = {key: value for key, value in self._caps.items() if key[0] != source_id}

    # ---- turns ----------------------------------------------------------------------------------

    def _mode(self, params: KnowledgeTurnParams) -> str:
        mode = params.orchestration_mode or ("hybrid" if self.settings.runtime.configured else "evidence-only")
        if mode != "evidence-only" and not self.settings.runtime.configured:
            raise InvalidParams(
                f"orchestrationMode {mode} needs knowledge.runtime (baseUrl and model)",
                field="orchestrationMode",
                reason="RUNTIME_NOT_CONFIGURED",
            )
        return mode

    async def plan(self, extra: dict[str, Any], provider_sources: Sequence[str] | None = None) -> TurnPlan:
        """Validate a turn's params, select its sources and, with a retrieval intent, gate it.

        Raises:
            InvalidParams: -32602 for a bad ``orchestrationMode``, ``retrieval`` or ``knowledgeSources``.
            RetrievalModeUnsupported: -32602 ``RETRIEVAL_MODE_UNSUPPORTED`` (after capability
                discovery, before any query).
        """
        from compat.knowledge.params import KnowledgeTurnParams  # pydantic, not imported at start (compat.settings)

        params = validated(KnowledgeTurnParams, extra)
        mode = self._mode(params)
        retrieval.check_intent(params.retrieval)
        if params.knowledge_sources is not None:
            descs = request_sources(params.knowledge_sources, self.settings.request_sources, self.roots)
            owned = [self._new(d) for d in descs]
            plan = TurnPlan(mode, list(owned), params.retrieval, owned=owned)
        else:
            plan = TurnPlan(mode, [self.source(d.id) for d in self.enabled(provider_sources)], params.retrieval)
        try:
            if params.retrieval is not None:
                plan.routes = await self._gate(plan)
        except BaseException:
            await self.release(plan)
            raise
        return plan

    async def _gate(self, plan: TurnPlan) -> list[retrieval.Route]:
        caps: list[Capabilities] = [Capabilities()] * len(plan.sources)
        limiter = anyio.CapacityLimiter(self.settings.fan_out)

        async def one(index: int, source: KnowledgeSource) -> None:
            async with limiter:
                caps[index] = await self.capabilities(source)

        async with anyio.create_task_group() as tg:
            for index, source in enumerate(plan.sources):
                tg.start_soon(one, index, source)
        selected = [s.descriptor.id for s in plan.sources]
        routes = [
            retrieval.route(
                plan.intent, c, s.descriptor, retrieval.excluded_ids(plan.intent, s.descriptor.id, selected)
            )
            for s, c in zip(plan.sources, caps, strict=False)
        ]
        retrieval.enforce(plan.intent, [s.descriptor for s in plan.sources], routes)
        return routes

    async def preflight(self, extra: dict[str, Any], provider_sources: Sequence[str] | None = None) -> None:
        """Everything that can reject a knowledge turn before it starts (no turnId, no updates).

        Raises:
            InvalidParams, RetrievalModeUnsupported: see ``plan``.
        """
        await self.release(await self.plan(extra, provider_sources))

    async def release(self, plan: TurnPlan) -> None:
        """Close the sources built for this plan only (bounded, shielded)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            for source in plan.owned:
                await source.aclose()

    async def run_turn(
        self, extra: dict[str, Any], turn: TurnInput, sink: TurnSink, provider_sources: Sequence[str] | None = None
    ) -> TurnOutcome:
        """Run one knowledge turn. Never raises for params or source failures: they are outcomes.

        At most :data:`MAX_RUNNING_TURNS` run at once, whoever asks (a ``session.start``, which
        ``maxRunningTurns`` also bounds, the A2A surface, the MCP ``llmwiki_agent_run`` tool,
        which it does not); the others wait for a slot.
        """
        async with self.turn_slots:
            try:
                plan = await self.plan(extra, provider_sources)
            except RpcError as exc:
                error = TurnError(exc.name, exc.message, exc.data or None)
                return TurnOutcome("failed", stop_reason="error", error=error)
            try:
                return await KnowledgeTurn(plan, turn, self.settings, self.capabilities, sink, self.runtime_pool).run()
            finally:
                await self.release(plan)

    # ---- sources listing and tree reads ---------------------------------------------------------

    async def list_sources(self, probe: bool = True) -> dict[str, Any]:
        """``knowledge.sources``: every configured source, its readiness and capabilities (no
        URLs, credentials or absolute roots)."""
        entries: list[dict[str, Any]] = []
        for desc in self.descriptors.values():
            entries.append(
                {
                    "id": desc.id,
                    "label": desc.name,
                    "protocol": desc.protocol,
                    "enabled": desc.enabled,
                    "ready": False,
                    "capabilities": list(desc.capabilities),
                    "capabilityOrigin": "descriptor",
                    "registered": self.registry is not None and desc.id in self.registry.usable,
                }
            )

        async def probe_one(entry: dict[str, Any]) -> None:
            caps = await self.capabilities(self.source(entry["id"]))
            entry.update(ready=caps.error is None, capabilities=sorted(caps.values), capabilityOrigin=caps.origin)
            if caps.error is not None:
                entry["reason"] = caps.error.reason
            projection = (caps.bundle or {}).get("projection") or {}
            if isinstance(projection, dict) and projection.get("page_count") is not None:
                entry.update(
                    pageCount=projection.get("page_count"), approvedPageCount=projection.get("approved_page_count")
                )

        if probe:
            limiter = anyio.CapacityLimiter(self.settings.fan_out)

            async def limited(entry: dict[str, Any]) -> None:
                async with limiter:
                    await probe_one(entry)

            async with anyio.create_task_group() as tg:
                for entry in entries:
                    if entry["enabled"]:
                        tg.start_soon(limited, entry)
        ready = sum(1 for e in entries if e["ready"])
        return {
            "sources": entries,
            "totalSourceCount": len(entries),
            "readySourceCount": ready,
            "enabledSourceCount": sum(1 for e in entries if e["enabled"]),
            "probed": probe,
        }

    async def read(self, source_id: str, path: str = "/") -> dict[str, Any]:
        """``knowledge.read``: the node at ``path`` and its children (progressive disclosure).

        Raises:
            InvalidParams: -32602, a malformed path, or a source without a tree (A2A).
            KnowledgeNotFound: -32004, unknown source, or no node at ``path`` (``data.nearestParent``).
        """
        node_path = normalize(path)
        source = self.source(source_id)
        try:
            pages, truncated = await self.bounded(source.pages())
        except SourceError as exc:
            if exc.reason == "unsupported":
                raise InvalidParams("this knowledge source has no tree to read", sourceId=source_id) from exc
            raise KnowledgeNotFound(
                f"the knowledge source could not be read: {exc.reason}", sourceId=source_id, reason=exc.reason
            ) from exc
        tree = Tree.of(pages)
        node_id = node_path.strip("/")
        if not tree.exists(node_id):
            raise KnowledgeNotFound(
                "no node at this path", sourceId=source_id, path=node_path, nearestParent=tree.nearest_parent(node_id)
            )
        return await self._node(source, tree, node_id, truncated)

    async def _node(self, source: KnowledgeSource, tree: Tree, node_id: str, truncated: bool) -> dict[str, Any]:
        is_page = node_id in tree.pages
        content_id = node_id if is_page else tree.index_page(node_id)
        page = await self._page_or_none(source, content_id)
        children = tree.children(node_id)
        await self._fill_summaries(source, children)
        default_title = node_id.rsplit("/", 1)[-1] if node_id else source.descriptor.name
        return {
            "sourceId": source.descriptor.id,
            "path": "/" + node_id,
            "kind": "page" if is_page else "folder",
            "title": (page or {}).get("title") or default_title,
            "summary": (page or {}).get("summary") or (tree.pages.get(content_id or "", {}).get("summary") or ""),
            "frontMatter": (page or {}).get("frontmatter") or {},
            "content": (page or {}).get("text") or "",
            "children": children,
            "truncated": truncated,
        }

    async def _page_or_none(
        self, source: KnowledgeSource, page_id: str | None, options: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        if not page_id:
            return None
        try:
            return await self.bounded(source.read_page(page_id, options or {}))
        except SourceError:
            return None

    async def _fill_summaries(self, source: KnowledgeSource, children: list[dict[str, Any]]) -> None:
        """Sources whose page list has no summaries (llmwiki-http): read a few, 4 at a time."""
        missing = [c for c in children if c["kind"] == "page" and not c["summary"]][:SUMMARY_FILL]
        limiter = anyio.CapacityLimiter(4)

        async def fill(child: dict[str, Any]) -> None:
            async with limiter:
                page = await self._page_or_none(source, child["path"].lstrip("/"), {"fields": ("title", "summary")})
                child["summary"] = str((page or {}).get("summary") or "")[:360]

        async with anyio.create_task_group() as tg:
            for child in missing:
                tg.start_soon(fill, child)

    async def aclose(self) -> None:
        """Close every source object and the runtime's pool (bounded, shielded)."""
        await self.runtime_pool.aclose()
        sources, self._sources = [*self._sources.values(), *self._retired], {}
        self._retired = []
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            for source in sources:
                try:
                    await source.aclose()
                except Exception as exc:
                    log.warning("closing knowledge source failed: %s", type(exc).__name__)
