"""A PNG screenshot's content address (sha256 hex, what the wire's `Sha256` names) and its size
as the image processor sees it, read from its chunk headers.

The data manager records each stored screenshot's (height, width) so curated batches can name
screenshots by content and the trainer can plan shapes without pixels. The processor applies
EXIF orientation first (agent/image_processing.to_rgb_array), so orientations 5-8 swap the
axes. PIL only finds an orientation in an eXIf chunk or a text chunk (a raw EXIF profile, XMP);
a PNG without those is sized from IHDR alone, and one with them is opened by PIL exactly as the
processor opens it (which inflates the pixels: screenshots rarely carry such chunks).
"""

from __future__ import annotations

import hashlib
import io
import struct

from PIL import Image

SIGNATURE = b"\x89PNG\r\n\x1a\n"
_MAY_ORIENT = frozenset({b"eXIf", b"tEXt", b"zTXt", b"iTXt"})
_SWAP_AXES = (5, 6, 7, 8)  # EXIF orientations that transpose the image


def address(data: bytes) -> str:
    """The content address of a screenshot: the sha256 of its bytes, lowercase hex."""
    return hashlib.sha256(data).hexdigest()


def png_hw(png: bytes) -> tuple[int, int]:
    """(height, width) after EXIF orientation; ValueError when `png` is not a PNG."""
    if len(png) < 24 or png[:8] != SIGNATURE or png[12:16] != b"IHDR":
        raise ValueError("not a PNG (no signature and IHDR chunk)")
    width, height = struct.unpack(">II", png[16:24])
    if not (width and height):
        raise ValueError(f"PNG of {width}x{height} pixels")
    pos = 8
    while pos + 8 <= len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        if kind in _MAY_ORIENT:
            return _pil_hw(png)
        if kind == b"IEND":
            break
        pos += 12 + length  # length, type, data, CRC
    return height, width


def _pil_hw(png: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(png)) as im:
        if im.getexif().get(0x0112) in _SWAP_AXES:
            return im.width, im.height
        return im.height, im.width
