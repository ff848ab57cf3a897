"""Configuration models shared by the adapters: provider entries, time bounds and size limits,
and the one way every configuration shape is validated.

These are the validated shapes of the YAML keys in docs/api.md ("Configuration"). Keys are
camelCase in YAML and on the wire, snake_case in Python. Unknown keys are errors, so a typo in an
operator's file is reported by name instead of silently ignored.

Configuration shapes are msgspec structs, not pydantic models: the bridge validates its
configuration before it can answer anything, and pydantic's import and model building were
~75 ms of a ~230 ms cold start (bench case 6; msgspec: ~5 ms). Method params, validated only when
a request needs them, stay pydantic (orchestrator.models).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import os
import re
import types
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import msgspec

PermissionPolicy = Literal["allow", "deny", "ask"]
MiB = 1024 * 1024

Seconds = Annotated[float, msgspec.Meta(gt=0)]
"""A time bound in seconds, > 0."""
Count = Annotated[int, msgspec.Meta(gt=0)]
"""A size in bytes or a count of items, > 0."""

T = TypeVar("T")


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    """Base of the configuration shapes: camelCase keys, unknown keys rejected, immutable.

    Build one from raw (YAML-loaded) data with :func:`convert`; the constructor takes the Python
    names and checks nothing but ``__post_init__``.
    """


class FieldInvalid(ValueError):
    """Raised by a struct's ``__post_init__`` about one of its fields; reported at that field's
    key (``profiles.bot.script: must not be empty``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class Problem(msgspec.Struct, frozen=True):
    """One validation failure: ``loc`` is the dotted key path (camelCase where the keys are);
    ``type`` is pydantic's name for the kind of failure (``extra_forbidden``, ``missing``,
    ``string_type``, ``literal_error``, ``value_error``, …), or ``duplicate_key``; ``path`` is
    ``loc`` as the keys and list indices themselves (below ``where``), for finding the value in
    its source; ``got`` is the value that failed, when one did."""

    loc: str
    msg: str
    type: str = "invalid"
    path: tuple[Any, ...] = ()
    got: Any = None

    def line(self) -> str:
        return f"{self.loc}: {self.msg}" if self.loc else self.msg


class SettingsError(ValueError):
    """Raw data does not fit a configuration shape. ``problems`` has every failure found (see
    :func:`convert`); ``str()`` is one ``key: message`` line per problem."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(p.line() for p in problems))
        self.problems = problems


MAX_PROBLEMS = 50
"""Problems :func:`convert` reports at most (a file of garbage is not a list of 10,000 lines)."""


def convert(raw: Any, shape: type[T], where: str = "") -> T:
    """Validate ``raw`` (YAML/JSON-loaded data) into ``shape``, reporting every problem at once.

    Lax like YAML users expect: ``"8787"`` is a valid port, an int a valid float. A key may also
    be spelled with its Python name (``max_running_turns`` for ``maxRunningTurns``), as it could
    when these shapes were pydantic models.

    msgspec stops at the first failure, so each failing value is cut out of (a copy of) the data
    and the rest validated again, until the data fits or :data:`MAX_PROBLEMS` are found. What
    only followed from a cut (the key it removed is now missing) is not reported.

    Args:
        raw: The loaded data.
        shape: A :class:`Settings` struct (or any type msgspec converts to).
        where: The key path of ``raw`` in its file, prefixed to every problem's ``loc``.

    Raises:
        SettingsError: Every problem found, each located by key (``limits.maxOutputBytes:
            Expected `int`, got `str```; ``providers.x.foo: unknown key``), in the data's order.
    """
    problems: list[Problem] = []
    try:
        data = _prepare(raw, shape, where, problems)
    except RecursionError:
        raise SettingsError([Problem(where, "nested too deeply")]) from None
    cut: list[tuple[Any, ...]] = []  # paths cut out so far
    while True:
        try:
            value = msgspec.convert(data, shape, strict=False)
        except msgspec.ValidationError as exc:
            problem, keys = _problem(exc, data, shape, where)
            if not any(_under(keys, gone) or _under(gone, keys) for gone in cut):
                problems.append(problem)
            remove = _removable(problem, keys)
            if not remove or len(problems) >= MAX_PROBLEMS or remove in cut:
                break
            data = _without(data, remove)
            cut.append(remove)
            continue
        except RecursionError:
            problems.append(Problem(where, "nested too deeply"))
            break
        if not problems:
            return value
        break
    raise SettingsError(problems)


def _under(path: tuple[Any, ...], prefix: tuple[Any, ...]) -> bool:
    return path[: len(prefix)] == prefix


def _removable(problem: Problem, keys: tuple[Any, ...]) -> tuple[Any, ...]:
    """The path to cut so the next validation gets past ``problem``: the failing key itself, the
    struct a required key is missing from, or a list as a whole (cutting one element would
    renumber the ones after it). ``()``: nothing can be cut (the top level failed)."""
    if problem.type == "missing":
        keys = keys[:-1]  # the struct the key is missing from
    first_index = next((i for i, k in enumerate(keys) if isinstance(k, int)), None)
    if first_index is not None:
        keys = keys[:first_index]
    return keys


def _without(data: Any, path: tuple[Any, ...]) -> Any:
    """A copy of ``data`` without the entry at ``path`` (copied along the path only)."""
    if not path or not isinstance(data, dict) or path[0] not in data:
        return data
    out = dict(data)
    if len(path) == 1:
        del out[path[0]]
    else:
        out[path[0]] = _without(out[path[0]], path[1:])
    return out


_STRUCT = object()
"""``Problem.got`` of a ``__post_init__`` refusal that is not about one field."""


def _prepare(raw: Any, shape: Any, where: str, problems: list[Problem]) -> Any:
    """``raw`` as the pydantic models took it, for msgspec: each key that is a struct field's
    Python name renamed to its wire name, and the strings pydantic read as booleans (``yes``,
    ``off``, …, as a ``${VAR}`` gives them) or as numbers with surrounding blanks converted.

    A key given in both spellings is a ``duplicate_key`` problem (appended to ``problems``); the
    wire spelling is kept.
    """
    origin = get_origin(shape)
    if origin is Annotated:
        return _prepare(raw, get_args(shape)[0], where, problems)
    if origin in (Union, types.UnionType):
        for arm in get_args(shape):
            raw = _prepare(raw, arm, where, problems)
        return raw
    if isinstance(raw, str):
        if shape is bool:
            return _BOOLS.get(raw.strip().lower(), raw)
        return raw.strip() if shape in (int, float) else raw
    if isinstance(raw, dict) and isinstance(shape, type) and issubclass(shape, msgspec.Struct):
        out = dict(raw)
        for f in msgspec.structs.fields(shape):
            if f.name != f.encode_name and f.name in out:
                if f.encode_name in out:
                    loc = _join(where, f.encode_name)
                    problems.append(Problem(loc, f"given twice, also as {f.name}", "duplicate_key"))
                    del out[f.name]
                else:
                    out[f.encode_name] = out.pop(f.name)
            if f.encode_name in out:
                out[f.encode_name] = _prepare(out[f.encode_name], f.type, _join(where, f.encode_name), problems)
        return out
    if isinstance(raw, list) and origin in (list, tuple) and get_args(shape):
        return [_prepare(item, get_args(shape)[0], _join(where, str(i)), problems) for i, item in enumerate(raw)]
    if isinstance(raw, dict) and origin is dict and len(get_args(shape)) == 2:
        return {k: _prepare(v, get_args(shape)[1], _join(where, str(k)), problems) for k, v in raw.items()}
    return raw


_BOOLS = {
    **dict.fromkeys(("1", "on", "t", "true", "y", "yes"), True),
    **dict.fromkeys(("0", "off", "f", "false", "n", "no"), False),
}
"""The strings pydantic's lax mode reads as booleans."""


_VAR = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\})")


