from __future__ import annotations

from pathlib import Path

from worker import runfiles


def test_progress_reader_returns_each_complete_line_once(tmp_path: Path) -> None:
    writer = runfiles.ProgressWriter(tmp_path)
    reader = runfiles.ProgressReader(tmp_path)
    assert reader.read_new() == []
    writer(epoch=1, batch=1, batches_per_epoch=10, loss=2.3, samples_per_sec=100.0)
    writer(epoch=1, batch=10, batches_per_epoch=10, loss=1.1, samples_per_sec=120.0)
    first = reader.read_new()
    assert [(r.seq, r.batch, r.loss) for r in first] == [(0, 1, 2.3), (1, 10, 1.1)]
    assert reader.read_new() == []
    # A line being written is not read until it is complete.
    with open(tmp_path / runfiles.PROGRESS, "a") as f:
        f.write('{"seq": 2, "epoch": 1')
    assert reader.read_new() == []
    writer.close()


def test_atomic_write_replaces_whole_files(tmp_path: Path) -> None:
    target = tmp_path / "result.json"
    runfiles.write_atomically(target, "old")
    runfiles.write_atomically(target, "new")
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_log_lines_carry_no_nul_the_server_would_refuse(tmp_path: Path) -> None:
    runfiles.rank_log(tmp_path, 3).write_bytes(b"before\x00after\nnext\n")
    lines = runfiles.LogReader(tmp_path).read_new()
    assert [(line.rank, line.text) for line in lines] == [(3, "before\ufffdafter"), (3, "next")]
