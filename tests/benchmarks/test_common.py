"""What every benchmark shares: its work directory goes away with it unless the user named one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

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


def test_a_benchmark_ended_by_sigterm_removes_its_temporary_work_directory(tmp_path):
    script = tmp_path / "bench.py"
    script.write_text(
        "import sys, time\n"
        "from benchmarks.common import work_dir\n"
        "with work_dir(None, 'bench_test_') as work:\n"
        "    (work / 'checkpoint').write_bytes(b'0' * 4096)\n"
        "    print(work, flush=True)\n"
        "    time.sleep(60)\n")
    root = Path(__file__).parents[2]
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(root)})
    work = Path(proc.stdout.readline().strip())
    assert (work / "checkpoint").exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM
    assert not work.exists()
