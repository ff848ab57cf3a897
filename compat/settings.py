"""Configuration models shared by the adapters: provider entries, time bounds and size limits.

These are the validated shapes of the YAML keys in docs/api.md ("Configuration"). Keys are
camelCase in YAML and on the wire, snake_case in Python. Unknown keys are errors, so a typo in an
operator's file is reported by name instead of silently ignored.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

PermissionPolicy = Literal["allow", "deny", "ask"]
MiB = 1024 * 1024


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class Timeouts(_Model):
    """Time bounds in seconds (contract: "Time bounds")."""

    initialize_timeout: float = Field(30.0, gt=0)
    session_new_timeout: float = Field(30.0, gt=0)
    turn_timeout: float = Field(1800.0, gt=0)
    cancel_grace: float = Field(5.0, gt=0)
    idle_timeout: float = Field(600.0, gt=0)
    permission_timeout: float = Field(60.0, gt=0)
    probe_interval: float = Field(15.0, gt=0)
    session_idle_timeout: float = Field(3600.0, gt=0)  # an idle session is forgotten after this


class Limits(_Model):
    """Size and count limits in bytes / items (contract: "Limits")."""

    max_message_bytes: int = Field(4 * MiB, gt=0)
    max_agent_line_bytes: int = Field(8 * MiB, gt=0)
    max_output_bytes: int = Field(8 * MiB, gt=0)
    max_update_bytes: int = Field(1 * MiB, gt=0)
    stderr_tail_bytes: int = Field(64 * 1024, gt=0)
    client_stderr_tail_bytes: int = Field(4 * 1024, gt=0)
    max_queued_turns: int = Field(16, ge=0)
    max_sessions: int = Field(1000, gt=0)
    max_running_turns: int = Field(128, gt=0)  # turns running at once bridge-wide; more wait
    max_connection_queue: int = Field(65536, gt=0)  # outbound envelopes buffered per connection
    max_connection_queue_bytes: int = Field(16 * MiB, gt=0)  # and their bytes; then the client is dropped
    done_message_bytes: int = Field(64 * 1024, gt=0)
    tool_content_bytes: int = Field(64 * 1024, gt=0)


class ProviderConfig(_Model):
    """One ``providers.<id>`` entry. Presets fill ``command``/``args``/``label`` when omitted."""

    type: Literal["acp", "knowledge"] = "acp"  # exec profiles are ProfileConfig (profile_settings)
    command: str | None = None
    args: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    env_passthrough: list[str] = Field(default_factory=list)
    cwd: str | None = None
    label: str | None = None
    permission_policy: PermissionPolicy = "allow"
    auth_method: str | None = None
    model: str | None = None
    model_flag: str | None = None  # e.g. "-m": apply a model at launch when the agent has no ACP way
    enabled: bool = True
    sources: list[str] | None = None  # knowledge providers: the source ids to use (default all)
