"""bench/history_rollup.py in a fast mode (tiny sizes, no SSH), so that the benchmark cannot rot:
every figure it reports comes out positive and the section has its tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import benchdoc, history_rollup


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    return history_rollup.measure(
        reps=1,
        fold_samples=20,
        live_minutes=3,
        disk_days=2,
        reply_days=1.0,
        backfill_days=0.1,
        large_nodes=12,
        e2e=False,
    )


def test_node_side_figures_are_positive(results: dict[str, Any]) -> None:
    assert results["fold"]["rollup_us"] > 0
    assert results["fold"]["recorder_us"] > 0
    assert results["fold"]["keys_per_gpu"] >= 1
    write = results["write"]
    assert write["write_ms"] > 0 and write["write_cpu_ms"] >= 0 and write["nosync_ms"] > 0
    assert write["hours_bytes"] > 0 and write["minutes_bytes"] > 0
    disk = results["disk"]
    assert disk["files"] >= 2 and disk["bytes"] > 0 and disk["largest"] > 0


def test_replies_decode(results: dict[str, Any]) -> None:
    assert [r["kind"] for r in results["replies"]] == ["training", "MIG, silos", "MIG, large"]
    for row in results["replies"]:
        assert row["gpus"] >= 4
        assert row["buckets"] >= 24  # a day of hours
        assert row["bytes"] > 0 and row["read_ms"] > 0 and row["parse_ms"] > 0 and row["decode_ms"] > 0


def test_backfill_covers_every_node(results: dict[str, Any]) -> None:
    silos, large = results["backfill"].values()
    assert len(silos) == 8
    assert {r["profile"] for r in large} == {"training", "inference", "notebooks", "mig", "saturated", "idle"}
    assert all(r["seconds"] > 0 for r in silos + large)


def test_render_has_the_tables(
    results: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    text = history_rollup.render(results)
    assert text.startswith("## History rollups (`bench/history_rollup.py`)")
    assert "| what | figure |" in text
    assert "| node | GPUs | buckets | reply |" in text
    assert "| fleet | nodes | total |" in text
    assert "End to end" not in text  # skipped in this mode, and not claimed
    assert "nan" not in text
    # The section goes between its own markers, leaving the rest of the document alone.
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n<!-- other:begin -->\nkept\n<!-- other:end -->\n", encoding="utf-8")
    monkeypatch.setattr(benchdoc, "DOC", doc)
    benchdoc.write_section("history_rollup", text)
    written = doc.read_text(encoding="utf-8")
    assert "kept" in written and "<!-- history_rollup:begin -->" in written
    assert written.count("## History rollups") == 1
