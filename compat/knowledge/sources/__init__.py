"""Knowledge sources: one module per protocol behind ``sources.base.KnowledgeSource``.

``build_source`` is the one place a descriptor becomes a source object; the protocol modules are
imported only when a source of that protocol exists (``mcp`` and ``a2a-sdk`` are heavy).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from compat.knowledge.settings import SourceDescriptor
from compat.knowledge.sources.base import KnowledgeSource


def build_source(descriptor: SourceDescriptor, *, timeout_s: float) -> KnowledgeSource:
    """A new source object for ``descriptor``; ``timeout_s`` bounds each upstream call (seconds)."""
    if descriptor.protocol == "local-wiki":
        from compat.knowledge.sources.local_wiki import LocalWikiSource

        return LocalWikiSource(descriptor)
    if descriptor.protocol == "llmwiki-http":
        from compat.knowledge.sources.llmwiki_http import LlmwikiHttpSource

        return LlmwikiHttpSource(descriptor, timeout_s=timeout_s)
    if descriptor.protocol == "mcp":
        from compat.knowledge.sources.mcp_source import McpSource

        return McpSource(descriptor, timeout_s=timeout_s)
    from compat.knowledge.sources.a2a_source import A2aSource

    return A2aSource(descriptor, timeout_s=timeout_s)
