"""Every test gets a data directory of its own (``XDG_DATA_HOME``), so the session store one test
writes is never what another test's bridge reads back."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _own_data_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("data")))
