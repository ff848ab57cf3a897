"""``compat.acp.failures``: how a peer error ends a turn, in words a user can act on."""

from __future__ import annotations

from compat.acp.connection import AUTH_REQUIRED
from compat.acp.failures import AUTH_HINT, AUTH_HINT_NO_METHODS, turn_failure
from compat.peer import PeerClosed, ResponseError


def test_an_agent_that_names_no_auth_methods_gets_a_hint_that_does_not_point_to_them() -> None:
    """Claude's agent names none: the hint once said to pick one of authMethods, an empty list."""
    failure = turn_failure(ResponseError(AUTH_REQUIRED, "Authentication required"), "session", None, 4096)
    assert failure.error.code == "AGENT_AUTH_REQUIRED"
    assert failure.error.data["authMethods"] == [] and failure.error.data["hint"] == AUTH_HINT_NO_METHODS
    assert "authMethods" not in AUTH_HINT_NO_METHODS and "authMethods" in AUTH_HINT


def test_an_agent_that_closed_its_output_but_runs_is_not_said_to_have_exited_with_none() -> None:
    failure = turn_failure(PeerClosed(None, ""), "prompt", None, 4096)
    assert failure.error.code == "AGENT_EXITED" and "None" not in failure.error.message
    assert turn_failure(PeerClosed(3, ""), "prompt", None, 4096).error.message == "agent exited with code 3"
