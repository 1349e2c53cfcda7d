"""Test-wide setup: 8 CPU devices for sharding tests, skips for missing hardware, and the
session's random seed, and the one tiny policy every test shares (`tiny_dir`).

Markers (pyproject.toml): slow, vllm, browser, gpu, tpu, osworld, images. `make test` runs every
test this machine can run; a test whose marker names hardware or a service that is absent
is skipped with the reason, and pytest's summary (-ra) lists each skip.

`make test` runs the suite on two pytest-xdist workers (scripts/test.sh): the tests that start something
heavy the machine should hold one of at a time (a vLLM engine, Chromium, desktop VMs, namespaced
hosts, role images, the session's Ray cluster) form one group that one worker runs in order,
handed out first because it is the longest; every other module goes whole to whichever worker
is free (its module fixtures are built once).

Randomized tests take the `seed` fixture: `--seed N`, else $DART_TEST_SEED, else a fresh
one. It is printed in the header and in the report of every failing test that used it,
so `pytest --seed N` replays a failure exactly.

vLLM's ipc sockets (VLLM_RPC_BASE_PATH) go to a directory of the session's, removed at the end.
JAX's persistent compilation cache is on for the session, in a directory of its own removed at
the end (unless $JAX_COMPILATION_CACHE_DIR names one): the suite builds the same tiny trainer
in many tests and restarts trainers in subprocesses, which inherit it, so a program compiles
once a session; a test cannot see an earlier session's programs.
"""

import importlib.util
import os
import random
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_SESSION_XLA_CACHE = None if "JAX_COMPILATION_CACHE_DIR" in os.environ else tempfile.mkdtemp(prefix="dart-jax-xla-")
if _SESSION_XLA_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _SESSION_XLA_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
# vLLM's ipc sockets of the engines this session starts in-process (their names are fresh
# uuids, left in /tmp when an engine is not shut down cleanly), removed at the end
_SESSION_VLLM_RPC = tempfile.mkdtemp(prefix="dart-jax-vllm-rpc-")
os.environ["VLLM_RPC_BASE_PATH"] = _SESSION_VLLM_RPC

import pytest  # noqa: E402

pytest_plugins = ["tests.compile_report"]


def _jax_platform(name: str) -> bool:
    if os.environ.get("JAX_PLATFORMS", "") not in ("", name):
        return False
    try:
        import jax
        return bool(jax.devices(name))
    except Exception:
        return False


def _missing(marker: str) -> str | None:
    """Why a test with `marker` cannot run here, or None when it can."""
    if marker == "gpu" and not _jax_platform("gpu"):
        return "needs a CUDA GPU (run with JAX_PLATFORMS=cuda on a GPU host)"
    if marker == "tpu" and not _jax_platform("tpu"):
        return "needs a TPU host"
    if marker == "osworld" and not os.environ.get("DART_OSWORLD_URL"):
        return "needs a reachable OSWorld VM (set DART_OSWORLD_URL=http://HOST:5000)"
    if marker == "vllm" and importlib.util.find_spec("vllm") is None:
        return "needs vLLM (make setup installs the CPU build)"
    if marker == "browser" and not (shutil.which("chromium") and shutil.which("chromedriver")):
        return "needs chromium and chromedriver (make setup installs them)"
    if marker == "images" and os.geteuid() != 0:
        return "needs root: the images' base is made with mmdebstrap (make images)"
    if marker == "hosts" and os.geteuid() != 0:
        return "needs root: hosts are network namespaces and users (ip netns, useradd)"
    if marker == "hosts" and not all(map(shutil.which, HOST_COMMANDS)):
        return "needs sudo, nfs-common, iproute2, util-linux (make setup installs them)"
    return None


HOST_COMMANDS = ("sudo", "mount.nfs", "ip", "unshare", "runuser")
# What `make test` installs itself (scripts/setup.sh): under it (DART_MAKE_TEST=1, set by
# scripts/test.sh) a test that would skip for want of one is a setup bug, and the run stops.
INSTALLED_BY_MAKE_TEST = ("vllm", "browser", "hosts")


# What puts a test in the one-worker group (see the module docstring).
SERIAL_MARKERS = ("vllm", "browser", "vm", "hosts", "images", "osworld_image", "osworld_eval")
SERIAL_FIXTURES = ("ray_cluster",)
SERIAL_GROUP = "serial"


def _serial(item) -> bool:
    return any(item.get_closest_marker(m) for m in SERIAL_MARKERS) or \
        any(f in getattr(item, "fixturenames", ()) for f in SERIAL_FIXTURES)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the items
def pytest_collection_modifyitems(config, items):
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:  # a module's tests stay together: its fixtures are built once
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP if _serial(item) else item.nodeid.split("::")[0]))
        if hasattr(config, "workerinput"):  # the order the controller hands out (--no-loadscope-reorder)
            items.sort(key=lambda item: not _serial(item))
    cache: dict[str, str | None] = {}
    for item in items:
        for marker in ("gpu", "tpu", "osworld", "vllm", "browser", "images", "hosts"):
            if item.get_closest_marker(marker) is None:
                continue
            if marker not in cache:
                cache[marker] = _missing(marker)
            reason = cache[marker]
            if reason and os.environ.get("DART_MAKE_TEST") and marker in INSTALLED_BY_MAKE_TEST \
                    and "make setup installs" in reason:
                raise pytest.UsageError(f"{item.nodeid} {reason}, but `make test` ran setup: a setup bug")
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


_SEED = pytest.StashKey[int]()


def pytest_addoption(parser):
    parser.addoption("--seed", type=int, default=None,
                     help="seed of randomized tests (default: $DART_TEST_SEED, else a fresh one)")


def pytest_configure(config):
    seed = config.getoption("--seed")
    if seed is None:
        seed = int(os.environ.get("DART_TEST_SEED") or random.SystemRandom().randrange(2**32))
    config.stash[_SEED] = seed
    os.environ["DART_TEST_SEED"] = str(seed)  # the xdist workers, started after this, draw the same


def pytest_unconfigure(config):
    if _SESSION_XLA_CACHE:
        shutil.rmtree(_SESSION_XLA_CACHE, ignore_errors=True)
    shutil.rmtree(_SESSION_VLLM_RPC, ignore_errors=True)


def pytest_report_header(config):
    seed = config.stash[_SEED]
    return f"random seed: {seed} (replay: --seed {seed} or DART_TEST_SEED={seed})"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.failed and "seed" in getattr(item, "fixturenames", ()):
        seed = item.config.stash[_SEED]
        report.sections.append(("random seed", f"{seed}: replay with --seed {seed}"))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """The tests' one tiny Qwen2.5-VL policy directory (weights, tokenizer, processor files),
    built once a session; tests that change it take a copy."""
    from dart_jax.models.tiny import make_tiny_hf_dir
    return make_tiny_hf_dir(tmp_path_factory.mktemp("tiny_hf"))


@pytest.fixture
def seed(request) -> int:
    """The session's random seed (see the module docstring)."""
    return request.config.stash[_SEED]
