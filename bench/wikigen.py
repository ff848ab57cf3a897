"""Generated Markdown wikis for the knowledge benchmark (case 7): deterministic, so every round and
both source kinds (``local-wiki`` and llmwiki-serve) read the same pages.

Each wiki has an ``index.md`` and ``pages`` topic pages in 40 folders; every page has front-matter
(title, ``review_state: approved``, tags, ``source_refs``), about 150 words drawn from a fixed
vocabulary, and three wikilinks. One page in 50 talks about refunds, so ``QUESTION`` has evidence.
"""

from __future__ import annotations

import random
from pathlib import Path

QUESTION = "What approval do refunds over 500 USD need?"
WORDS = [
    "deploy",
    "incident",
    "billing",
    "refund",
    "approval",
    "finance",
    "lead",
    "customer",
    "invoice",
    "ledger",
    "runbook",
    "oncall",
    "service",
    "latency",
    "budget",
    "quota",
    "rollout",
    "canary",
    "review",
    "policy",
    "escalation",
    "backup",
    "restore",
    "audit",
    "cluster",
    "region",
    "failover",
    "token",
    "rotation",
    "schedule",
    "release",
    "migration",
    "schema",
    "index",
    "cache",
]
FOLDERS = 40


def _page(rng: random.Random, wiki: int, number: int, pages: int) -> str:
    title = f"Topic {wiki}-{number} {rng.choice(WORDS).title()} {rng.choice(WORDS).title()}"
    words = [rng.choice(WORDS) for _ in range(150)]
    if number % 50 == 0:
        words[10:10] = ["refunds", "over", "500", "USD", "need", "approval", "from", "the", "finance", "lead"]
    links = " ".join(f"[[{_page_id(rng.randrange(pages))}]]" for _ in range(3))
    body = " ".join(words[:75]) + ".\n\n## Details\n\n" + " ".join(words[75:]) + f".\n\nRelated: {links}\n"
    tags = ", ".join(sorted({rng.choice(WORDS) for _ in range(3)}))
    return (
        f"---\ntitle: {title}\nreview_state: approved\ntags: [{tags}]\nsource_refs: [SRC-{wiki}-{number:05d}]\n"
        f"---\n# {title}\n\n{body}"
    )


def _page_id(number: int) -> str:
    return f"area-{number % FOLDERS:02d}/page-{number:05d}"


def generate(root: Path, wiki: int, pages: int) -> Path:
    """Write wiki number ``wiki`` with ``pages`` pages under ``root`` (kept when already complete)."""
    done = root / ".complete"
    if done.exists() and done.read_text() == str(pages):
        return root
    rng = random.Random(wiki)
    for number in range(pages):
        path = root / f"{_page_id(number)}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_page(rng, wiki, number, pages), encoding="utf-8")
    (root / "index.md").write_text(f"---\ntitle: Bench Wiki {wiki}\n---\n# Bench Wiki {wiki}\n\nGenerated pages.\n")
    done.write_text(str(pages))
    return root
