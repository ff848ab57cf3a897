"""One-shot model calls for clients (``llm.complete``, ``llm.completeStructured``) and the
per-principal trust gate (docs/api.md "Model calls" and "Principals").

* ``settings``: the ``llm:`` and ``principals:`` configuration shapes;
* ``wire``: sans-I/O request bodies and reply parsing for the two runtime kinds (OpenAI-compatible
  chat completions, the Anthropic Messages API);
* ``structured``: reading JSON out of a reply and checking it against a JSON Schema;
* ``gate``: what a principal may ask for (fail closed);
* ``service``: ``LlmService``, the HTTP clients, fallback, vision routing and the rate limit.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""
