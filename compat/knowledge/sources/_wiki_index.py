"""A folder of Markdown pages parsed and indexed in SQLite FTS5 (the ``local-wiki`` source's core).

Pages are ``*.md`` / ``*.markdown`` files under the root (hidden files and folders, symlinks that
leave the root, and files over ``max_file_bytes`` are skipped). A page's id is its relative path
without the extension (``ops/billing/refund-policy``). Front-matter is read with
python-frontmatter; a broken front-matter block is treated as page text. Ranking is FTS5's own
``bm25()`` (title weighted above body); ``refresh`` re-parses only files whose modification time
or size changed and drops deleted ones. Drafts (``draft: true`` or ``review_state: draft``) are
withheld, as llmwiki-serve does.

Thread-safe: every method takes the index lock (callers run them in a worker thread).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
from pathlib import Path, PurePosixPath
from stat import S_ISREG
from typing import Any

import frontmatter
import msgspec

SUFFIXES = (".md", ".markdown")
SUMMARY_CHARS = 360
RRF_K = 60
_WIKILINK = re.compile(r"\[\[([^\]|#\n]+)(?:#[^\]|\n]*)?(?:\|[^\]\n]*)?\]\]")
_MDLINK = re.compile(r"\]\(([^)\s]+?\.md)(?:#[^)]*)?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)
_TAG = re.compile(r"(?<![\w#&/])#([A-Za-z][\w-]{0,63})")
_WORD = re.compile(r"\w+")
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "can",
        "do",
        "does",
        "for",
        "from",
        "has",
        "have",
        "how",
        "i",
        "in",
        "is",
        "it",
        "me",
        "my",
        "of",
        "on",
        "or",
        "should",
        "so",
        "that",
        "the",
        "this",
        "to",
        "was",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "you",
        "your",
    ]
)
_SCHEMA = """
CREATE TABLE pages (id TEXT PRIMARY KEY, path TEXT, title TEXT, summary TEXT, meta TEXT, body TEXT,
                    links TEXT, tags TEXT, headings TEXT, role TEXT, draft INTEGER, mtime_ns INTEGER, size INTEGER);
