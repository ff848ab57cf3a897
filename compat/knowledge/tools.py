"""The knowledge tools (llmwiki-agent-bridge's MCP surface, §2.11), independent of MCP itself.

Each tool declares its arguments once; the JSON Schema lists the camelCase and the snake_case
spelling of each, and ``call`` accepts either. Read-only tools never call the runtime. Failures:
bad arguments raise ``InvalidParams`` (-32602), an unknown page or path ``KnowledgeNotFound``
(-32004), and a source that fails raises ``SourceError`` (the MCP layer reports it as a tool error).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from bridge.rpc.errors import InvalidParams
from compat.knowledge import retrieval
from compat.knowledge.engine import TurnInput
from compat.knowledge.errors import KnowledgeNotFound
from compat.knowledge.evidence import bundle_from, citations_from, graph_from
from compat.knowledge.sources.base import KnowledgeSource, RoutedRetrieval
from compat.knowledge.tools_spec import SPECS, ToolSpec
from compat.knowledge.turn_sink import CollectingSink
from compat.params import validated

if TYPE_CHECKING:
    from compat.knowledge.params import RetrievalIntent

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class ToolResult(msgspec.Struct, frozen=True):
    text: str
    structured: dict[str, Any]
    is_error: bool = False


def parse_args(spec: ToolSpec, raw: dict[str, Any] | None) -> dict[str, Any]:
    """Arguments under their canonical (camelCase) names.

    Raises:
        InvalidParams: -32602 for an unknown or missing argument, or one of the wrong type.
    """
    raw = dict(raw or {})
    out: dict[str, Any] = {}
    for arg in spec.args:
        for name in arg.names:
            if name in raw:
                out.setdefault(arg.name, raw.pop(name))
        if arg.required and out.get(arg.name) in (None, ""):
            raise InvalidParams(f"{spec.name} requires {arg.name}", field=arg.name)
        if arg.name in out and not arg.accepts(out[arg.name]):
            raise InvalidParams(f"{spec.name}: {arg.name} must be {arg.kind}", field=arg.name)
    if raw:
        raise InvalidParams(f"{spec.name} does not accept {', '.join(sorted(raw))}", field=sorted(raw)[0])
    return out


class KnowledgeTools:
    """The tool operations over a ``KnowledgeService``."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.handlers: dict[str, Handler] = {
            "llmwiki_agent_run": self.agent_run,
            "llmwiki_list_sources": self.list_sources,
            "llmwiki_context": self.context,
            "llmwiki_search": self.search,
            "llmwiki_read": self.read,
            "llmwiki_graph": self.graph,
            "llmwiki_graph_neighbors": self.neighbors,
            "llmwiki_source_bundle": self.source_bundle,
            "get_wiki_content": self.wiki_content,
        }

    async def call(self, name: str, arguments: dict[str, Any] | None) -> ToolResult:
        """Run tool ``name``. Raises InvalidParams for an unknown tool or bad arguments."""
        spec = SPECS.get(name)
        if spec is None:
            raise InvalidParams(f"Unknown MCP tool: {name}.", field="name")
        payload = await self.handlers[name](parse_args(spec, arguments))
        if name == "llmwiki_agent_run":
            artifact = payload["llmwiki_agent_result"]
            return ToolResult(artifact["answer"], payload, payload.pop("_failed", False))
        if name == "get_wiki_content":
            return ToolResult(payload.pop("_markdown"), payload, payload["get_wiki_content"].get("found") is False)
        return ToolResult(spec.summary(payload), payload)

    def _pick(self, source_id: str | None, tool: str) -> KnowledgeSource:
        if source_id:
            return self.service.source(source_id)
        enabled = self.service.enabled()
        if len(enabled) != 1:
            raise InvalidParams(
                f"{tool} requires sourceId when more than one knowledge source is available.", field="sourceId"
            )
        return self.service.source(enabled[0].id)

    # ---- whole turns ----------------------------------------------------------------------------

    async def agent_run(self, args: dict[str, Any]) -> dict[str, Any]:
        extra = {k: args[k] for k in ("orchestrationMode", "retrieval", "knowledgeSources") if k in args}
        await self.service.preflight(extra)
        session = f"mcp-{uuid.uuid4().hex[:12]}"
        history = tuple(
            (str(m.get("role")), str(m.get("content") or "")) for m in args.get("messages") or [] if isinstance(m, dict)
        )
        turn = TurnInput(args["query"], session, session, f"turn-{time.time_ns()}", history)
        outcome = await self.service.run_turn(extra, turn, CollectingSink())
        artifact = (outcome.artifacts or [{}])[0]
        if outcome.error is not None:
            artifact = {**artifact, "error": {"code": outcome.error.code, "message": outcome.error.message}}
        return {"llmwiki_agent_result": artifact, "_failed": outcome.status != "completed"}

    # ---- read-only source tools -----------------------------------------------------------------

    async def list_sources(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"llmwiki_sources": await self.service.list_sources(probe=args.get("probe", True))}

    async def _routed(self, source: KnowledgeSource, intent: RetrievalIntent | None) -> retrieval.Route:
        retrieval.check_intent(intent)
        caps = await self.service.capabilities(source)
        excluded = retrieval.excluded_ids(intent, source.descriptor.id, [source.descriptor.id])
        chosen = retrieval.route(intent, caps, source.descriptor, excluded)
        retrieval.enforce(intent, [source.descriptor], [chosen])
        return chosen

    async def context(self, args: dict[str, Any]) -> dict[str, Any]:
        source = self._pick(args.get("sourceId"), "llmwiki_context")
        from compat.knowledge.params import RetrievalIntent  # pydantic, not imported at start (compat.settings)

        intent = validated(RetrievalIntent, args["retrieval"], "retrieval") if args.get("retrieval") else None
        chosen = await self._routed(source, intent)
        routed = chosen.routed
        if args.get("limit") and intent is None:
            routed = RoutedRetrieval(limit=args["limit"])
        pack = await self.service.bounded(source.context(args["query"], routed))
        sid = source.descriptor.id
        nodes, edges = graph_from(sid, pack)
        return {
            "llmwiki_context": {
                "source": sid,
                "query": args["query"],
                "wikiTitle": pack.get("wiki_title"),
                "description": pack.get("description"),
                "adapter": pack.get("adapter"),
                "implementation": pack.get("implementation"),
                "pageCount": pack.get("page_count"),
                "approvedPageCount": pack.get("approved_page_count"),
                "orientation": citations_from(sid, {"evidence": pack.get("orientation") or []}),
                "citations": citations_from(sid, pack),
                "limitations": pack.get("limitations") or [],
                "graph": {"nodes": nodes, "edges": edges},
                "diagnostics": [chosen.diagnostic] if chosen.diagnostic else [],
            }
        }

    async def search(self, args: dict[str, Any]) -> dict[str, Any]:
        source = self._pick(args.get("sourceId"), "llmwiki_search")
        intent = None
        if args.get("mode") or args.get("queryVariants") or args.get("snippetChars") or args.get("excludePageIds"):
            search = {k: args[k] for k in ("limit", "snippetChars", "excludePageIds", "queryVariants") if k in args}
            from compat.knowledge.params import RetrievalIntent  # see context()

            intent = validated(
                RetrievalIntent,
                {
                    "schemaVersion": "llmwiki.retrieval.v1",
                    "fallback": "none",
                    "searchMode": args.get("mode") or "lexical",
                    "search": search,
                },
            )
        routed = (await self._routed(source, intent)).routed
        if intent is None:
            routed = RoutedRetrieval(limit=args.get("limit") or 8)
        results = await self.service.bounded(source.search(args["query"], routed))
        sid = source.descriptor.id
        return {
            "llmwiki_search": {
                "source": sid,
                "query": args["query"],
                "results": citations_from(sid, {"evidence": results}),
            }
        }

    async def read(self, args: dict[str, Any]) -> dict[str, Any]:
        page_id, source_id = str(args["pageId"]), args.get("sourceId")
        prefix, sep, rest = page_id.partition(":")
        if sep and prefix in self.service.descriptors:
            if source_id and source_id != prefix:
                raise InvalidParams(
                    f"llmwiki_read pageId source prefix {prefix} does not match sourceId: {source_id}.", field="pageId"
                )
            source_id, page_id = prefix, rest
        source = self._pick(source_id, "llmwiki_read")
        options = {"query": args.get("query"), "sections": args.get("sections"), "max_chars": args.get("maxChars")}
        page = await self.service.bounded(source.read_page(page_id, {k: v for k, v in options.items() if v}))
        if page is None:
            raise KnowledgeNotFound("page not found", sourceId=source.descriptor.id, pageId=page_id)
        return {"llmwiki_read": {"source": source.descriptor.id, "pageId": page_id, "page": page}}

    async def graph(self, args: dict[str, Any]) -> dict[str, Any]:
        source = self._pick(args.get("sourceId"), "llmwiki_graph")
        raw = await self.service.bounded(source.graph(args.get("limit") or 120))
        nodes, edges = graph_from(source.descriptor.id, {"graph": raw})
        return {"llmwiki_graph": {"source": source.descriptor.id, "graph": {"nodes": nodes, "edges": edges}}}

    async def neighbors(self, args: dict[str, Any]) -> dict[str, Any]:
        seeds = [*([args["nodeId"]] if args.get("nodeId") else []), *(args.get("nodeIds") or [])]
        if not seeds:
            raise InvalidParams("llmwiki_graph_neighbors requires nodeId or nodeIds", field="nodeId")
        targets = [args["sourceId"]] if args.get("sourceId") else [d.id for d in self.service.enabled()]
        out = []
        for sid in targets:  # sources in configuration order, so the answer is deterministic
            own = [
                s.split(":", 1)[1] if s.split(":", 1)[0] == sid else s
                for s in seeds
                if ":" not in s or s.split(":", 1)[0] in (sid, "page", "tag", "source", "heading", "placeholder")
            ]
            raw = await self.service.bounded(
                self.service.source(sid).neighbors(
                    own, min(int(args.get("depth") or 1), 4), args.get("direction") or "both", args.get("limit") or 50
                )
            )
            nodes, edges = graph_from(sid, {"graph": raw})
            out.append({"source": sid, "graph": {"nodes": nodes, "edges": edges}})
        return {"llmwiki_graph_neighbors": {"sources": out}}

    async def source_bundle(self, args: dict[str, Any]) -> dict[str, Any]:
        source = self._pick(args.get("sourceId"), "llmwiki_source_bundle")
        bundle = await self.service.bounded(source.source_bundle())
        safe = bundle_from(source.descriptor.id, bundle) if bundle else None
        return {"llmwiki_source_bundle": {"source": source.descriptor.id, "sourceBundle": safe}}

    async def wiki_content(self, args: dict[str, Any]) -> dict[str, Any]:
        from compat.knowledge.wiki_markdown import wiki_node

        return await wiki_node(self.service, args["path"])
