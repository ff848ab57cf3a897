"""What ``xworkmate-bridge chat`` prints of a turn (docs/api.md "Command line").

The agent's text goes to stdout as it streams, progress lines to stderr; then the sources the
answer cites (``[n] title (sourceId: /pageId)``) and a summary line. Knowledge answers cite with
Markdown anchors ``[n](#citation-n)`` (§2.7), which a terminal cannot follow, so the text shows
them as ``[n]``, matching the source lines. They are rewritten as the text streams: an anchor may
arrive split across deltas, so only a possible start of an anchor at the end of a delta is held
back, until the next delta (or the end) shows what it is.

Must not import: ``orchestrator`` or ``compat``.
"""

from __future__ import annotations

import re
from typing import Any

ANCHOR = re.compile(r"\[([0-9]{1,6})\]\(#citation-\1\)")
_ANCHOR_TAIL = "](#citation-"


def _may_become_anchor(text: str) -> bool:
    """Whether ``text`` (starting with ``[``) is the start of an anchor not yet complete."""
    match = re.match(r"\[([0-9]{0,6})", text)
    if match is None:
        return False
    rest = text[match.end() :]
    if not rest:
        return True
    if not match.group(1):
        return False
    if len(rest) <= len(_ANCHOR_TAIL):
        return _ANCHOR_TAIL.startswith(rest)
    digits = rest[len(_ANCHOR_TAIL) :]
    return rest.startswith(_ANCHOR_TAIL) and len(digits) <= 6 and digits.isdigit()


class TerminalAnchors:
    """Streamed text with ``[n](#citation-n)`` shown as ``[n]``; ``feed`` each delta, then ``flush``.

    Only an unfinished anchor at the very end of the text fed so far is held back (at most 25
    characters); anything else passes through at once, unchanged.
    """

    def __init__(self) -> None:
        self._held = ""

    def feed(self, text: str) -> str:
        """The part of ``held + text`` that can be shown now, anchors rewritten."""
        text, self._held = self._held + text, ""
        start = text.rfind("[")
        if start != -1 and _may_become_anchor(text[start:]):
            text, self._held = text[:start], text[start:]
        return ANCHOR.sub(r"[\1]", text)

    def flush(self) -> str:
        """What was held back (the text ended inside something that looked like an anchor)."""
        held, self._held = self._held, ""
        return held


class ChatView:
    """What ``chat`` shows of a turn's updates: the agent's text on ``out`` as it streams (citation
    anchors as ``[n]``), progress lines on ``err`` (``[tool_call] Read file``); a ``waiting`` update
    is one line that updates in place on a terminal (and goes once anything else arrives), a line
    each elsewhere."""

    def __init__(self, out: Any, err: Any) -> None:
        self._out, self._err = out, err
        self._tty = bool(getattr(err, "isatty", lambda: False)())
        self._waiting = False  # a waiting line is on the terminal
        self._anchors = TerminalAnchors()
        self._last_text = ""

    def show(self, note: dict[str, Any]) -> None:
        update = note.get("params") or {}
        kind, event = update.get("type"), update.get("event")
        if kind == "status" and event == "waiting":
            line = f"[waiting] {update.get('message') or 'waiting'}"
            if self._tty:
                self._err.write(f"\r\x1b[K{line}")
                self._waiting = True
            else:
                self._err.write(line + "\n")
            self._err.flush()
            return
        if kind == "delta":
            self._clear()
            self._write(self._anchors.feed(str(update.get("delta", ""))))
        elif kind in ("tool_call", "permission") or (kind == "status" and event == "started"):
            self._clear()
            title = (update.get("toolCall") or {}).get("title") or update.get("message") or kind
            self._err.write(f"[{kind}] {title}\n")  # progress, kept off stdout
            self._err.flush()

    def close(self) -> None:
        """End the output: the waiting line goes, held text is shown, the text ends with a newline."""
        self._clear()
        self._write(self._anchors.flush())
        if self._last_text and not self._last_text.endswith("\n"):
            self._out.write("\n")
            self._out.flush()

    def _write(self, text: str) -> None:
        if text:
            self._last_text = text
            self._out.write(text)
            self._out.flush()

    def _clear(self) -> None:
        if self._waiting:
            self._err.write("\r\x1b[K")
            self._err.flush()
            self._waiting = False


def cited_sources(result: dict[str, Any]) -> list[str]:
    """``[n] title (sourceId: /pageId)`` for each ``[n](#citation-n)`` anchor in the output, from the
    knowledge artifact's ``citations`` (docs/api.md "Knowledge sources"); a terminal cannot follow
    the anchors."""
    used = sorted({int(n) for n in re.findall(r"\]\(#citation-([0-9]{1,6})\)", str(result.get("output") or ""))})
    artifacts = result.get("artifacts")
    citations = (
        next((a["citations"] for a in artifacts if isinstance(a, dict) and isinstance(a.get("citations"), list)), [])
        if isinstance(artifacts, list)
        else []
    )
    lines = []
    for n in used:
        if 1 <= n <= len(citations) and isinstance(citations[n - 1], dict):
            c = citations[n - 1]
            page = f"/{c['pageId']}" if c.get("pageId") else c.get("path")  # the path knowledge.read takes
            where = ": ".join(str(x) for x in (c.get("sourceId"), page) if x)
            lines.append(f"[{n}] {c.get('title') or c.get('id') or '?'}" + (f" ({where})" if where else ""))
    return lines


def turn_summary(result: dict[str, Any], seconds: float) -> str:
    """``chat``'s closing line(s): ``[status] turnId=… provider=… seconds=…``, then the error's
    code and message, its hint and the agent's ``authMethods`` when the result carries them."""
    summary = (
        f"[{result.get('status')}] turnId={result.get('turnId') or '-'} "
        f"provider={result.get('resolvedProviderId') or result.get('resolvedGatewayProviderId') or '-'} "
        f"seconds={seconds:.2f}"
    )
    if result.get("status") == "unavailable":
        summary += f" {result.get('unavailableCode')}: {result.get('unavailableMessage')}"
    elif isinstance(result.get("error"), dict):
        error = result["error"]
        summary += f" {error.get('code')}: {error.get('message')}"
        data = error.get("data") if isinstance(error.get("data"), dict) else {}
        if data.get("hint"):
            summary += f"\nhint: {data['hint']}"
        if isinstance(data.get("authMethods"), list) and data["authMethods"]:  # ids for providers.<id>.authMethod
            summary += "\nauthMethods: " + ", ".join(
                str(m.get("id", m) if isinstance(m, dict) else m) for m in data["authMethods"]
            )
    return summary