class Expanded(msgspec.Struct, frozen=True):
    """A string with its environment references replaced (:func:`expand_env`): ``missing``
    names variables that are not set (and had no default), ``empty`` those that are set but
    empty and whose empty value was used."""

    text: str
    missing: tuple[str, ...] = ()
    empty: tuple[str, ...] = ()


def expand_env(text: str, environ: Mapping[str, str] | None = None) -> Expanded:
    """Replace environment references in ``text`` as POSIX shells do (``sh`` "Parameter
    Expansion"): ``${VAR}``; ``${VAR:-default}``, the default when ``VAR`` is unset or empty;
    ``${VAR-default}``, the default when it is unset; and ``$$``, a literal ``$``. A default is
    taken as written (not expanded again); any other ``$`` stays as it is."""
    env = os.environ if environ is None else environ
    missing: list[str] = []
    empty: list[str] = []

    def sub(match: re.Match[str]) -> str:
        if match.group(1):
            return "$"
        name, op, default = match.group(2), match.group(3), match.group(4)
        value = env.get(name)
        if op == ":-" and not value:
            return default
        if op == "-" and value is None:
            return default
        if value is None:
            missing.append(name)
            return ""
        if not value:
            empty.append(name)
        return value

    result = _VAR.sub(sub, text) if "$" in text else text
    return Expanded(result, tuple(missing), tuple(empty))


