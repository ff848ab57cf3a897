"""Local child processes for adapters (ACP agents, exec profiles): spawn in a process group, pump
the pipes with plain reader and writer tasks, bounded lines, a bounded stderr tail, and an end
that leaves nothing behind.

- ``spawn``: :func:`spawn` (a child in its own process group, with pipes of the bridge's own);
- ``child``: :class:`AgentProcess` (pumps, drain, exit, terminate);
- ``descendants``: what a child started, found at kill time (child subreaper on Linux);
- ``lines``: bounded line framing, no I/O;
- ``env``: the allow-listed child environment and the redacted stderr tail;
- ``commands``: where commands are found (``PATH``, the ``make agents`` cache).

Import what you need from the modules: importing the package loads nothing (the configuration
reads ``commands`` at start, bench case 6).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""
