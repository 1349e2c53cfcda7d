"""`make test` on two workers (tests/conftest.py): the tests that start heavy shared things run
on one worker, a module's tests stay on one worker, and every worker draws the session's seed.

Runs pytest with the suite's conftest on two xdist workers over probe modules written here;
each probe test records the worker it ran on and the seed it got.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SERIAL = '''
import pytest
from probe import note

@pytest.fixture
def ray_cluster():  # the suite's session Ray cluster, by name
    return None

@pytest.mark.vm
def test_desktop(seed): note("desktop", seed)

def test_on_ray(ray_cluster, seed): note("ray", seed)

def test_light_beside_them(seed): note("light_in_serial_module", seed)
'''

LIGHT = '''
from probe import note

{tests}
'''

PROBE = '''
import json, os

def note(name, seed):
    with open(os.path.join(os.environ["PROBE_OUT"], name), "w") as f:
        json.dump({"worker": os.environ["PYTEST_XDIST_WORKER"], "seed": seed}, f)
'''


def test_heavy_tests_share_a_worker_and_modules_stay_whole(tmp_path):
    probes, out = tmp_path / "probes", tmp_path / "out"
    probes.mkdir(), out.mkdir()
    (probes / "probe.py").write_text(PROBE)
    (probes / "test_serial.py").write_text(SERIAL)
    for module in ("a", "b"):
        tests = "\n".join(f"def test_{module}{i}(seed): note('{module}{i}', seed)" for i in range(6))
        (probes / f"test_light_{module}.py").write_text(LIGHT.format(tests=tests))
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-c", str(ROOT / "pyproject.toml"),
                           "--rootdir", str(probes), "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder",
                           "-p", "no:cacheprovider", "-q", str(probes)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PROBE_OUT": str(out), "PYTHONPATH": f"{ROOT}:{probes}"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = {p.name: json.loads(p.read_text()) for p in out.iterdir()}
    assert len(ran) == 15, sorted(ran)
    assert len({r["worker"] for r in ran.values()}) == 2, ran  # both workers took work
    assert ran["desktop"]["worker"] == ran["ray"]["worker"]  # marker and fixture: one group
    for module in ("a", "b"):
        assert len({ran[f"{module}{i}"]["worker"] for i in range(6)}) == 1, (module, ran)
    assert len({r["seed"] for r in ran.values()}) == 1, ran  # one seed, printed once, replays all