def snake_case(key: str) -> str:
    """``modelFlag`` → ``model_flag``: a camelCase key's Python name."""
    return re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _type_at(shape: Any, keys: list[str]) -> Any:
    """The declared type at ``keys`` below ``shape`` (None where the path leaves the shape)."""
    for key in keys:
        shape = _unwrap(shape)
        origin = get_origin(shape)
        if isinstance(shape, type) and issubclass(shape, msgspec.Struct):
            shape = next((f.type for f in msgspec.structs.fields(shape) if f.encode_name == key), None)
        elif origin in (list, tuple) and get_args(shape):
            shape = get_args(shape)[0]
        elif origin is dict and len(get_args(shape)) == 2:
            shape = get_args(shape)[1]
        else:
            return None
    return _unwrap(shape)


def _unwrap(shape: Any) -> Any:
    """``shape`` without ``Annotated`` and without ``None`` in a union of one other type."""
    while True:
        origin = get_origin(shape)
        if origin is Annotated:
            shape = get_args(shape)[0]
        elif (
            origin in (Union, types.UnionType) and len(arms := [a for a in get_args(shape) if a is not type(None)]) == 1
        ):
            shape = arms[0]
        else:
            return shape


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `(?P<path>[^`]*)`)?$", re.DOTALL)
_AT_KEY = re.compile(r"^(?P<msg>.*?) - at `key` in `(?P<path>[^`]*)`$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>.*)`$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<name>.*)`$", re.DOTALL)
_WRONG_TYPE = re.compile(r"^Expected `(?P<type>\w+)`, got `\w+`$")
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_TYPES = {
    "str": "string_type",
    "int": "int_type",
    "float": "float_type",
    "bool": "bool_type",
    "array": "list_type",
    "object": "dict_type",
    "null": "none_required",
}
"""msgspec's type names → the error ``type`` pydantic reports for the same failure (the params
that stay pydantic use those, so one request's ``data.errors`` speak one vocabulary)."""


def _problem(exc: msgspec.ValidationError, raw: Any, shape: type[Any], where: str) -> tuple[Problem, tuple[Any, ...]]:
    """The problem ``exc`` reports, and the path in ``raw`` of what failed."""
    # msgspec's ValidationError is one string, "<message> - at `$.a[0].b`" (or "- at `key` in
    # `$.a`" for a dict key), with a dict's entry shown as `[...]`; the format has held since
    # msgspec 0.18 (pinned in pyproject; tests/bridge/test_config.py checks the keys it yields).
    text = str(exc)
    key_error = _AT_KEY.match(text)
    match = key_error or _AT.match(text)
    assert match is not None  # _AT matches any string
    msg, where_at = match["msg"], match["path"] or "$"
    steps = [m.group(1) or m.group(2) for m in _STEP.finditer(where_at)]
    keys = _locate(steps, raw, shape, text)
    labels = [str(k) for k in keys]
    cause, kind, got = exc.__cause__, "invalid", _at(raw, keys)
    path: list[Any] = list(keys)
    if key_error:
        bad = next((k for k in got or () if not isinstance(k, str)), None)
        msg = f"key {bad!r} must be a string" if bad is not None else f"{msg} (a key)"
        got = bad
        if bad is not None:
            path.append(bad)
    elif isinstance(cause, FieldInvalid):
        labels.append(cause.field)
        path.append(cause.field)
        msg, kind = cause.message, "value_error"
        got = (got or {}).get(cause.field) if isinstance(got, dict) else None
    elif isinstance(cause, ValueError):  # the struct's __post_init__ refused it as a whole
        kind, got = "value_error", _STRUCT
    elif unknown := _UNKNOWN.match(msg):
        msg, kind = "unknown key" + _did_you_mean(unknown["name"], _type_at(shape, labels)), "extra_forbidden"
        labels.append(unknown["name"])
        path.append(unknown["name"])
        got = None
    elif missing := _MISSING.match(msg):
        labels.append(missing["name"])
        path.append(missing["name"])
        msg, kind, got = "missing required key", "missing", None
    elif msg.startswith("Invalid enum value"):
        kind = "literal_error"
        if get_origin(declared := _type_at(shape, labels)) is Literal:
            msg += ", expected one of " + ", ".join(repr(v) for v in get_args(declared))
    elif wrong := _WRONG_TYPE.match(msg):
        kind = _TYPES.get(wrong["type"], "type_error")
    elif msg.startswith("Expected `"):  # a constraint: "Expected `int` >= 1", "... of length <= 64"
        kind = "value_error"
    loc = ".".join([where, *labels] if where else labels)
    return Problem(loc, msg, kind, tuple(path), got), tuple(path)


def _did_you_mean(name: str, struct: Any) -> str:
    """`` (did you mean timeout_secs?)`` for a key that is a field in another spelling or close to one."""
    if not (isinstance(struct, type) and issubclass(struct, msgspec.Struct)):
        return ""
    import difflib  # only on this error path: ~0.7 ms of the cold start otherwise

    known = [f.encode_name for f in msgspec.structs.fields(struct)]
    folded = {k.replace("_", "").lower(): k for k in known}
    close = folded.get(name.replace("_", "").replace("-", "").lower()) or next(
        iter(difflib.get_close_matches(name, known, n=1, cutoff=0.8)), None
    )
    return f" (did you mean {close}?)" if close else ""


def _locate(steps: list[str], raw: Any, shape: type[Any], error: str) -> list[Any]:
    """The path of ``error`` in ``raw`` as real keys and indices, each ``...`` step (a dict's
    entry) replaced by the key of the entry that fails.

    msgspec checks a dict's entries in order and stops at the first failure, so the failing
    entry is the last of the shortest prefix of the dict that still fails with the same
    ``error``: a bisection, O(log n) conversions (the other entries of dicts already resolved
    are left out, so their problems cannot answer for this one). Only on the error path.
    """
    path: list[Any] = []
    narrowed_at: set[int] = set()
    for step in steps:
        node = _at(raw, path)
        if step != "...":
            path.append(int(step) if isinstance(node, list) and step.isdigit() else step)
            continue
        entries = list(node.items()) if isinstance(node, dict) else []
        fails = lambda k, entries=entries: _still_fails(raw, path, narrowed_at, dict(entries[:k]), shape, error)  # noqa: E731
        if not entries or not fails(len(entries)):
            return [*path, "…"]
        lo, hi = 1, len(entries)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fails(mid) else (mid + 1, hi)
        narrowed_at.add(len(path))
        path.append(entries[lo - 1][0])
    return path


def _at(raw: Any, path: list[Any]) -> Any:
    for key in path:
        if (isinstance(raw, dict) and key in raw) or (
            isinstance(raw, list) and isinstance(key, int) and key < len(raw)
        ):
            raw = raw[key]
        else:
            return None
    return raw


def _still_fails(
    raw: Any, path: list[Any], narrowed_at: set[int], entries: dict[Any, Any], shape: type[Any], error: str
) -> bool:
    def narrowed(node: Any, depth: int) -> Any:
        if depth == len(path):
            return entries
        key = path[depth]
        if depth in narrowed_at:
            return {key: narrowed(node[key], depth + 1)}
        if isinstance(node, dict):
            return {**node, key: narrowed(node[key], depth + 1)}
        return [narrowed(item, depth + 1) if i == key else item for i, item in enumerate(node)]

    try:
        msgspec.convert(narrowed(raw, 0), shape, strict=False)
    except msgspec.ValidationError as exc:
        return str(exc) == error  # not another problem elsewhere in the file
    return False


_WHITESPACE = re.compile(r"\s+")


def normalize_provider_id(value: str) -> str:
    """A provider id in the desktop app's form: lower case, runs of whitespace, ``_``, ``.`` and
    ``-`` one ``-``, other characters dropped, no ``-`` at either end (``My_Agent`` → ``my-agent``).

    The app normalises every id before it sends one back (``normalizeSingleAgentProviderId`` in
    ``lib/runtime/runtime_models_connection.dart`` of ai-workspace-lab/xworkmate-app), so the bridge
    resolves ids in this form too and refuses a configuration where two ids meet in it.
    """
    out: list[str] = []
    for char in _WHITESPACE.sub("-", value.strip().lower()):
        if "a" <= char <= "z" or "0" <= char <= "9":
            out.append(char)
        elif char in "-_." and out and out[-1] != "-":
            out.append("-")
    return "".join(out).strip("-")


def provider_id_problems(ids: Mapping[str, str]) -> list[str]:
    """``<key path>: <message>`` for each id (``{id: key path}``) that normalises to nothing or to
    the same form as an earlier one (:func:`normalize_provider_id`)."""
    problems: list[str] = []
    seen: dict[str, str] = {}
    for provider_id, where in ids.items():
        form = normalize_provider_id(provider_id)
        if not form:
            problems.append(f"{where}: the id {provider_id!r} has no letter or digit (the app could not name it)")
        elif form in seen:
            problems.append(
                f"{where}: the id {provider_id!r} is the same as {seen[form]!r} once normalised to {form!r} "
                "(as the app sends ids back)"
            )
        else:
            seen[form] = provider_id
    return problems


class Timeouts(Settings, frozen=True):
    """Time bounds in seconds (contract: "Time bounds")."""

    initialize_timeout: Seconds = 30.0
    session_new_timeout: Seconds = 30.0
    turn_timeout: Seconds = 1800.0
    cancel_grace: Seconds = 5.0
    idle_timeout: Seconds = 600.0
    permission_timeout: Seconds = 60.0
    probe_interval: Seconds = 15.0
    session_idle_timeout: Seconds = 3600.0  # an idle session is forgotten after this
    progress_interval: Seconds = 10.0  # silence in a turn before a "waiting" status update
    header_timeout: Seconds = 10.0  # a connection's request headers must be complete by then
    agent_capacity_timeout: Seconds = 30.0  # a turn waits this long for one of maxLiveAgents
    session_retention: Seconds = 30 * 86400.0  # a stored session idle this long is pruned
    shutdown_grace: Seconds = 5.0  # on SIGTERM/SIGINT/SIGHUP running turns get this long, then are cancelled
    disconnect_grace: Seconds = 0.0  # 0: a turn whose client left runs on; else it is cancelled this long after


class Limits(Settings, frozen=True):
    """Size and count limits in bytes / items (contract: "Limits")."""

    max_message_bytes: Count = 36 * MiB  # admits maxTurnAttachmentBytes of inline attachments (base64)
    max_attachment_bytes: Count = 10 * MiB  # one inline attachment, decoded (the app's own cap)
    max_turn_attachment_bytes: Count = 25 * MiB  # a turn's inline attachments, decoded (the app's own cap)
    max_remote_workspace_bytes: Count = 1024 * MiB  # one session's remote workspace, checked before each turn
    max_artifact_scan_files: Count = 10_000  # files a turn's artifact scan lists, then no artifacts
    max_artifact_result_bytes: Count = 8 * MiB  # artifact content in one result (base64), then listed only
    max_agent_line_bytes: Count = 8 * MiB
    max_output_bytes: Count = 8 * MiB
    max_update_bytes: Count = 1 * MiB
    stderr_tail_bytes: Count = 64 * 1024
    client_stderr_tail_bytes: Count = 4 * 1024
    max_queued_turns: Annotated[int, msgspec.Meta(ge=0)] = 16
    max_sessions: Count = 10_000  # bridge-wide
    max_sessions_per_token: Count = 1000  # per principal; its own LRU idle session makes room
    max_live_agents: Count = 32  # agent processes alive at once, every ACP provider together
    max_running_turns: Count = 128  # turns running at once bridge-wide; more wait
    max_connections: Count = 4096  # open TCP connections; more: 503 (-32006) at once
    max_unauthenticated_connections: Count = 256  # with tokens: connections without a valid one yet
    max_batch_size: Count = 100  # elements of one JSON-RPC batch; more: one -32006 error
    max_batch_reply_bytes: Count = 32 * MiB  # a batch's replies together; more: one -32006 error instead
    max_connection_queue: Count = 65536  # outbound envelopes buffered per connection
    max_connection_queue_bytes: Count = 16 * MiB  # and their bytes; then the client is dropped
    done_message_bytes: Count = 64 * 1024
    tool_content_bytes: Count = 64 * 1024
    max_log_updates: Count = 10_000  # session.update notifications kept per session (the store)
    max_log_bytes: Count = 16 * MiB  # and their bytes
    max_turn_results: Count = 100  # turn results kept per session
    state_max_bytes: Count = 1024 * MiB  # the state database; the oldest sessions are pruned past it


class ProviderConfig(Settings, frozen=True):
    """One ``providers.<id>`` entry. Presets fill ``command``/``args``/``label`` when omitted."""

    type: Literal["acp", "knowledge"] = "acp"  # exec profiles are ProfileConfig (profile_settings)
    command: str | None = None
    args: list[str] | None = None
    env: dict[str, str] = {}
    env_passthrough: list[str] = []
    cwd: str | None = None
    label: str | None = None
    permission_policy: PermissionPolicy = "allow"
    auth_method: str | None = None
    model: str | None = None
    model_flag: str | None = None  # e.g. "-m": apply a model at launch when the agent has no ACP way
    enabled: bool = True
    sources: list[str] | None = None  # knowledge providers: the source ids to use (default all)
