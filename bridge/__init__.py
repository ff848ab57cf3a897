"""xworkmate-bridge: transports, wire, auth and CLI (see docs/api.md)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("xworkmate-bridge")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

CONTRACT_VERSION = "1.0"
