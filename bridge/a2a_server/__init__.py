"""The bridge's A2A surface: an A2A v1 agent (card, JSON-RPC and HTTP+JSON) over the knowledge
service, served with the official a2a-sdk, and the LLMWiki agent bridge's ``POST /message:send``.

``shape`` reads both request shapes (plain Python), ``turns`` runs a knowledge turn, ``llmwiki``
answers the LLMWiki shape, ``card`` and ``executor`` are the a2a-sdk side (imported lazily), and
``app`` has the routes ``bridge.http_app.create_app`` mounts.

Must not import: ``orchestrator``.
"""

from bridge.a2a_server.app import A2AApp, create_a2a_app

__all__ = ["A2AApp", "create_a2a_app"]
