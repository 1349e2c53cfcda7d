"""Shared-memory regions: a worker maps only a region of this machine that the reply's token
names, read-only, never through a link; a trainer's directory goes when it closes, and the
next trainer removes those of processes that died."""

import os
import subprocess
import sys

import numpy as np
import pytest

from dart_jax.wire import codec
from dart_jax.wire.codec import WireError
from dart_jax.wire.messages import WeightBucketShared
from dart_jax.wire.shm import Region, RegionDir, RegionError, available, sweep

pytestmark = pytest.mark.skipif(not available(), reason="no /dev/shm")


@pytest.fixture
def regions():
    d = RegionDir()
    yield d
    d.close()


def test_a_worker_maps_the_region_its_token_names_read_only(regions):
    mine = regions.slot(0, 4096)
    mine.data[:] = np.arange(4096) % 251
    theirs = Region.open(mine.path, mine.token)
    try:
        assert theirs.size == 4096 and np.array_equal(theirs.data, mine.data)
        with pytest.raises(ValueError, match="read-only"):
            theirs.data[0] = 1
        mine.data[7] = 200  # the trainer's later writes are seen through the mapping
        assert theirs.data[7] == 200
    finally:
        theirs.close()
    assert regions.slot(0, 4096) is mine  # the same size keeps the slot's region
    bigger = regions.slot(0, 8192)
    assert bigger.path == mine.path and bigger.token != mine.token  # the slot's name, a new file
    with pytest.raises(RegionError, match="token or size differ"):
        Region.open(bigger.path, mine.token)  # a reply naming the replaced region


def test_what_a_reply_names_is_refused_unless_it_is_a_region_of_this_machine(regions, tmp_path):
    region = regions.slot(1, 64)
    with pytest.raises(RegionError, match="not a weight region"):
        Region.open("/etc/passwd", region.token)
    with pytest.raises(RegionError, match="not a weight region"):
        Region.open(region.path + "/../../../etc/passwd", region.token)
    with pytest.raises(RegionError, match="another machine"):
        Region.open(f"{regions.path}/slot-77", region.token)  # the form of one, on no file here
    with pytest.raises(RegionError, match="token or size differ"):
        Region.open(region.path, "0" * 32)
    link = regions.path / "slot-5"
    link.symlink_to(region.path)
    with pytest.raises(RegionError, match="another machine"):  # O_NOFOLLOW: a link is never followed
        Region.open(str(link), region.token)
    plain = regions.path / "slot-6"
    plain.write_bytes(b"DARTJAXW" + bytes.fromhex(region.token) + (64).to_bytes(8, "little") + bytes(100))
    with pytest.raises(RegionError, match="token or size differ"):  # a header that lies about its size
        Region.open(str(plain), region.token)
    reply = WeightBucketShared(version=1, bucket=0, checksum=1, region="/tmp/x", token=region.token, offset=0)
    with pytest.raises(WireError, match=r"\$\.region"):  # refused on decoding, before anything opens it
        codec.decode(codec.encode(reply), 2**20)


def test_a_closed_directory_is_gone_and_a_dead_trainers_is_swept(tmp_path):
    d = RegionDir()
    d.slot(0, 128)
    path = d.path
    d.close()
    assert not path.exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"dart-jax-{int(dead.stdout)}-0123456789abcdef"
    live = tmp_path / f"dart-jax-{os.getpid()}-0123456789abcdef"
    other = tmp_path / "dart-jax-notes"
    for p in (stale, live, other):
        p.mkdir()
        (p / "slot-0").write_bytes(b"x")
    assert sweep(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and other.exists()
