"""The ACP provider family: coding agents spoken to over the Agent Client Protocol on stdio.

- ``adapter``: :class:`AcpAdapter`, the ``ProviderAdapter`` (one per configured agent);
- ``session``: :class:`AcpSession`, one bridge session's agent and ACP session, and its turns;
- ``connection``: one agent process, its handshake and methods;
- ``mapping``, ``models``, ``failures``: ACP payloads → turn events, model selection, errors;
- ``presets``: the known agents' launch commands.

Import what you need from the modules: importing the package loads nothing (the configuration
reads ``presets`` at start, bench case 6).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""
