"""Image sizes from file headers, without decoding and without TensorFlow.

Preparation reads each image's size here before anything decodes it: a small image file can hold
a huge image (a 1.1 MB PNG of 20000 x 20000 pixels decodes to 1.2 GB).

Not Pillow: its public API does not give what TensorFlow's decoder will allocate and accept
without decoding (a GIF's frame sizes, a BMP's bit depth, a WebP's animation flag), nor JPEG XL.
"""

from __future__ import annotations

import dataclasses
import io
import struct
from typing import BinaryIO

# The formats' headers: PNG's IHDR chunk (PNG specification, 11.2.2); a JPEG's frame header, the
# SOFn segment before the first scan (ITU-T T.81, B.2.2); GIF's logical screen and image
# descriptors (GIF89a specification, 18 and 20); the BMP file and info headers (Microsoft's
# BITMAPFILEHEADER and BITMAPINFOHEADER); WebP's first chunk, VP8, VP8L or VP8X (RFC 9649); JPEG
# XL's SizeHeader at the start of its codestream, bare or in a `jxlc`/`jxlp` box (ISO/IEC 18181-1
# and -2).


class BadImageHeader(ValueError):
    """An image file whose header cannot be read; the message says what is wrong with it."""


@dataclasses.dataclass(frozen=True)
class ImageHeader:
    """What an image file's header says. pixels: what decoding it holds in memory (a GIF: every
    frame's added up, or its canvas when larger); unsupported: why TensorFlow cannot decode it."""

    format: str
    width: int
    height: int
    frames: int = 1
    pixels: int = 0
    unsupported: str | None = None


_HEADER_CHUNK, _HEADER_CHUNK_MAX = 4 * 1024, 1024 * 1024
# How far into a file its size is looked for: a JPEG's frame header follows its metadata
# segments, a JPEG XL codestream may follow metadata boxes.
_HEADER_SEARCH_LIMIT = 32 * 1024 * 1024
_JXL_CONTAINER = b"\x00\x00\x00\x0cJXL \r\n\x87\n"
# JPEG's frame header markers, SOF0-SOF15 less DHT (C4), JPG (C8) and DAC (CC) (ITU-T T.81, table B.1).
_JPEG_SOF = frozenset((0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF))
# Of them, the lossless (C3, CB) and hierarchical (C5-C7, CD-CF) processes, which TensorFlow's
# libjpeg-turbo refuses ("Unsupported JPEG process"), as it refuses a sample precision other than 8.
_JPEG_UNDECODABLE = frozenset((0xC3, 0xC5, 0xC6, 0xC7, 0xCB, 0xCD, 0xCE, 0xCF))
# JPEG XL's fixed aspect ratios (ISO/IEC 18181-1, SizeHeader: `ratio` 1..7 gives xsize from ysize).
_JXL_RATIOS = {1: (1, 1), 2: (12, 10), 3: (4, 3), 4: (3, 2), 5: (16, 9), 6: (5, 4), 7: (2, 1)}
# TensorFlow 2.21's `decode_image(channels=3)` (trainer.images.decode), pinned by
# tests/trainer/test_prepare_inputs.py, refuses a WebP with transparency ("Number of channels
# requested does not match input") or animation ("WebP Animation must be 4 channel RGBA") and a BMP
# of other than 8, 24 or 32 bits ("Number of channels inherent in the image must be 1, 3 or 4"); it
# reads an 8-bit BMP's palette indices as grey levels and ignores a BMP's compression and colour
# masks, so such files would train on wrong pixels.
_WEBP_ALPHA = "a WebP with transparency, which TensorFlow decodes only with 4 channels, not RGB"
_WEBP_ANIMATION = "an animated WebP, which TensorFlow decodes only with 4 channels, not RGB"
_BMP_MASKS = struct.pack("<III", 0x00FF0000, 0x0000FF00, 0x000000FF)


