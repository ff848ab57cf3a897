"""What a bridge does not load at start: prometheus-client (loaded with the first scrape of
/metrics) and OpenTelemetry (loaded only when tracing is configured); acp-stdio never loads either."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("package", ["prometheus_client", "opentelemetry"])
def test_building_the_app_loads_neither_metrics_nor_tracing_libraries(package):
    code = (
        "import sys, bridge.cli, bridge.stdio, bridge.acp_agent, bridge.metrics\n"
        "from bridge.config import BridgeConfig\n"
        "from compat.settings import convert\n"
        "bridge.cli.build_app(convert({}, BridgeConfig))\n"
        f"assert not [m for m in sys.modules if m.split('.')[0] == {package!r}], 'imported at start'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
