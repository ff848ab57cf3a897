"""Evidence packing, answer anchors and diagnostic sanitizing (no I/O); the evidence-only answer's
text is in test_answers."""

from __future__ import annotations

from compat.knowledge.answers import fallback_anchors, has_valid_anchor
from compat.knowledge.diagnostics import safe_text
from compat.knowledge.evidence import Evidence, bundle_from, graph_from
from compat.knowledge.settings import SourceDescriptor


def test_safe_text_drops_urls_hosts_paths_and_keys() -> None:
    text = safe_text("GET http://u:p@10.1.2.3:8/x at /home/me/wiki/a.md C:\\wiki key=sk-abcdefghijkl 127.0.0.1:99")
    for leaked in ("http", "u:p", "10.1.2.3", "/home/me", "C:\\", "sk-abcdef", "127.0.0.1"):
        assert leaked not in text
    assert safe_text("use /mcp/stream") == "use /mcp/stream" and len(safe_text("x" * 500)) == 160


def test_citations_are_prefixed_deduplicated_and_keep_source_order() -> None:
    a = SourceDescriptor(id="a", protocol="local-wiki", root="/w")
    b = SourceDescriptor(id="b", protocol="local-wiki", root="/w")
    evidence = Evidence()
    pack = {
        "evidence": [
            {"page_id": "p", "title": "# P", "snippet": "see [[x|X]] and [[y]]", "path": "/etc/p.md"},
            {"page_id": "p"},
        ],
        "orientation": [{"page_id": "hot"}],
    }
    evidence.add(a, pack, None)
    evidence.add(b, pack, None)
    assert [c["id"] for c in evidence.citations] == ["a:p", "b:p"]
    assert evidence.citations[0]["snippet"] == "see X and y" and "path" not in evidence.citations[0]
    assert evidence.sources[1]["citationIndexes"] == [2]


def test_the_graph_keeps_at_most_120_nodes_per_source_and_their_edges() -> None:
    nodes = [{"id": f"n{i}", "label": str(i), "metadata": {"source_root": "/abs"}} for i in range(200)]
    edges = [{"source": "n0", "target": "n1", "relation": "links_to"}, {"source": "n0", "target": "n150"}]
    kept_nodes, kept_edges = graph_from("s", {"graph": {"nodes": nodes, "edges": edges}})
    assert len(kept_nodes) == 120 and kept_nodes[0]["id"] == "s:n0" and "source_root" not in kept_nodes[0]["metadata"]
    assert [(e["source"], e["target"]) for e in kept_edges] == [("s:n0", "s:n1")]


def test_source_bundles_pass_an_allowlist() -> None:
    bundle = {
        "source_id": "w",
        "root": "/abs/root",
        "token": "secret",
        "capabilities": [" llmwiki_search "],
        "source_refs": [
            {"id": "r", "uri": "http://user:pw@host/x?q=1", "locator": {"path": "/abs"}},
            {"id": "s", "uri": "file:///etc/passwd"},
        ],
    }
    safe = bundle_from("w", bundle)
    assert "root" not in safe and "token" not in safe and safe["capabilities"] == ["llmwiki_search"]
    assert safe["sourceRefs"][0] == {"id": "r", "label": None, "type": None, "uri": "http://host/x"}
    assert "uri" not in safe["sourceRefs"][1] and safe["sourceRefCount"] == 2


def test_anchors_are_checked_and_appended_only_when_missing() -> None:
    assert has_valid_anchor("yes [2](#citation-2)", 2)
    assert not has_valid_anchor("![1](#citation-1) [3](#citation-3) [1](#citation-2)", 2)
    assert fallback_anchors("cited [1](#citation-1)", 3) == ""
    assert fallback_anchors("none", 7) == (
        "\n\nEvidence used: [1](#citation-1) [2](#citation-2) [3](#citation-3) "
        "[4](#citation-4) [5](#citation-5) +2 more"
    )
    assert fallback_anchors("none", 0) == ""


def test_capabilities_carry_the_bundles_allowlisted_view_made_once_at_discovery() -> None:
    """A turn's ``sourceBundles`` entry is the view discovery made (``Capabilities.bundle_view``),
    not one sifted again from the raw bundle for every turn."""
    from compat.knowledge.sources.base import capabilities_from

    bundle = {"source_id": "w", "token": "secret", "source_refs": [{"id": f"r{i}"} for i in range(2000)]}
    descriptor = SourceDescriptor(id="w", protocol="local-wiki", root="/w")
    caps = capabilities_from(["llmwiki_retrieval_v1"], descriptor, bundle)
    assert caps.bundle_view == bundle_from("w", bundle) and caps.bundle_view["sourceRefCount"] == 2000
    evidence = Evidence()
    evidence.add(descriptor, {"evidence": []}, caps.bundle_view)
    assert evidence.bundles == [caps.bundle_view] and "token" not in evidence.bundles[0]