class _Bytes:
    """An image file's bytes by offset, read a chunk at a time: 4 KiB first (most headers lie in
    it), each further chunk twice the last, up to 1 MiB."""

    def __init__(self, file: BinaryIO) -> None:
        self._file, self._start, self._chunk, self._next = file, 0, b"", _HEADER_CHUNK

    def at(self, offset: int, n: int) -> bytes:
        if not (self._start <= offset and offset + n <= self._start + len(self._chunk)):
            self._file.seek(offset)
            self._start, self._chunk = offset, self._file.read(max(n, self._next))
            self._next = min(2 * self._next, _HEADER_CHUNK_MAX)
        return self._chunk[offset - self._start : offset - self._start + n]


def _jpeg(b: _Bytes) -> ImageHeader:
    pos = 2
    while pos < _HEADER_SEARCH_LIMIT:
        m = b.at(pos, 2)
        if len(m) < 2:
            raise BadImageHeader("a JPEG that ends before its frame header (SOF marker)")
        if m[0] != 0xFF:
            raise BadImageHeader(f"a JPEG with no marker at byte {pos}")
        marker = m[1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # markers without a segment
            pos += 2
            continue
        if marker in (0xD9, 0xDA):
            raise BadImageHeader("a JPEG with no frame header (SOF marker) before its image data")
        segment = b.at(pos + 2, 7)
        length = int.from_bytes(segment[:2], "big")
        if len(segment) < 2 or length < 2:
            raise BadImageHeader(f"a JPEG with a bad segment length at byte {pos + 2}")
        if marker in _JPEG_SOF:
            if len(segment) < 7:
                raise BadImageHeader("a JPEG that ends inside its frame header")
            height, width = struct.unpack(">HH", segment[3:7])
            if height == 0:
                raise BadImageHeader("a JPEG whose height comes after its image data (DNL marker)")
            unsupported = (
                f"a {segment[2]}-bit JPEG, which TensorFlow decodes only at 8 bits"
                if segment[2] != 8
                else f"a lossless or hierarchical JPEG (SOF{marker - 0xC0}), which TensorFlow cannot decode"
                if marker in _JPEG_UNDECODABLE
                else None
            )
            return ImageHeader("JPEG", width, height, unsupported=unsupported)
        pos += 2 + length
    raise BadImageHeader(
        f"a JPEG with no frame header (SOF marker) in its first {_HEADER_SEARCH_LIMIT >> 20} MiB"
    )


def _png(b: _Bytes) -> ImageHeader:
    chunk = b.at(8, 16)
    if len(chunk) < 16 or chunk[4:8] != b"IHDR":
        raise BadImageHeader("a PNG without its IHDR chunk first")
    width, height = struct.unpack(">II", chunk[8:16])
    return ImageHeader("PNG", width, height)


def _gif_sub_blocks(b: _Bytes, pos: int) -> int:
    """The offset after the data sub-blocks starting at `pos` (a size byte, then that many bytes)."""
    while True:
        size = b.at(pos, 1)
        if not size:
            raise BadImageHeader(f"a GIF that ends inside a block (byte {pos})")
        pos += 1 + size[0]
        if size[0] == 0:
            return pos


def _gif(b: _Bytes) -> ImageHeader:
    screen = b.at(0, 13)
    if len(screen) < 13:
        raise BadImageHeader("a GIF shorter than its logical screen descriptor")
    width, height = struct.unpack("<HH", screen[6:10])
    pos = 13 + (3 << ((screen[10] & 7) + 1) if screen[10] & 0x80 else 0)  # global colour table
    frames = frame_pixels = 0
    canvas_w, canvas_h = width, height
    while True:
        block = b.at(pos, 1)
        if not block or block == b";":  # the trailer, or the end (which TensorFlow tolerates)
            break
        if block == b"!":  # an extension: its label, then sub-blocks
            pos = _gif_sub_blocks(b, pos + 2)
        elif block == b",":  # an image (a frame)
            desc = b.at(pos + 1, 9)
            if len(desc) < 9:
                raise BadImageHeader("a GIF that ends inside an image descriptor")
            left, top, w, h = struct.unpack("<HHHH", desc[:8])
            frames += 1
            frame_pixels += w * h
            canvas_w, canvas_h = max(canvas_w, left + w), max(canvas_h, top + h)
            pos += 10 + (3 << ((desc[8] & 7) + 1) if desc[8] & 0x80 else 0)  # local colour table
            pos = _gif_sub_blocks(b, pos + 1)  # after the LZW minimum code size
        else:
            raise BadImageHeader(f"a GIF with an unknown block (0x{block[0]:02x}) at byte {pos}")
    if not frames:
        raise BadImageHeader("a GIF with no image in it")
    return ImageHeader("GIF", width, height, frames, max(canvas_w * canvas_h, frame_pixels))


def _bmp(b: _Bytes) -> ImageHeader:
    head = b.at(0, 66)
    if len(head) < 18:
        raise BadImageHeader("a BMP shorter than its file header")
    info_size = int.from_bytes(head[14:18], "little")
    if info_size == 12 and len(head) >= 26:  # OS/2's BITMAPCOREHEADER: 16-bit sizes
        width, height = struct.unpack("<HH", head[18:22])
        return ImageHeader(
            "BMP", width, height, unsupported="an OS/2 BMP, whose header TensorFlow reads as a Windows BMP's"
        )
    if info_size < 40 or len(head) < 50:
        raise BadImageHeader(f"a BMP with an unknown {info_size}-byte info header")
    width, height, _, bits, compression = struct.unpack("<iiHHI", head[18:34])
    colours = int.from_bytes(head[46:50], "little")
    unsupported = None
    if bits not in (8, 24, 32):
        unsupported = f"a {bits}-bit BMP: TensorFlow decodes 8-bit (grey), 24-bit and 32-bit ones"
    elif compression == 3 and bits == 32 and head[54:66] == _BMP_MASKS:
        pass  # BI_BITFIELDS spelling out the usual BGRA layout, which TensorFlow assumes
    elif compression != 0:
        unsupported = f"a compressed BMP (compression {compression}), which TensorFlow reads as uncompressed"
    elif bits == 8:
        n = min(colours or 256, 256)
        palette = b.at(14 + info_size, 4 * n)
        if len(palette) < 4 * n or any(palette[4 * i : 4 * i + 3] != bytes((i, i, i)) for i in range(n)):
            unsupported = "an 8-bit BMP with a colour palette, whose indices TensorFlow reads as grey levels"
    return ImageHeader("BMP", width, abs(height), unsupported=unsupported)


def _webp(b: _Bytes) -> ImageHeader:
    chunk = b.at(12, 18)  # the first chunk's type and size, then the first 10 bytes of its data
    kind, data = chunk[:4], chunk[8:]
    if len(chunk) < 18:
        raise BadImageHeader("a WebP shorter than its first chunk's header")
    if kind == b"VP8 ":
        if data[3:6] != b"\x9d\x01\x2a":
            raise BadImageHeader("a lossy WebP without its frame start code")
        width, height = struct.unpack("<HH", data[6:10])
        return ImageHeader("WebP", width & 0x3FFF, height & 0x3FFF)
    if kind == b"VP8L":
        if data[0] != 0x2F:
            raise BadImageHeader("a lossless WebP without its signature byte")
        bits = int.from_bytes(data[1:5], "little")
        width, height = (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        return ImageHeader("WebP", width, height, unsupported=_WEBP_ALPHA if (bits >> 28) & 1 else None)
    if kind == b"VP8X":
        flags = data[0]
        width = int.from_bytes(data[4:7], "little") + 1
        height = int.from_bytes(data[7:10], "little") + 1
        unsupported = _WEBP_ANIMATION if flags & 0x02 else _WEBP_ALPHA if flags & 0x10 else None
        return ImageHeader("WebP", width, height, unsupported=unsupported)
    raise BadImageHeader(f"a WebP whose first chunk is {kind!r}, not VP8, VP8L or VP8X")


def _jxl_codestream(b: _Bytes) -> int:
    """The offset of a JPEG XL file's codestream (after its 0xFF0A signature)."""
    if b.at(0, 2) == b"\xff\x0a":
        return 2
    pos = len(_JXL_CONTAINER)
    while pos < _HEADER_SEARCH_LIMIT:
        box = b.at(pos, 16)
        if len(box) < 8:
            break
        size, kind, header = int.from_bytes(box[:4], "big"), box[4:8], 8
        if size == 1:
            size, header = int.from_bytes(box[8:16], "big"), 16
        if kind in (b"jxlc", b"jxlp"):
            start = pos + header + (4 if kind == b"jxlp" else 0)  # jxlp: a 4-byte index first
            if b.at(start, 2) != b"\xff\x0a":
                raise BadImageHeader("a JPEG XL container whose codestream lacks its signature")
            if size and pos + size < start + 2 + 9:  # the size header must lie in this box
                raise BadImageHeader("a JPEG XL container whose first codestream box is too short to read")
            return start + 2
        if size == 0 or size < header:  # 0: the box runs to the end of the file
            break
        pos += size
    raise BadImageHeader("a JPEG XL container without a codestream box (jxlc or jxlp)")


def _jxl(b: _Bytes) -> ImageHeader:
    """The stored size (an orientation swapping width and height leaves the pixels the same)."""
    code = b.at(_jxl_codestream(b), 9)  # a SizeHeader takes at most 68 bits
    if len(code) < 9:
        raise BadImageHeader("a JPEG XL file that ends inside its size header")
    bits, pos = int.from_bytes(code, "little"), 0

    def u(n: int) -> int:
        nonlocal pos
        value = (bits >> pos) & ((1 << n) - 1)
        pos += n
        return value

    def size() -> int:  # U32(Bits(9) + 1, Bits(13) + 1, Bits(18) + 1, Bits(30) + 1)
        return u((9, 13, 18, 30)[u(2)]) + 1

    small = u(1)
    height = (u(5) + 1) * 8 if small else size()
    ratio = u(3)
    if ratio:
        num, den = _JXL_RATIOS[ratio]
        width = height * num // den
    else:
        width = (u(5) + 1) * 8 if small else size()
    return ImageHeader("JPEG XL", width, height)


def read_image_header(data: bytes | None = None, *, file: BinaryIO | None = None) -> ImageHeader:
    """The header of an image, from its bytes or from an open file (read a chunk at a time).
    Raises BadImageHeader when it cannot be read, or is not one of TensorFlow's image formats."""
    b = _Bytes(io.BytesIO(data or b"") if file is None else file)
    head = b.at(0, 16)
    if not head:
        raise BadImageHeader("the file is empty")
    signatures = {
        _jpeg: (b"\xff\xd8\xff",),
        _png: (b"\x89PNG\r\n\x1a\n",),
        _gif: (b"GIF87a", b"GIF89a"),
        _bmp: (b"BM",),
        _jxl: (b"\xff\x0a", _JXL_CONTAINER),
    }
    reader = next((r for r, magic in signatures.items() if head.startswith(magic)), None)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        reader = _webp
    if reader is None:
        raise BadImageHeader("its content is not JPEG, PNG, GIF, BMP, WebP or JPEG XL")
    header = reader(b)
    if header.width <= 0 or header.height <= 0:
        raise BadImageHeader(
            f"its {header.format} header gives a size of {header.width}x{header.height} pixels"
        )
    return dataclasses.replace(header, pixels=max(header.pixels, header.width * header.height))
