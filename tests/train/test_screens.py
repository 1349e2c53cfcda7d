"""Screenshot sources and the per-batch cache: references without pixels, one decode per
screenshot per batch, an LRU bounded in bytes, fetched bytes checked against their hash."""

import numpy as np
import pytest

from dart_jax.agent.image_processing import ImageProcessorConfig, preprocess_image
from dart_jax.testing.trajectories import screenshots
from dart_jax.train.screens import FetchedScreens, InlineScreens, ScreenCache, decode_png
from dart_jax.wire.messages import Trajectory
from dart_jax.wire.png import address

CFG = ImageProcessorConfig(min_pixels=100 * 28 * 28, max_pixels=16384 * 28 * 28)


@pytest.fixture(scope="module")
def pngs():
    return screenshots(5, 3)  # 400x300, 280x210, 320x320


def _traj(pngs) -> Trajectory:
    return Trajectory(traj_id="a", task_id="t", steps=[], screenshots=list(pngs), reward=0.0, status="failure")


class Recording:
    """A fetch by hash that records what it was asked for."""

    def __init__(self, pngs):
        self.store = {address(p): p for p in pngs}
        self.asked: list[list[str]] = []

    def __call__(self, shas):
        self.asked.append(list(shas))
        return [self.store[s] for s in shas]


def test_inline_screens_name_each_screenshot_by_hash_and_processor_size(pngs):
    screens = InlineScreens([_traj(pngs), _traj(pngs[::-1])])
    assert [(r.sha256, r.height, r.width) for r in screens.refs(0)] == [
        (address(p), *np.asarray(decode_png(p)).shape[:2]) for p in pngs]
    assert screens.refs(1) == screens.refs(0)[::-1]
    assert screens.fetch([address(pngs[2])]) == [pngs[2]]


def test_each_screenshot_is_fetched_and_decoded_once_while_it_fits(pngs):
    fetch = Recording(pngs)
    shas = [address(p) for p in pngs]
    cache = ScreenCache(FetchedScreens([[]], fetch), CFG, max_bytes=2**30)
    first = cache.take([shas[0], shas[1], shas[0]])
    again = cache.take([shas[1], shas[2]])
    assert fetch.asked == [shas[:2], shas[2:]]  # one fetch per take, for what is missing only
    assert cache.decodes == 3 and cache.fetched_bytes == sum(map(len, pngs))
    assert again[shas[1]] is first[shas[1]]
    pixels, grid = preprocess_image(decode_png(pngs[2]), CFG)
    np.testing.assert_array_equal(again[shas[2]].pixel_values_NxD, pixels)
    assert again[shas[2]].grid_thw == grid


def test_the_lru_is_bounded_in_bytes_and_hands_out_past_the_bound(pngs):
    fetch = Recording(pngs)
    a, b, c = (address(p) for p in pngs)
    one = ScreenCache(FetchedScreens([[]], fetch), CFG, max_bytes=0).take([a])[a].nbytes
    cache = ScreenCache(FetchedScreens([[]], fetch), CFG, max_bytes=one)  # room for `a` alone
    cache.take([a])
    cache.take([a])
    assert cache.decodes == 1
    assert set(cache.take([b, c])) == {b, c}  # both handed out; only one of them is kept
    cache.take([a])  # evicted by b and c: fetched and decoded again
    assert cache.decodes == 4 and fetch.asked[-1] == [a]


def test_a_fetched_screenshot_must_match_its_hash(pngs):
    def wrong(shas):
        return [pngs[1] for _ in shas]

    cache = ScreenCache(FetchedScreens([[]], wrong), CFG, max_bytes=2**30)
    with pytest.raises(RuntimeError, match="fetched with other contents"):
        cache.take([address(pngs[0])])
