"""The same echo profile written for every runtime the machine has, through ``ProfileAdapter``:
streaming on and off, and the upstream session id carried across two turns.

python, node and bash are required; ruby and tsx (scripts/install-profile-tools.sh) are tested when
installed. Each script streams ``"echo: "`` and the message, reports a session id (``<rt>-1``, then
the previous id plus ``+``) and prints ``echo: <message>`` as its body.
"""

from __future__ import annotations

import shutil

import orjson
import pytest

from compat.profile.settings import find_tsx

from .conftest import ProfileFactory, deltas, run_turn

RUNTIMES = {  # runtime → (script, first session id, installed?)
    "python": ("echo.py", "py-1", shutil.which("python3") is not None),
    "node": ("echo.js", "js-1", shutil.which("node") is not None),
    "bash": ("echo.sh", "sh-1", shutil.which("bash") is not None),
    "ruby": ("echo.rb", "rb-1", shutil.which("ruby") is not None),
    "tsx": ("echo.ts", "ts-1", find_tsx() is not None and shutil.which("node") is not None),
    "direct": ("echo-exec", "exec-1", True),
}
# The issue asks for every runtime "that the machine has": ruby is tested where it is installed.
# Every other runtime is required (python3, node and bash are on every machine; tsx is installed by
# `make test`), so a missing one fails instead of being skipped.
OPTIONAL = {"ruby"}
PRESENT = [r for r, (_, _, installed) in RUNTIMES.items() if installed or r not in OPTIONAL]


def _require(runtime: str) -> str:
    script, _, installed = RUNTIMES[runtime]
    if not installed:
        pytest.fail(f"{runtime} is required for the profile tests: run `make test` (it installs tsx)")
    return script


@pytest.mark.parametrize("runtime", PRESENT)
async def test_streaming_profile_sends_partials_live_and_tracks_its_session(
    runtime: str, make_profile: ProfileFactory
) -> None:
    script, first_id, _ = RUNTIMES[runtime]
    _require(runtime)
    adapter = make_profile(script=script)
    assert adapter.probe_cheap().available and adapter.info.category == "profile"
    session = adapter.open_session("s1")

    outcome, sink = await run_turn(session, "héllo wörld")
    assert outcome.status == "completed" and outcome.error is None, outcome
    streamed = ["echo: "] if runtime == "direct" else ["echo: ", "héllo wörld"]
    assert deltas(sink)[: len(streamed)] == streamed
    # the body repeats what was streamed: only the rest (if any) is sent, nothing twice
    assert "".join(deltas(sink)) == "echo: héllo wörld"
    assert outcome.upstream_session_id == first_id

    again, sink2 = await run_turn(session, "second")
    assert again.status == "completed" and "".join(deltas(sink2)) == "echo: second"
    assert again.upstream_session_id == first_id + "+"  # the profile got AGENT_SESSION_ID back
    assert session.upstream_session_id == first_id + "+"


@pytest.mark.parametrize("runtime", PRESENT)
async def test_non_streaming_profile_drops_partials_and_sends_the_body_once(
    runtime: str, make_profile: ProfileFactory
) -> None:
    _require(runtime)
    session = make_profile(script=RUNTIMES[runtime][0], streaming=False).open_session("s1")
    outcome, sink = await run_turn(session, "quiet")
    assert outcome.status == "completed"
    assert deltas(sink) == ["echo: quiet"]  # one delta at exit
    orjson.dumps([e.text for e in sink.events])  # wire-safe
