"""Where a batch's screenshots come from, and the per-batch cache of their processed pixels.

Rows are built from screenshots named by content (`ScreenshotRef`: sha256, and the size the
image processor sees), so a batch is planned into shape buckets without a pixel; the pixels
of the rows a host builds are then fetched, decoded and preprocessed once per batch:

    screens = InlineScreens(trajectories)            # trajectory files (SFT): bytes in hand
    screens = FetchedScreens(batch.screens, fetch)    # curated batches: bytes by hash, on demand
    cache = ScreenCache(screens, image_cfg, max_bytes)  # one per batch
    pixels = cache.take(sha256s)                      # {sha256: Processed}, one fetch for the missing

Content addressing makes a screenshot shared by steps, trajectories or microbatches one cache
entry, fetched once and decoded once while the cache holds it.
"""

from __future__ import annotations

import collections
import io
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence

import numpy as np
from PIL import Image

from dart_jax.agent.image_processing import ImageProcessorConfig, preprocess_image
from dart_jax.wire.messages import ScreenshotRef, Trajectory
from dart_jax.wire.png import address, png_hw

Fetch = Callable[[Sequence[str]], list[bytes]]  # PNG bytes of sha256s, in order


class ScreenSource(Protocol):
    """A batch's screenshots: their references (no pixels) and their PNG bytes on demand."""

    def refs(self, traj: int) -> Sequence[ScreenshotRef]:
        """Trajectory `traj`'s screenshots in order (what its steps' image_refs index)."""

    def fetch(self, sha256s: Sequence[str]) -> list[bytes]:
        """The PNG bytes of `sha256s`, in order."""


def screenshot_ref(png: bytes) -> ScreenshotRef:
    height, width = png_hw(png)
    return ScreenshotRef(sha256=address(png), height=height, width=width)


class InlineScreens:
    """Screenshots carried in the trajectories themselves (trajectory files, rescoring)."""

    def __init__(self, trajectories: Sequence[Trajectory]):
        self._refs = [[screenshot_ref(png) for png in t.screenshots] for t in trajectories]
        self._png = {r.sha256: png for t, refs in zip(trajectories, self._refs)
                     for r, png in zip(refs, t.screenshots)}

    def refs(self, traj: int) -> Sequence[ScreenshotRef]:
        return self._refs[traj]

    def fetch(self, sha256s: Sequence[str]) -> list[bytes]:
        return [self._png[s] for s in sha256s]


class FetchedScreens:
    """Screenshots named by a curated batch, their bytes fetched by hash (from the data manager)."""

    def __init__(self, refs: Sequence[Sequence[ScreenshotRef]], fetch: Fetch):
        self._refs, self._fetch = refs, fetch

    def refs(self, traj: int) -> Sequence[ScreenshotRef]:
        return self._refs[traj]

    def fetch(self, sha256s: Sequence[str]) -> list[bytes]:
        pngs = self._fetch(sha256s)
        for sha, png in zip(sha256s, pngs, strict=True):
            if address(png) != sha:  # content addressing makes a wrong or damaged blob evident
                raise RuntimeError(f"screenshot {sha} was fetched with other contents")
        return pngs


@dataclass(frozen=True)
class Processed:
    """One screenshot as the model takes it."""
    pixel_values_NxD: np.ndarray  # float32 [patches, C*t*p*p]
    grid_thw: tuple[int, int, int]

    @property
    def nbytes(self) -> int:
        return self.pixel_values_NxD.nbytes


def decode_png(png: bytes) -> Image.Image:
    """A screenshot as the rollout worker handed it to the processor (RGB)."""
    return Image.open(io.BytesIO(png)).convert("RGB")


class ScreenCache:
    """Processed screenshots of one batch by sha256: an LRU bounded in bytes.

    `take` hands out what it is asked for even past the bound (the rows being built need all
    of it); only later reuse depends on the bound. `decodes` counts screenshots decoded and
    preprocessed, `fetched_bytes` the PNG bytes fetched: each screenshot is fetched and decoded
    once per batch as long as the screenshots still to be reused fit `max_bytes`.
    """

    def __init__(self, source: ScreenSource, image_cfg: ImageProcessorConfig, max_bytes: int):
        self.source, self.image_cfg, self.max_bytes = source, image_cfg, max_bytes
        self._lru: collections.OrderedDict[str, Processed] = collections.OrderedDict()
        self._bytes = 0
        self.decodes = 0
        self.fetched_bytes = 0

    def take(self, sha256s: Iterable[str]) -> dict[str, Processed]:
        """The processed screenshots named: cached ones, and the rest fetched in one go."""
        wanted = list(dict.fromkeys(sha256s))
        out = {s: self._lru[s] for s in wanted if s in self._lru}
        missing = [s for s in wanted if s not in out]
        for sha, png in zip(missing, self.source.fetch(missing) if missing else [], strict=True):
            self.fetched_bytes += len(png)
            out[sha] = self._process(png)
        for sha in wanted:  # most recently used last; evict from the front
            self._remember(sha, out[sha])
        return out

    def _process(self, png: bytes) -> Processed:
        pixels, grid = preprocess_image(decode_png(png), self.image_cfg)
        self.decodes += 1
        return Processed(pixels, grid)

    def _remember(self, sha: str, entry: Processed) -> None:
        if sha in self._lru:
            self._lru.move_to_end(sha)
            return
        self._lru[sha] = entry
        self._bytes += entry.nbytes
        while self._bytes > self.max_bytes and self._lru:
            _, old = self._lru.popitem(last=False)
            self._bytes -= old.nbytes
