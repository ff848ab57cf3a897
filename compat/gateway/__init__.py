"""The ``openclaw`` gateway provider family: the bridge as a client of an OpenClaw gateway.

Layout:

* ``settings``: the ``gateway:`` configuration key.
* ``protocol``: the wire protocol, sans I/O (frames, handshake, signature, errors, backoff).
* ``identity``: the Ed25519 device identity and the device tokens the gateway issues.
* ``client``: ``GatewayClient``, the one connection: handshake, requests, events, reconnects.
* ``adapter``: ``GatewayAdapter``, the ``compat.base.ProviderAdapter`` for gateway-routed turns.
* ``runtimes``: ``GatewayRuntimes``, the per-principal ``xworkmate.gateway.*`` runtimes.

Nothing here is imported unless a gateway is configured (``websockets`` and ``cryptography``
stay out of the cold start).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""
