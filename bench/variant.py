"""The bridge's app under other uvicorn settings, for the settings sweep (``bench/run.py --sweep``).

Same app (``bridge.cli.build_app``) and the same options as ``xworkmate-bridge serve``
(``bridge.server.uvicorn_config``), with ``--http``, ``--ws`` and ``--loop`` replaced. Used only
to choose the defaults by absolute measurement; the benchmark cases run the real command.
"""

from __future__ import annotations

import argparse

from bench.serveropts import SETTINGS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--port", type=int, required=True)
    for name in SETTINGS:
        parser.add_argument(f"--{name}")
    args = parser.parse_args()

    from bridge.cli import _setup_logging, build_app
    from bridge.config import load_config
    from bridge.server import BridgeServer, uvicorn_config

    config = load_config(args.config, {"port": args.port})
    _setup_logging(config.log_level)
    uv = uvicorn_config(config, build_app(config))
    for name in SETTINGS:
        if getattr(args, name):
            setattr(uv, name, getattr(args, name))
    BridgeServer(uv).run()


if __name__ == "__main__":
    main()