CREATE INDEX pages_by_path ON pages(path);
CREATE VIRTUAL TABLE pages_fts USING fts5(id UNINDEXED, title, body, tokenize='porter unicode61');
"""
# A page's full-text row has the rowid of its ``pages`` row: FTS5 finds a row by rowid at once,
# while a match on the UNINDEXED ``id`` column reads every row (building the index of a
# 2,000-page wiki took 1.4 s that way, almost all of it in those deletes).


class Page(msgspec.Struct, frozen=True):
    id: str
    path: str  # relative, POSIX, with extension
    title: str
    summary: str
    front_matter: dict[str, Any]
    body: str
    links: tuple[str, ...]  # raw link targets, unresolved
    tags: tuple[str, ...]
    headings: tuple[str, ...]
    role: str  # index | hot | topic
    draft: bool


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str, ensure_ascii=False))


def _first_paragraph(body: str) -> str:
    for block in re.split(r"\n\s*\n", body):
        lines = [ln for ln in block.strip().splitlines() if not ln.lstrip().startswith("#")]
        text = " ".join(" ".join(lines).split())
        if text:
            return text
    return ""


def plain(text: str) -> str:
    """Markdown made readable on one line: wikilinks to their labels, heading marks dropped."""
    text = re.sub(r"\[\[([^\]|]+)\|([^\]]+)\]\]", r"\2", text)
    text = re.sub(r"\[\[([^\]]+)\]\]", r"\1", text)
    text = re.sub(r"(?m)^#{1,6}\s+", "", text)
    return " ".join(text.split())


def page_id_of(rel_path: str) -> str:
    """A page's id: its relative POSIX path without the extension (``a.md`` and ``a.markdown``
    are both page ``a``). String slicing, not ``PurePosixPath.with_suffix``: this runs for every
    file on every scan (2,000 paths cost 5 ms that way, bench case 7)."""
    slash, dot = rel_path.rfind("/"), rel_path.rfind(".")
    return rel_path[:dot] if dot > slash + 1 else rel_path


def parse_page(rel_path: str, text: str) -> Page:
    """Parse one page; ``rel_path`` is POSIX and relative to the wiki root."""
    try:
        post = frontmatter.loads(text)
        meta, body = _json_safe(dict(post.metadata)), post.content
    except Exception:  # a broken YAML block is page text, not a reason to drop the page
        meta, body = {}, text
    if not isinstance(meta, dict):
        meta = {}
    page_id = page_id_of(rel_path)
    headings = tuple(m.group(2).strip() for m in _HEADING.finditer(body))[:64]
    title = meta.get("title") if isinstance(meta.get("title"), str) else None
    title = (title or (headings[0] if headings else "") or PurePosixPath(rel_path).stem).strip()
    summary = meta.get("summary") if isinstance(meta.get("summary"), str) else None
    summary = plain(summary or _first_paragraph(body))[:SUMMARY_CHARS]
    links = tuple(dict.fromkeys(m.group(1).strip() for m in [*_WIKILINK.finditer(body), *_MDLINK.finditer(body)]))
    raw_tags = meta.get("tags") or []
    tags = [raw_tags] if isinstance(raw_tags, str) else [t for t in raw_tags if isinstance(t, str)]
    tags = tuple(dict.fromkeys([*tags, *(m.group(1) for m in _TAG.finditer(body))]))
    state = str(meta.get("review_state") or meta.get("state") or "").lower()
    role = {"index": "index", "hot": "hot"}.get(page_id, "topic")
    return Page(
        page_id,
        rel_path,
        title,
        summary,
        meta,
        body,
        links,
        tags,
        headings,
        role,
        meta.get("draft") is True or state == "draft",
    )


def fts_terms(text: str, limit: int = 16) -> list[str]:
    """Search terms of a natural-language question: lower-cased words minus stop words."""
    words = [w.lower() for w in _WORD.findall(text)]
    kept = [w for w in words if w not in STOPWORDS and (len(w) > 1 or not w.isascii())]
    return list(dict.fromkeys(kept or words))[:limit]


def fts_query(text: str, literal: bool = False) -> str | None:
    """An FTS5 MATCH expression: any term (lexical) or the exact phrase (literal)."""
    if literal:
        return '"' + text.strip().replace('"', '""') + '"' if text.strip() else None
    terms = fts_terms(text)
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms) or None


def _one_file_per_page(files: dict[str, os.stat_result]) -> dict[str, os.stat_result]:
    """The first file in scan order for each page id (see :func:`page_id_of`): indexing two files
    of one page made each replace the other on every refresh (a re-parse and a new graph each
    time, and answers that depended on which one won last)."""
    seen: set[str] = set()
    kept: dict[str, os.stat_result] = {}
    for rel, stat in files.items():
        page_id = page_id_of(rel)
        if page_id not in seen:
            seen.add(page_id)
            kept[rel] = stat
    return kept


def _opened_path(fd: int, path: Path) -> Path:
    """The real path of an open file: what the kernel resolved (``/proc/self/fd``, Linux), else
    the path resolved now (a narrower check where procfs is missing)."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return path.resolve()


