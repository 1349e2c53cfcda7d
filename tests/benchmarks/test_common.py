"""What every benchmark shares: its work directory goes away with it unless the user named one."""

from __future__ import annotations

import pytest

from benchmarks.common import work_dir


def test_a_temporary_work_directory_is_removed_even_when_the_benchmark_fails():
    with pytest.raises(RuntimeError), work_dir(None, "bench_test_") as work:
        (work / "policy").mkdir()
        (work / "policy" / "model.safetensors").write_bytes(b"\0" * 1024)
        seen = work
        raise RuntimeError("the benchmark died")
    assert not seen.exists()


def test_a_named_work_directory_is_kept(tmp_path):
    with work_dir(tmp_path / "mine", "bench_test_") as work:
        work.mkdir()
        (work / "result.json").write_text("{}")
    assert (tmp_path / "mine" / "result.json").read_text() == "{}"
