"""The ``xworkmate-bridge`` command line (docs/api.md "Command line").

Exit codes for ``call`` and ``chat``: 0 success, 1 a JSON-RPC error or a failed turn, 2 a transport
or configuration error. For ``serve`` and ``acp-stdio``: 0 stopped (SIGTERM, SIGINT, end of
input), 2 a configuration error (a public address with no token included), 3 ``serve`` cannot
listen on its address (in use, not local, not permitted), 130 interrupted before it started. ``call`` prints one JSON envelope per line; ``chat`` prints the agent's text
live and then one summary line (``--json``: the raw result instead).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec
import orjson

from bridge import __version__
from bridge.chat_view import ChatView, cited_sources, turn_summary
from bridge.config import BridgeConfig, ConfigError, load_config, only_provider

DEFAULT_URL = "http://127.0.0.1:8787"
log = logging.getLogger("xworkmate_bridge")


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def _setup_logging(config: BridgeConfig) -> None:
    from bridge.logs import configure

    configure(config.log_level, config.log_format)
    for warning in config.load_warnings:  # found before logging was set up
        log.warning("%s", warning)


@contextlib.asynccontextmanager
async def running_orchestrator(config: BridgeConfig) -> AsyncIterator[Any]:
    from bridge.methods import build_dispatcher
    from bridge.wiring import build_orchestrator

    requests = request_log(config)
    try:
        async with build_orchestrator(config) as orch:
            yield orch, build_dispatcher(orch, requests)
    finally:
        if requests is not None:
            requests.close()


def request_log(config: BridgeConfig) -> Any:
    """The audit and I/O logs of ``config`` (``bridge.audit.RequestLog``), or None when both are off."""
    audit, io = config.audit_path(), config.io_log
    if audit is None and io is None:
        return None
    from bridge.audit import JsonlWriter, RequestLog

    return RequestLog(JsonlWriter(audit) if audit else None, JsonlWriter(Path(io).expanduser()) if io else None)


def build_app(config: BridgeConfig) -> Any:
    """The ASGI app with the orchestrator entered in its lifespan (one task enters and leaves it)."""
    from bridge.acp_agent import AcpAgent
    from bridge.heap import freeze_heap, preload
    from bridge.http_app import create_app
    from bridge.methods import build_dispatcher
    from bridge.wiring import build_orchestrator

    orch = build_orchestrator(config)
    tracer = None
    if config.tracing is not None:
        from bridge import tracing

        tracer = tracing.start(config.tracing)
    mcp = a2a = None
    if orch.knowledge is not None:
        from bridge.a2a_server import create_a2a_app
        from bridge.mcp_server import create_mcp_app

        mcp = create_mcp_app(orch.knowledge)
        a2a = create_a2a_app(orch.knowledge, config)

    requests = request_log(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        try:
            async with orch, mcp.lifespan() if mcp is not None else contextlib.nullcontext():
                freeze_heap()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(preload)
                    try:
                        yield
                    finally:
                        tg.cancel_scope.cancel()
        finally:
            if requests is not None:
                await anyio.to_thread.run_sync(requests.close)
            if tracer is not None:
                from bridge import tracing

                await anyio.to_thread.run_sync(tracing.stop, tracer)

    def editor(
        write: Callable[[bytes], None], backlog: Callable[[], int], principal: str, connection_id: str
    ) -> AcpAgent:
        return AcpAgent(orch, principal, write, connection_id=connection_id, backlog=backlog)

    dispatcher = build_dispatcher(orch, requests)
    app = create_app(config, dispatcher, lifespan=lifespan, mcp_app=mcp, editor=editor, a2a_app=a2a)
    app.on_stopping.append(lambda: orch.drain(config.timeouts.shutdown_grace))

    return app


def cmd_serve(args: argparse.Namespace) -> int:
    from bridge.heap import pause_gc_for_start

    pause_gc_for_start()  # until the lifespan's freeze_heap
    from bridge.auth import check_exposure
    from bridge.server import listen, run

    overrides: dict[str, Any] = {"host": args.host, "port": args.port, "stateDir": args.state_dir}
    if args.allow_insecure_no_auth:
        overrides["allowInsecureNoAuth"] = True
    config = load_config(args.config, overrides)
    if args.only:
        config = only_provider(config, args.only)
    _setup_logging(config)
    check_exposure(config)
    sockets = listen(config.host, config.port)  # before anything starts: a port in use fails here
    run(config, build_app(config), sockets=sockets)
    return 0


def cmd_acp_stdio(args: argparse.Namespace) -> int:
    from bridge.heap import freeze_heap, pause_gc_for_start, preload

    pause_gc_for_start()  # until freeze_heap, once the orchestrator has started
    from bridge.acp_agent import AcpAgent
    from bridge.stdio import serve_stdio

    config = load_config(args.config, {"stateDir": args.state_dir})
    if args.only:
        config = only_provider(config, args.only)
    _setup_logging(config)

    async def main() -> None:
        async with running_orchestrator(config) as (orch, dispatcher), anyio.create_task_group() as tg:
            freeze_heap()
            tg.start_soon(preload)
            await serve_stdio(
                dispatcher,
                limits=config.limits,
                on_eof=lambda: orch.drain(0),
                stop_signals=(signal.SIGTERM, signal.SIGINT, signal.SIGHUP),
                editor=lambda write, backlog: AcpAgent(orch, "local", write, connection_id="stdio", backlog=backlog),
            )
            tg.cancel_scope.cancel()

    anyio.run(main)
    return 0


def _print(obj: Any) -> None:
    sys.stdout.write(orjson.dumps(obj).decode() + "\n")
    sys.stdout.flush()


def cmd_call(args: argparse.Namespace) -> int:
    from bridge.client import call

    try:
        params = orjson.loads(args.params) if args.params else {}
    except orjson.JSONDecodeError as exc:
        print(f"xworkmate-bridge call: params is not valid JSON: {exc}", file=sys.stderr)
        return 2
    if not isinstance(params, dict):
        print("xworkmate-bridge call: params must be a JSON object", file=sys.stderr)
        return 2
    reply = anyio.run(
        lambda: call(args.url, args.method, params, token=args.token, on_notification=_print if args.stream else None)
    )
    _print(reply)
    if "error" in reply and reply["error"].get("code") == -32001:
        _explain(reply["error"])
    return 0 if _succeeded(reply) else 1


def _succeeded(reply: dict[str, Any]) -> bool:
    if "error" in reply:
        return False
    result = reply.get("result")
    return not (isinstance(result, dict) and result.get("success") is False)


def cmd_chat(args: argparse.Namespace) -> int:
    from bridge.client import call

    if args.target == "gateway" and args.provider:
        print("xworkmate-bridge chat: --provider names an agent; it cannot go with --target gateway", file=sys.stderr)
        return 2
    params: dict[str, Any] = {"sessionId": f"chat-{uuid.uuid4().hex[:12]}", "taskPrompt": args.prompt}
    if args.cwd:
        params["workingDirectory"] = os.path.abspath(args.cwd)
    if args.target == "gateway":
        params["routing"] = {"routingMode": "explicit", "explicitExecutionTarget": "gateway"}
    elif args.provider or args.target == "agent":
        params["routing"] = {"routingMode": "explicit", "explicitExecutionTarget": "agent"}
        if args.provider:
            params["routing"]["explicitProviderId"] = args.provider
    if args.model:
        params["model"] = args.model

    view = ChatView(sys.stdout, sys.stderr)
    show = None if args.json else view.show

    async def run() -> dict[str, Any]:
        try:
            return await call(args.url, "session.start", params, token=args.token, on_notification=show)
        finally:  # the agent process should not outlive the command (it would idle for idleTimeout)
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                await _quietly(
                    call(args.url, "session.close", {"sessionId": params["sessionId"]}, token=args.token, timeout=10)
                )

    started = time.monotonic()
    reply = anyio.run(run)
    seconds = time.monotonic() - started
    if args.json:  # the raw result: the text with its anchors, and the artifacts
        _print(reply.get("result", reply))
        return 0 if _succeeded(reply) else 1
    view.close()
    if "error" in reply:
        _explain(reply["error"])
        return 1
    result = reply.get("result") or {}
    for line in cited_sources(result):
        print(line)
    summary = turn_summary(result, seconds)
    print(summary)
    return 0 if result.get("success") else 1


async def _quietly(call: Any) -> None:
    try:
        await call
    except Exception:  # closing is best effort: the bridge may already be gone
        pass


def _explain(error: dict[str, Any]) -> None:
    print(f"error {error.get('code')}: {error.get('message')}", file=sys.stderr)
    if error.get("code") == -32001:
        print("hint: pass --token or set BRIDGE_AUTH_TOKEN to one of the bridge's tokens", file=sys.stderr)


STRUCTURED_INSTRUCTIONS = "Do what the input asks; reply with JSON that matches the schema."


def cmd_llm(args: argparse.Namespace) -> int:
    """One model call on the bridge's runtimes: ``llm.complete``, or ``llm.completeStructured``
    with ``--schema`` (prints ``parsed``; exit 1 when the reply does not validate)."""
    from bridge.client import call

    options: dict[str, Any] = {
        "provider": args.provider,
        "model": args.model,
        "purpose": args.purpose,
        "maxTokens": args.max_tokens,
        "temperature": args.temperature,
        "timeout": args.timeout,
    }
    options = {k: v for k, v in options.items() if v is not None}
    if args.schema:
        try:
            schema = orjson.loads(Path(args.schema).read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            print(f"xworkmate-bridge llm: cannot read the schema {args.schema}: {exc}", file=sys.stderr)
            return 2
        method = "llm.completeStructured"
        params = {
            "instructions": args.system or STRUCTURED_INSTRUCTIONS,
            "input": [{"type": "text", "text": args.text}],
            "jsonSchema": schema,
            "schemaName": Path(args.schema).stem.replace(".", "_")[:64] or "result",
            **options,
        }
    else:
        method = "llm.complete"
        messages = [{"role": "system", "content": args.system}] if args.system else []
        params = {"messages": [*messages, {"role": "user", "content": args.text}], **options}
    timeout = (args.timeout or 300) + 30
    reply = anyio.run(lambda: call(args.url, method, params, token=args.token, timeout=timeout))
    if "error" in reply:
        _explain(reply["error"])
        return 1
    result = reply.get("result") or {}
    if args.json:
        _print(result)
    elif result.get("contentType") == "json":
        print(json.dumps(result.get("parsed"), ensure_ascii=False, indent=2))
    else:
        print(result.get("text", ""))
    if error := result.get("error"):
        print(f"{error.get('code')}: {error.get('message')}", file=sys.stderr)
        return 1
    return 0


def cmd_providers(args: argparse.Namespace) -> int:
    if not args.local and (args.probe or args.config):
        print(
            "xworkmate-bridge providers: --probe and --config read the configuration and need --local", file=sys.stderr
        )
        return 2
    if not args.local:
        from bridge.client import call

        reply = anyio.run(lambda: call(args.url, "acp.capabilities", {}, token=args.token, timeout=30))
        if "error" in reply:
            _explain(reply["error"])
            return 1
        catalog = reply["result"]["providerCatalog"] + reply["result"].get("gatewayProviders", [])
        summary = {p["providerId"]: p for p in reply["result"]["providerProbeSummary"]}
    else:
        config = load_config(args.config)

        async def local() -> tuple[list[dict[str, Any]], dict[str, Any]]:
            from bridge.wiring import build_orchestrator

            orch = build_orchestrator(config)
            if args.probe:
                await orch.registry.probe_all()
            caps = msgspec.to_builtins(orch.capabilities())
            await orch.registry.aclose()
            catalog = caps["providerCatalog"] + caps["gatewayProviders"]
            return catalog, {p["providerId"]: p for p in caps["providerProbeSummary"]}

        catalog, summary = anyio.run(local)
    for entry in catalog:
        default = "ok" if entry.get("enabled") else "error"  # gateways have no probe summary
        status = summary.get(entry["providerId"], {}).get("status", default)
        reason = f"  ({entry['unavailableReason']})" if entry.get("unavailableReason") else ""
        print(f"{entry['providerId']:<12} {entry['label']:<14} {entry['category']:<10} {status}{reason}")
    return 0


def cmd_sources(args: argparse.Namespace) -> int:
    """The configured and registered knowledge sources and their status, read from the
    configuration and the registry in the state directory (no server)."""
    from bridge.wiring import build_knowledge

    try:
        config = load_config(args.config, {"stateDir": args.state_dir})
        knowledge = build_knowledge(config)
    except ConfigError as exc:
        print(f"xworkmate-bridge sources: {exc}", file=sys.stderr)
        return 2

    async def listing() -> dict[str, Any]:
        async with knowledge:
            return await knowledge.list_sources(args.probe)

    result = anyio.run(listing)
    if args.json:
        print(json.dumps(result, ensure_ascii=False, indent=1))
        return 0
    for entry in result["sources"]:
        if not entry["enabled"]:
            status = "disabled"
        elif not args.probe:
            status = "registered" if entry.get("registered") else "configured"
        else:
            status = "ready" if entry["ready"] else f"not ready ({entry.get('reason') or 'unknown'})"
        pages = f"  {entry['pageCount']} pages" if entry.get("pageCount") is not None else ""
        print(f"{entry['id']:<20} {entry['label'][:24]:<24} {entry['protocol']:<14} {status}{pages}")
    registry = knowledge.registry
    for source_id, reason in (registry.blocked if registry is not None else {}).items():
        print(f"{source_id:<20} {'':<24} {'':<14} registered, not used ({reason})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xworkmate-bridge", description="JSON-RPC control plane for coding agents")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    url = _env("BRIDGE_URL") or DEFAULT_URL
    token = _env("BRIDGE_AUTH_TOKEN")
    config_help = "YAML or JSON configuration (default: $BRIDGE_CONFIG_PATH, else ./xworkmate-bridge.yaml)"
    state_help = "where sessions are stored (default: the config's stateDir, else <dataDir>/state)"
    only_help = "enable this one provider only (a configured id, a preset, knowledge, or openclaw)"

    def client_options(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--url", default=url, help="the bridge, http://… or ws://… (default: $BRIDGE_URL or %(default)s)"
        )
        p.add_argument("--token", default=token, help="bearer token (default: $BRIDGE_AUTH_TOKEN)")

    p = sub.add_parser("serve", help="run the HTTP/WebSocket server")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1; off loopback a token is required)")
    p.add_argument("--port", type=int, help="port (default 8787)")
    p.add_argument("--config", help=config_help)
    p.add_argument(
        "--allow-insecure-no-auth", action="store_true", help="allow listening off loopback with no token (unsafe)"
    )
    p.add_argument("--state-dir", help=state_help)
    p.add_argument("--only", metavar="PROVIDER", help=only_help)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("acp-stdio", help="serve the same methods over stdin/stdout")
    p.add_argument("--config", help=config_help)
    p.add_argument("--state-dir", help=state_help)
    p.add_argument("--only", metavar="PROVIDER", help=only_help)
    p.set_defaults(func=cmd_acp_stdio)

    p = sub.add_parser("call", help="send one request and print the response")
    p.add_argument("method", help="e.g. acp.capabilities")
    p.add_argument("params", nargs="?", help="the params, a JSON object")
    client_options(p)
    p.add_argument("--stream", action="store_true", help="also print each notification as it arrives")
    p.set_defaults(func=cmd_call)

    p = sub.add_parser("chat", help="run one turn and print the agent's streamed text")
    p.add_argument("prompt")
    p.add_argument("--provider", help="provider id (see `providers`); default: routing picks one")
    p.add_argument(
        "--target",
        choices=("agent", "gateway"),
        help="route explicitly to an agent or to the configured OpenClaw gateway (default: routing decides)",
    )
    p.add_argument("--model", help="model to apply, when the agent supports choosing one")
    p.add_argument("--cwd", help="the agent's working directory (inside the bridge's workspaceRoots)")
    p.add_argument(
        "--json", action="store_true", help="print the turn's result as JSON (text, anchors, artifacts) instead"
    )
    client_options(p)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("llm", help="one model call on the bridge's model runtimes (llm.complete)")
    p.add_argument("text", help="the prompt (with --schema: the input)")
    p.add_argument(
        "--schema", help="a JSON Schema file: ask for JSON, check the reply, print it (llm.completeStructured)"
    )
    p.add_argument("--system", help="a system prompt (with --schema: the instructions)")
    p.add_argument("--provider", help="a runtime id of llm.runtimes (default: the bridge's default)")
    p.add_argument("--model", help="a model (only when the bridge allows this principal to choose)")
    p.add_argument("--purpose", help="why the call is made, for the audit line")
    p.add_argument("--max-tokens", type=int, help="the reply's bound in tokens")
    p.add_argument("--temperature", type=float)
    p.add_argument("--timeout", type=float, help="seconds (capped by llm.maxTimeoutSeconds)")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON (usage, audit, …)")
    client_options(p)
    p.set_defaults(func=cmd_llm)

    p = sub.add_parser("openrpc", help="print the bridge's contract as an OpenRPC document (rpc.discover)")
    p.set_defaults(func=cmd_openrpc)

    p = sub.add_parser("providers", help="list providers and their probe status")
    p.add_argument("--local", action="store_true", help="read the configuration instead of asking the bridge")
    p.add_argument("--probe", action="store_true", help="with --local: run the full probe (ACP initialize)")
    p.add_argument("--config", help=config_help)
    client_options(p)
    p.set_defaults(func=cmd_providers)

    p = sub.add_parser("sources", help="list the configured and registered knowledge sources and their status")
    p.add_argument("--probe", action="store_true", help="ask each source what it can do (a network call per source)")
    p.add_argument("--json", action="store_true", help="print the knowledge.sources result as JSON")
    p.add_argument("--config", help=config_help)
    p.add_argument("--state-dir", help="where the source registry is kept (default: the config's stateDir)")
    p.set_defaults(func=cmd_sources)
    return parser


def cmd_openrpc(args: argparse.Namespace) -> int:
    """Print the OpenRPC document (``xworkmate-bridge openrpc > docs/openrpc.json``)."""
    from bridge.methods import openrpc_document
    from bridge.openrpc import without_version

    print(json.dumps(without_version(openrpc_document()), indent=2, ensure_ascii=False))
    return 0


def _adapter(provider_id: str) -> int:
    """The original bridge's one-provider entry points: ``serve --only <provider>`` with the
    rest of the command line as ``serve``'s flags."""
    return main(["serve", "--only", provider_id, *sys.argv[1:]])


def gemini_adapter() -> int:
    return _adapter("gemini")


def hermes_adapter() -> int:
    return _adapter("hermes")


def opencode_adapter() -> int:
    return _adapter("opencode")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"xworkmate-bridge: configuration error:\n{exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `xworkmate-bridge providers | head`: the reader left
        # Point stdout at /dev/null so the flush at exit does not raise again (Python docs, signal
        # module, "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:
        if code := _exit_code(exc):
            print(f"xworkmate-bridge: {exc}", file=sys.stderr)
            return code
        raise


def _exit_code(exc: Exception) -> int | None:
    """2 for ``bridge.client.TransportError``, 3 for ``bridge.server.ListenError``, else None.

    Both modules are imported only when a command failed: the client pulls in httpx (~30 ms that
    ``serve`` does not need, bench case 6), the server uvicorn (which ``call`` does not need).
    """
    if "bridge.server" in sys.modules:
        from bridge.server import ListenError

        if isinstance(exc, ListenError):
            return 3
    from bridge.client import TransportError

    return 2 if isinstance(exc, TransportError) else None


if __name__ == "__main__":
    sys.exit(main())