def _utf8(name: str) -> bool:
    """Whether a file name is valid UTF-8 (undecodable bytes arrive as surrogate escapes, which
    no page path, JSON reply or SQLite text can carry)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class WikiIndex:
    """The parsed pages of one folder and their FTS5 index (in memory)."""

    def __init__(self, root: Path, *, max_files: int = 5000, max_file_bytes: int = 1024 * 1024) -> None:
        self.root = root
        self.max_files = max_files
        self.max_file_bytes = max_file_bytes
        self.generation = 0  # bumps whenever a page changes
        self.truncated = False
        self._lock = threading.Lock()
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.executescript(_SCHEMA)
        self._counted: tuple[int, int, int] | None = None  # (generation, pages, servable pages)
        self._known: dict[str, tuple[int, int]] = {}  # indexed path → (mtime_ns, size), as in ``pages``

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _scan(self) -> dict[str, os.stat_result]:
        """Every Markdown file under the root (relative POSIX path → stat), in ``os.walk`` order
        with sorted names, hidden entries skipped and symlinked folders not followed.

        Each file costs one ``stat``: only a symlink is resolved to check that it stays inside
        the root, since everything else here lies under the (resolved) root by construction.
        Resolving every file walked each path component again, 77 ms per scan of a 2,000-page
        wiki against 8.5 ms now, and a scan runs at most every ``refresh_interval`` per source.
        """
        found: dict[str, os.stat_result] = {}
        stack: list[tuple[str, str]] = [(str(self.root), "")]  # (folder, its relative POSIX prefix)
        while stack:
            folder, prefix = stack.pop()
            try:
                with os.scandir(folder) as listing:
                    entries = sorted((e for e in listing if not e.name.startswith(".")), key=lambda e: e.name)
            except OSError:
                continue
            folders = []
            for entry in entries:
                try:
                    if entry.is_dir():  # follows a symlink, as os.walk classifies; not descended into
                        if not entry.is_symlink() and _utf8(entry.name):
                            folders.append((entry.path, f"{prefix}{entry.name}/"))
                        continue
                    if not entry.name.lower().endswith(SUFFIXES) or not _utf8(entry.name):
                        continue
                    stat = entry.stat()
                    if not S_ISREG(stat.st_mode):  # a FIFO named page.md would block the read
                        continue
                    if entry.is_symlink() and not Path(entry.path).resolve().is_relative_to(self.root):
                        continue
                except OSError:
                    continue
                if stat.st_size > self.max_file_bytes:
                    continue
                if len(found) >= self.max_files:
                    self.truncated = True
                    return found
                found[prefix + entry.name] = stat
            stack.extend(reversed(folders))  # depth first, in name order: os.walk's top-down order
        self.truncated = False
        return found

    def refresh(self) -> None:
        """Re-index pages whose mtime or size changed; drop pages whose file is gone."""
        if not self.root.is_dir():
            raise FileNotFoundError("wiki root is not a folder")
        files = _one_file_per_page(self._scan())
        with self._lock:
            known = self._known
            changed = [p for p, st in files.items() if known.get(p) != (st.st_mtime_ns, st.st_size)]
            gone = [p for p in known if p not in files]
            for rel in gone:
                self._delete(rel)
            for rel in changed:
                self._upsert(rel, files[rel])
            if changed or gone:
                self.generation += 1
                self._db.commit()

    def _delete(self, rel: str) -> None:
        self._db.execute("DELETE FROM pages_fts WHERE rowid IN (SELECT rowid FROM pages WHERE path = ?)", (rel,))
        self._db.execute("DELETE FROM pages WHERE path = ?", (rel,))
        self._known.pop(rel, None)

    def _upsert(self, rel: str, stat: os.stat_result) -> None:
        text = self._read(rel, stat)
        if text is None:
            return
        page = parse_page(rel, text)
        # One file per page id (refresh keeps the first, and drops the others as gone before any
        # upsert), so the row this replaces, if any, is this path's own.
        self._delete(rel)
        row = self._db.execute(
            "INSERT OR REPLACE INTO pages VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                page.id,
                rel,
                page.title,
                page.summary,
                json.dumps(page.front_matter, ensure_ascii=False),
                page.body,
                json.dumps(page.links),
                json.dumps(page.tags),
                json.dumps(page.headings),
                page.role,
                int(page.draft),
                stat.st_mtime_ns,
                stat.st_size,
            ),
        )
        self._known[rel] = (stat.st_mtime_ns, stat.st_size)
        if not page.draft:
            self._db.execute(
                "INSERT INTO pages_fts (rowid, id, title, body) VALUES (?,?,?,?)",
                (row.lastrowid, page.id, page.title, page.body),
            )

    def _read(self, rel: str, scanned: os.stat_result) -> str | None:
        """The text of the file the scan saw, or None when it is gone or is another file now.

        The file is opened without blocking and must still be the scanned one (same device and
        inode) and lie inside the root by the path the kernel opened: a page, or a folder on its
        path, swapped for a link leading out of the root between the scan and this read is not
        indexed, nor is a FIFO put in its place; the next scan judges what is there then.
        """
        try:
            fd = os.open(self.root / rel, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        with open(fd, "rb") as handle:
            opened = os.fstat(fd)
            if (opened.st_dev, opened.st_ino) != (scanned.st_dev, scanned.st_ino) or not S_ISREG(opened.st_mode):
                return None
            if not _opened_path(fd, self.root / rel).is_relative_to(self.root):
                return None
            try:
                data = handle.read(self.max_file_bytes + 1)
            except OSError:
                return None
        return None if len(data) > self.max_file_bytes else data.decode("utf-8", errors="replace")

    def _page(self, row: tuple[Any, ...]) -> Page:
        pid, path, title, summary, meta, body, links, tags, headings, role, draft = row[:11]
        return Page(
            pid,
            path,
            title,
            summary,
            json.loads(meta),
            body,
            tuple(json.loads(links)),
            tuple(json.loads(tags)),
            tuple(json.loads(headings)),
            role,
            bool(draft),
        )

    def pages(self) -> list[Page]:
        """Every servable page, ordered by path."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM pages WHERE draft = 0 ORDER BY path").fetchall()
        return [self._page(r) for r in rows]

    def counts(self) -> tuple[int, int]:
        """``(page_count, servable_page_count)``, counted once per generation (every context pack
        carries them; counting scanned the table each time)."""
        with self._lock:
            if self._counted is None or self._counted[0] != self.generation:
                total, drafts = self._db.execute("SELECT count(*), coalesce(sum(draft), 0) FROM pages").fetchone()
                self._counted = (self.generation, total, total - drafts)
            return self._counted[1], self._counted[2]

    def search(self, match: str, limit: int, snippet_tokens: int = 32) -> list[tuple[str, float, str]]:
        """``[(page_id, score, snippet)]`` best first; score is ``-bm25`` (higher is better)."""
        sql = (
            "SELECT id, bm25(pages_fts, 0.0, 5.0, 1.0) AS rank, snippet(pages_fts, 2, '', '', '…', ?) "
            "FROM pages_fts WHERE pages_fts MATCH ? ORDER BY rank LIMIT ?"
        )
        with self._lock:
            try:
                rows = self._db.execute(sql, (max(1, min(64, snippet_tokens)), match, limit)).fetchall()
            except sqlite3.OperationalError:  # an expression FTS5 refuses is a query with no hit
                return []
        return [(pid, float(f"{-rank:.6g}"), snip) for pid, rank, snip in rows]

    def search_fused(self, matches: list[str], limit: int, snippet_tokens: int) -> list[tuple[str, float, str]]:
        """Several expressions fused by reciprocal rank (1 / (60 + rank)), like llmwiki-serve's variants."""
        if len(matches) == 1:
            return self.search(matches[0], limit, snippet_tokens)
        scores: dict[str, float] = {}
        snippets: dict[str, str] = {}
        for match in matches:
            for rank, (pid, _, snip) in enumerate(self.search(match, limit, snippet_tokens), start=1):
                scores[pid] = scores.get(pid, 0.0) + 1.0 / (RRF_K + rank)
                snippets.setdefault(pid, snip)
        best = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
        return [(pid, round(score, 6), snippets[pid]) for pid, score in best]
