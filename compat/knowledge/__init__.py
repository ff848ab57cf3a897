"""The ``knowledge`` provider family: cited answers from llmwiki-compatible knowledge sources.

Layout (one way in, one way out):

* ``settings``: the ``knowledge:`` / ``knowledgeSources:`` configuration and the turn params.
* ``sources``: one module per source protocol behind ``sources.base.KnowledgeSource``.
* ``retrieval``: retrieval-intent capability gating; ``engine``: fan-out, evidence, modes.
* ``runtime``: the OpenAI-compatible chat-completions client and the evidence prompt.
* ``service``: ``KnowledgeService``, the source registry and every operation callers use.
* ``adapter``: ``KnowledgeAdapter``, the ``compat.base.ProviderAdapter`` for the orchestrator.

Heavy optional libraries (``mcp``, ``a2a-sdk``) are imported lazily inside the source modules.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""
