"""The local-wiki source and ``knowledge.read`` over a nested folder tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bridge.rpc.errors import InvalidParams, NotFound
from compat.knowledge.service import KnowledgeService
from compat.knowledge.settings import SourceDescriptor
from compat.knowledge.sources.base import RoutedRetrieval
from compat.knowledge.sources.local_wiki import LocalWikiSource

pytestmark = pytest.mark.timeout(30)


def wiki_source(root: Path, interval: float = 0.0) -> LocalWikiSource:
    descriptor = SourceDescriptor(id="wiki", protocol="local-wiki", root=str(root))
    return LocalWikiSource(descriptor, refresh_interval=interval)


def service_over(root: Path) -> KnowledgeService:
    return KnowledgeService(sources=[SourceDescriptor(id="wiki", label="Acme", protocol="local-wiki", root=str(root))])


async def test_search_ranks_with_fts5_bm25_and_withholds_drafts(wiki_copy: Path) -> None:
    source = wiki_source(wiki_copy)
    hits = await source.search("What approval do refunds over 500 USD need?", RoutedRetrieval())
    assert hits[0]["page_id"] == "ops/billing/refund-policy"
    assert hits[0]["score"] > hits[-1]["score"]
    assert await source.search("database migration", RoutedRetrieval()) == []
    assert await source.search("SECRET-DRAFT-CANARY", RoutedRetrieval(mode="literal")) == []
    assert await source.read_page("eng/draft-migration", {}) is None
    await source.aclose()


async def test_literal_mode_matches_the_exact_phrase_only(wiki_copy: Path) -> None:
    source = wiki_source(wiki_copy)
    assert [h["page_id"] for h in await source.search("finance lead", RoutedRetrieval(mode="literal"))] == [
        "ops/billing/refund-policy"
    ]
    assert await source.search("lead finance", RoutedRetrieval(mode="literal")) == []
    await source.aclose()


async def test_unicode_names_and_missing_front_matter_are_served(wiki_copy: Path) -> None:
    source = wiki_source(wiki_copy)
    [hit] = await source.search("快速开始", RoutedRetrieval())
    assert hit["page_id"] == "guides/入门/快速开始"
    page = await source.read_page("eng/no-frontmatter", {})
    assert page is not None and page["title"] == "Plain Page Without Front Matter"
    assert page["frontmatter"] == {} and page["summary"].startswith("This page has no front matter")
    await source.aclose()


async def test_a_cycle_of_wikilinks_is_walked_once(wiki_copy: Path) -> None:
    source = wiki_source(wiki_copy)
    near = await source.neighbors(["eng/cycle-a"], 4, "both", 50)
    assert [n["id"] for n in near["nodes"]] == ["page:eng/cycle-a", "page:eng/cycle-b"]
    assert {(e["source"], e["target"]) for e in near["edges"]} == {
        ("page:eng/cycle-a", "page:eng/cycle-b"),
        ("page:eng/cycle-b", "page:eng/cycle-a"),
    }
    graph = await source.graph(500)
    assert {"id": "placeholder:missing-page"}.items() <= next(
        n for n in graph["nodes"] if n["id"] == "placeholder:missing-page"
    ).items()
    await source.aclose()


async def test_a_changed_page_is_reindexed_and_a_deleted_one_dropped(wiki_copy: Path) -> None:
    source = wiki_source(wiki_copy)
    assert await source.search("kumquat", RoutedRetrieval()) == []
    page = wiki_copy / "ops" / "incident-runbook.md"
    page.write_text(page.read_text() + "\nEscalate kumquat incidents to the duty manager.\n")
    stat = page.stat()
    os.utime(page, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert [h["page_id"] for h in await source.search("kumquat", RoutedRetrieval())] == ["ops/incident-runbook"]
    page.unlink()
    assert await source.search("kumquat", RoutedRetrieval()) == []
    await source.aclose()


async def test_read_root_lists_folders_then_pages_with_summaries(wiki_copy: Path) -> None:
    async with service_over(wiki_copy) as service:
        root = await service.read("wiki", "/")
    assert root["kind"] == "folder" and root["title"] == "Acme Ops Wiki"  # index.md is the root's content
    assert root["content"].startswith("# Acme Ops Wiki")
    assert [c["path"] for c in root["children"]] == ["/eng", "/guides", "/ops", "/hot"]
    ops = next(c for c in root["children"] if c["path"] == "/ops")
    assert ops["title"] == "Operations" and ops["summary"] == "How the operations team handles billing and incidents."
    assert root["truncated"] is False


async def test_read_walks_down_a_nested_unicode_tree(wiki_copy: Path) -> None:
    async with service_over(wiki_copy) as service:
        guides = await service.read("wiki", "/guides")
        folder = await service.read("wiki", "/guides/入门")
        page = await service.read("wiki", "/guides/入门/快速开始")
        ops = await service.read("wiki", "/ops")
    assert [c["path"] for c in guides["children"]] == ["/guides/入门"]
    assert folder["children"] == [
        {"path": "/guides/入门/快速开始", "kind": "page", "title": "快速开始", "summary": "新成员的第一天指南。"}
    ]
    assert page["kind"] == "page" and page["frontMatter"]["summary"] == "新成员的第一天指南。"
    assert "oncall" in page["content"] and page["children"] == []
    assert ops["title"] == "Operations" and "/ops/README" not in [c["path"] for c in ops["children"]]


async def test_an_unknown_path_is_not_found_with_the_nearest_parent(wiki_copy: Path) -> None:
    async with service_over(wiki_copy) as service:
        with pytest.raises(NotFound) as caught:
            await service.read("wiki", "/ops/billing/nope/deeper")
        with pytest.raises(NotFound) as unknown_source:
            await service.read("nope", "/")
        with pytest.raises(InvalidParams):
            await service.read("wiki", "/ops/../etc")
    assert caught.value.to_error()["code"] == -32004
    assert caught.value.data["nearestParent"] == "/ops/billing"
    assert unknown_source.value.data["sourceId"] == "nope"


async def test_sources_list_readiness_without_absolute_roots(wiki_copy: Path) -> None:
    async with service_over(wiki_copy) as service:
        listing = await service.list_sources()
    [entry] = listing["sources"]
    assert entry["ready"] is True and "llmwiki_search_mode_lexical" in entry["capabilities"]
    assert entry["pageCount"] == 12 and entry["approvedPageCount"] == 11
    assert str(wiki_copy) not in repr(listing)


async def test_symlinks_in_the_root_are_served_those_leading_out_and_hidden_folders_are_not(tmp_path: Path) -> None:
    root, outside = tmp_path / "wiki", tmp_path / "outside"
    (root / "notes").mkdir(parents=True)
    (root / ".drafts").mkdir()
    outside.mkdir()
    (root / "notes" / "real.md").write_text("# Real\n\nquince harvest\n")
    (root / ".drafts" / "hidden.md").write_text("# Hidden\n\nquince hidden\n")
    (outside / "secret.md").write_text("# Secret\n\nquince secret\n")
    (root / "alias.md").symlink_to(root / "notes" / "real.md")
    (root / "leak.md").symlink_to(outside / "secret.md")
    (root / "linked").symlink_to(outside, target_is_directory=True)
    source = wiki_source(root)
    hits = await source.search("quince", RoutedRetrieval())
    assert sorted(h["page_id"] for h in hits) == ["alias", "notes/real"]
    await source.aclose()


async def test_two_files_with_one_page_id_never_leave_two_search_rows(tmp_path: Path) -> None:
    (tmp_path / "plan.md").write_text("# Plan\n\nmarmalade schedule\n")
    (tmp_path / "plan.markdown").write_text("# Plan\n\nmarmalade budget\n")
    source = wiki_source(tmp_path)
    generations = set()
    for _ in range(3):  # the first file in scan order is the page, on every refresh
        hits = await source.search("marmalade", RoutedRetrieval())
        assert [(h["page_id"], h["path"]) for h in hits] == [("plan", "plan.markdown")]
        generations.add(source._index.generation)
    assert len(generations) == 1  # nothing re-indexed while nothing changed
    (tmp_path / "plan.md").unlink()
    (tmp_path / "plan.markdown").unlink()
    assert await source.search("marmalade", RoutedRetrieval()) == []
    await source.aclose()


async def test_a_fifo_and_an_undecodable_name_are_skipped_and_the_rest_is_served(tmp_path: Path) -> None:
    (tmp_path / "good.md").write_text("# Good\n\npersimmon orchard\n")
    os.mkfifo(tmp_path / "pipe.md")  # reading it would block the refresh while it holds the index
    (tmp_path / os.fsdecode(b"bad-\xff.md")).write_text("# Bad\n\npersimmon bad\n")
    (tmp_path / os.fsdecode(b"dir-\xff")).mkdir()
    (tmp_path / os.fsdecode(b"dir-\xff") / "inner.md").write_text("# Inner\n\npersimmon inner\n")
    source = wiki_source(tmp_path)
    assert [h["page_id"] for h in await source.search("persimmon", RoutedRetrieval())] == ["good"]
    await source.aclose()


def test_a_page_replaced_after_the_scan_is_not_read(tmp_path: Path) -> None:
    from compat.knowledge.sources._wiki_index import WikiIndex

    outside = tmp_path / "outside.md"
    outside.write_text("# Secret\n\nnot for the wiki\n")
    root = tmp_path / "wiki"
    root.mkdir()
    page = root / "page.md"
    page.write_text("# Page\n\nfine\n")
    index = WikiIndex(root)
    scanned = index._scan()["page.md"]
    assert index._read("page.md", scanned) == "# Page\n\nfine\n"
    page.unlink()
    page.symlink_to(outside)  # swapped between the scan and the read
    assert index._read("page.md", scanned) is None
    index.close()


def test_a_folder_swapped_for_a_link_leading_out_after_the_scan_is_not_read(tmp_path: Path) -> None:
    from compat.knowledge.sources._wiki_index import WikiIndex

    root, outside = tmp_path / "wiki", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "sub" / "key.md").write_text("# Key\n\nfine\n")
    index = WikiIndex(root)
    assert "sub/key.md" in index._scan()
    # the outside file takes the scanned file's place in the swapped path, inode and all
    os.rename(root / "sub" / "key.md", outside / "key.md")
    (outside / "key.md").write_text("# Key\n\nTOP SECRET\n")
    scanned = (outside / "key.md").stat()
    (root / "sub").rmdir()
    (root / "sub").symlink_to(outside, target_is_directory=True)
    assert index._read("sub/key.md", scanned) is None
    index.close()


def test_a_page_without_title_or_heading_is_named_after_its_file() -> None:
    from compat.knowledge.sources._wiki_index import parse_page

    assert parse_page("notes/release-plan.md", "just text\n").title == "release-plan"
