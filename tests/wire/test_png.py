"""A screenshot's size from its PNG chunks: what the image processor sees, without decoding."""

import io

import numpy as np
import pytest
from PIL import Image

from dart_jax.agent.image_processing import to_rgb_array
from dart_jax.wire.png import png_hw


def _png(width: int, height: int, **save) -> bytes:
    rng = np.random.default_rng(width * height)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buf, "PNG", **save)
    return buf.getvalue()


def _processor_hw(png: bytes) -> tuple[int, int]:
    return to_rgb_array(Image.open(io.BytesIO(png))).shape[:2]


def test_a_plain_png_is_sized_from_its_header_without_decoding():
    png = _png(37, 21)
    assert png_hw(png) == _processor_hw(png) == (21, 37)
    idat = png.index(b"IDAT")
    broken = png[:idat + 4] + bytes(len(png) - idat - 4)  # pixels unreadable, headers intact
    assert png_hw(broken) == (21, 37)
    with pytest.raises(OSError):
        Image.open(io.BytesIO(broken)).load()


@pytest.mark.parametrize("orientation, want", [(1, (21, 37)), (3, (21, 37)), (6, (37, 21)), (8, (37, 21))])
def test_exif_orientation_is_applied_as_the_processor_applies_it(orientation, want):
    exif = Image.Exif()
    exif[0x0112] = orientation
    png = _png(37, 21, exif=exif.tobytes())
    assert png_hw(png) == _processor_hw(png) == want


def test_text_chunks_without_orientation_keep_the_header_size():
    from PIL.PngImagePlugin import PngInfo
    info = PngInfo()
    info.add_text("Software", "xwd")
    png = _png(37, 21, pnginfo=info)
    assert png_hw(png) == _processor_hw(png) == (21, 37)


@pytest.mark.parametrize("data", [b"", b"\x89PNG" + bytes(100), b"GIF89a" + bytes(40)])
def test_anything_but_a_png_is_refused(data):
    with pytest.raises(ValueError, match="not a PNG"):
        png_hw(data)
