"""The fleet profile's reading of py-spy's raw samples: inclusive shares count a function once per sample, however
deep it recurses, and the threads' own bootstrap frames are left out."""

from __future__ import annotations

from pathlib import Path

from benchmarks.fleet.fleet_profile import summarize_samples


def test_samples_become_inclusive_and_innermost_shares(tmp_path: Path) -> None:
    raw = tmp_path / "server.raw"
    raw.write_text(
        "Thread._bootstrap (threading.py:1002);Client._loop (client.py:1);rec (m.py:3);rec (m.py:3) 6\n"
        "Thread._bootstrap (threading.py:1002);Ingest._run (ingest.py:77);execute (sql.py:9) 3\n"
        "Thread._bootstrap (threading.py:1002);Client._loop (client.py:1) 1\n"
        "not a sample line\n")
    summary = summarize_samples(raw, top=10)
    assert summary["samples"] == 10
    inclusive = dict(summary["inclusive"])
    assert inclusive == {"Client._loop": 0.7, "rec": 0.6, "Ingest._run": 0.3, "execute": 0.3}
    assert summary["innermost"][0] == ["rec", 0.6]


def test_no_samples_says_so(tmp_path: Path) -> None:
    raw = tmp_path / "empty.raw"
    raw.write_text("")
    assert summarize_samples(raw, top=5) == {"samples": 0}
