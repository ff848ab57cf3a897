"""xworkmate-bridge: transports, wire, auth and CLI (see docs/api.md)."""

__version__ = "0.1.0"
"""The package version; pyproject.toml reads it from here (importlib.metadata cost ~15 ms per start)."""

CONTRACT_VERSION = "1.0"
