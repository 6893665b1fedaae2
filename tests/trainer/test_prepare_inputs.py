"""What a folder source may hold (issue 24): every image format TensorFlow decodes is used, each
image's size is checked from its header before anything decodes it (MAX_IMAGE_PIXELS), every
entry not used is listed by kind and kept, and SIGTERM leaves no staging folder behind.

The header reader is checked against TensorFlow itself: for every format and variant, the size
it reads is the shape TensorFlow decodes, and what it calls unsupported TensorFlow indeed cannot
decode (or decodes wrongly). If a TensorFlow upgrade changes any of that, these tests say so.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, features

from tests.processes import ROOT, trainer_env
from trainer import prepare as P
from trainer.config import MAX_IMAGE_PIXELS
from trainer.preparation import folders, imageheaders, prepareconfig, source
from trainer.preparation.prepareconfig import PrepareConfig
from trainer.preparation.progress import Progress
from trainer.preparation.source import PrepareError

pytestmark = pytest.mark.hardening  # make test-hardening


def save(image: Image.Image, fmt: str, **kwargs: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kwargs)
    return buf.getvalue()


def noise(width: int, height: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8))


def decoded(data: bytes) -> np.ndarray:
    """What preparation decodes the bytes to (trainer.images.decode: RGB, a GIF's first frame)."""
    from trainer import images

    return np.asarray(images.decode(data))


# JPEG XL files written by libjxl 0.11.2 (imagecodecs 2026.3.6, `jpegxl_encode`): none of the
# tools here writes JPEG XL. small: 7x5 lossless, pixels `jxl_small_pixels()`; z_WxH: black
# images whose sizes take each way a SizeHeader has to spell a size (small, aspect ratio,
# explicit); container: `small` in an ISOBMFF container (a `jxlc` box).
JXL = {
    "small": (
        "ff0a204010090804010020024b18938e838329306202308a858d3198e11815638c88118e856304628c31f202"
        "3102a4b025146057a82c2b9d72ae547ae75ca954cab9526985f0a4d20a1f4b596233760e93d2f10ca4c4f14c"
        "aec4f10ca7c0f194acc4f11cabc411058879db6a9de7a5cbb3ef9ed7675f70936ffecfbd1d8335773cf25bee"
        "38ce2b1824b9bd0be4094ed02d016803"
    ),
    "z_8x8": "ff0a414024080401001c004b188b15820300",
    "z_400x300": "ff0a58391009080401001c004b188b15820300",
    "z_2000x64": (
        "ff0af8819e0f88040802010018000000800008800008800008800008004b188b158201070007000700070007"
        "00070007000700"
    ),
    "z_777x513": (
        "ff0a0210086180480802010018000000800008800008800008800008800008800008004b188b158201070007"
        "000700070007000700070007000700070007000700"
    ),
    "container": (
        "0000000c4a584c200d0a870a00000014667479706a786c20000000006a786c200000009c6a786c63ff0a2040"
        "10090804010020024b18938e838329306202308a858d3198e11815638c88118e856304628c31f2023102a4b0"
        "25146057a82c2b9d72ae547ae75ca954cab9526985f0a4d20a1f4b596233760e93d2f10ca4c4f14caec4f10c"
        "a7c0f194acc4f11cabc411058879db6a9de7a5cbb3ef9ed7675f70936ffecfbd1d8335773cf25bee38ce2b18"
        "24b9bd0be4094ed02d016803"
    ),
}


def jxl(name: str) -> bytes:
    return bytes.fromhex(JXL[name])


def jxl_small_pixels() -> np.ndarray:
    a = (np.indices((5, 7)).sum(0) * 20 % 256).astype(np.uint8)
    return np.stack([a, a[::-1], 255 - a], -1)


def animated_gif(frames: int = 3) -> bytes:
    """Frames that differ in a corner only: PIL writes the later ones smaller (optimized)."""
    images = [noise(50, 40, seed=1) for _ in range(frames)]
    for i, image in enumerate(images[1:], 1):
        image.paste((255, 0, 30 * i), (5, 5, 15, 12))
    return save(images[0], "GIF", save_all=True, append_images=images[1:])


def bmp_top_down() -> bytes:
    data = bytearray(save(noise(9, 6), "BMP"))
    struct.pack_into("<i", data, 22, -struct.unpack_from("<i", data, 22)[0])
    return bytes(data)


def jpeg_with_big_metadata() -> bytes:
    """A 200 kB ICC profile in four APP2 segments before the frame header: past the first chunk
    the reader reads."""
    return save(noise(33, 21), "JPEG", icc_profile=b"\0" * 200_000)


DECODABLE: dict[str, Any] = {
    "jpeg": lambda: save(noise(31, 17), "JPEG"),
    "jpeg progressive": lambda: save(noise(31, 17), "JPEG", progressive=True),
    "jpeg cmyk": lambda: save(noise(31, 17).convert("CMYK"), "JPEG"),
    "jpeg big metadata": jpeg_with_big_metadata,
    "png": lambda: save(noise(13, 7), "PNG"),
    "png 16-bit grey": lambda: save(noise(13, 7).convert("I;16"), "PNG"),
    "png palette": lambda: save(noise(13, 7).convert("P"), "PNG"),
    "gif": lambda: save(noise(21, 11).convert("P"), "GIF"),
    "gif animated": animated_gif,
    "bmp 24-bit": lambda: save(noise(9, 6), "BMP"),
    "bmp 32-bit": lambda: save(noise(9, 6).convert("RGBA"), "BMP"),
    "bmp 8-bit grey": lambda: save(noise(9, 6).convert("L"), "BMP"),
    "bmp top-down": bmp_top_down,
    "webp lossy": lambda: save(noise(19, 23), "WEBP"),
    "webp lossless": lambda: save(noise(19, 23), "WEBP", lossless=True),
    "webp extended (icc)": lambda: save(noise(19, 23), "WEBP", icc_profile=b"\0" * 128),
    **{f"jxl {name}": (lambda name=name: jxl(name)) for name in JXL},
}


@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_a_grey_or_rgba_tfds_image_is_stored_as_rgb_as_its_file_would_be_served(encoding: str) -> None:
    """A TFDS feature of 1, 2 or 4 channels (mnist's grey) is stored as the 3 channels the trainer
    reads, the same pixels `images.decode` gives the same image's PNG file at serving."""
    from trainer import images
    from trainer._tf import tf
    from trainer.preparation.prepareconfig import PrepareConfig
    from trainer.preparation.shards import record_encoder

    encode = record_encoder(
        PrepareConfig(source="synthetic", output_dir="/o", image_size=8, encoding=encoding)
    )
    rng = np.random.default_rng(0)
    for channels in (1, 2, 4):
        image = tf.constant(rng.integers(0, 256, (8, 8, channels), dtype=np.uint8))
        stored, _ = encode(image, 0)
        served = images.decode(tf.io.encode_png(image))
        assert images.decode_stored(stored, encoding, 8).numpy().tolist() == served.numpy().tolist()


@pytest.mark.parametrize("case", list(DECODABLE))
def test_the_header_gives_the_size_tensorflow_decodes(case: str) -> None:
    data = DECODABLE[case]()
    image = decoded(data)
    header = imageheaders.read_image_header(data)
    assert header.unsupported is None, header
    assert (header.height, header.width, 3) == image.shape, header
    assert (
        imageheaders.read_image_header(file=io.BytesIO(data)) == header
    )  # read from a file, a chunk at a time


def test_every_image_format_preparation_uses_is_one_tensorflow_decodes() -> None:
    made = {imageheaders.read_image_header(DECODABLE[case]()).format for case in DECODABLE}
    assert made == set(folders.IMAGE_FORMATS.values())


def test_jpeg_xl_pixels_are_decoded_exactly() -> None:
    assert np.array_equal(decoded(jxl("small")), jxl_small_pixels())
    assert np.array_equal(decoded(jxl("container")), jxl_small_pixels())


def gif(screen: tuple[int, int], frames: list[tuple[int, int, int, int]], *, extras: bool = True) -> bytes:
    """A GIF whose image descriptors are `frames` (left, top, width, height), each with one LZW
    data byte; with `extras`, a global colour table, a local one on the second frame, and
    extension blocks (graphic control, a comment of three sub-blocks) to walk past."""
    gct = 0x80 | 1  # a table of 4 colours
    out = (
        b"GIF89a"
        + struct.pack("<HHBBB", *screen, gct if extras else 0, 0, 0)
        + (b"\0" * 12 if extras else b"")
    )
    for i, (left, top, w, h) in enumerate(frames):
        if extras:
            out += b"!\xf9\x04\x04\x0a\x00\x00\x00"  # graphic control: delay, no transparency
            out += b"!\xfe" + b"\xff" + b"c" * 255 + b"\x10" + b"d" * 16 + b"\x01e" + b"\x00"  # a comment
        lct = extras and i == 1
        out += (
            b","
            + struct.pack("<HHHHB", left, top, w, h, 0x80 | 2 if lct else 0)
            + (b"\0" * 24 if lct else b"")
        )
        out += b"\x02\x01\x00\x00"
    return out + b";"


def test_a_gif_counts_every_frame_of_the_canvas() -> None:
    header = imageheaders.read_image_header(gif((50, 40), [(0, 0, 50, 40), (5, 5, 10, 7), (0, 0, 20, 3)]))
    assert (header.width, header.height, header.frames, header.pixels) == (50, 40, 3, 2000 + 70 + 60)
    # A frame reaching past the logical screen: TensorFlow's canvas holds it.
    header = imageheaders.read_image_header(gif((10, 10), [(0, 0, 10, 10), (30, 0, 10, 40)], extras=False))
    assert (header.frames, header.pixels) == (2, 40 * 40)
    with pytest.raises(imageheaders.BadImageHeader, match="ends inside a block"):
        imageheaders.read_image_header(gif((10, 10), [(0, 0, 10, 10)])[:-4])


def colour_bmp() -> tuple[bytes, np.ndarray]:
    """An 8-bit BMP with a colour palette, and its true pixels."""
    image = Image.fromarray(np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255]]] * 2, dtype=np.uint8))
    paletted = image.convert("P", palette=Image.Palette.ADAPTIVE, colors=3)
    return save(paletted, "BMP"), np.asarray(paletted.convert("RGB"))


def os2_bmp() -> bytes:
    rows = b"".join(b"\x00\x00\xff" * 3 + b"\0\0\0" for _ in range(2))  # 3x2 red, rows 4-byte aligned
    return (
        b"BM" + struct.pack("<IHHI", 26 + len(rows), 0, 0, 26) + struct.pack("<IHHHH", 12, 3, 2, 1, 24) + rows
    )


def translucent() -> Image.Image:
    image = noise(7, 5).convert("RGBA")
    image.putalpha(100)
    return image


def patched_jpeg(marker: int = 0xC0, precision: int = 8) -> bytes:
    """A baseline JPEG whose frame header is made to name another process or sample precision."""
    data = bytearray(save(noise(8, 8), "JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 1], data[sof + 4] = marker, precision
    return bytes(data)


UNSUPPORTED: dict[str, Any] = {
    "jpeg 12-bit": lambda: patched_jpeg(0xC1, precision=12),
    **{
        f"jpeg sof{m - 0xC0}": lambda m=m: patched_jpeg(m)
        for m in (0xC3, 0xC5, 0xC6, 0xC7, 0xCB, 0xCD, 0xCE, 0xCF)
    },
    "webp lossy translucent": lambda: save(translucent(), "WEBP"),
    "webp lossless translucent": lambda: save(translucent(), "WEBP", lossless=True),
    "webp animated": lambda: save(noise(8, 8), "WEBP", save_all=True, append_images=[noise(8, 8, seed=1)]),
    "bmp 1-bit": lambda: save(noise(9, 6).convert("1"), "BMP"),
    "bmp os/2": os2_bmp,
}


@pytest.mark.parametrize("case", list(UNSUPPORTED))
def test_what_the_header_calls_unsupported_tensorflow_cannot_decode(case: str) -> None:
    from trainer._tf import tf

    data = UNSUPPORTED[case]()
    assert imageheaders.read_image_header(data).unsupported
    with pytest.raises(tf.errors.InvalidArgumentError):
        decoded(data)


def test_an_8_bit_colour_bmp_is_unsupported_because_tensorflow_decodes_it_wrongly() -> None:
    data, truth = colour_bmp()
    assert "colour palette" in (imageheaders.read_image_header(data).unsupported or "")
    assert not np.array_equal(decoded(data), truth)  # palette indices read as grey levels


UNDECODABLE = {
    ".tiff": lambda: save(noise(8, 8), "TIFF"),
    ".ico": lambda: save(noise(16, 16), "ICO"),
    ".avif": lambda: save(noise(8, 8), "AVIF"),
}


@pytest.mark.parametrize("ext", list(UNDECODABLE))
def test_formats_listed_as_undecodable_are_refused_by_tensorflow(ext: str) -> None:
    from trainer._tf import tf

    if ext == ".avif" and not features.check("avif"):
        pytest.skip("this Pillow writes no AVIF")
    assert ext in folders.UNDECODABLE_FORMATS
    with pytest.raises(tf.errors.InvalidArgumentError, match="Unknown image file format"):
        decoded(UNDECODABLE[ext]())


BAD_HEADERS = {
    "empty": (b"", "the file is empty"),
    "text": (b"hello, not an image", "not JPEG, PNG, GIF, BMP, WebP or JPEG XL"),
    "jpeg without frame header": (b"\xff\xd8\xff\xd9", "no frame header"),
    "jpeg cut in its metadata": (b"\xff\xd8\xff\xe1\x10\x00Exif", "ends before its frame header"),
    "png cut after its signature": (b"\x89PNG\r\n\x1a\n\0\0\0\x0dIH", "without its IHDR chunk"),
    "gif without image": (b"GIF89a\x05\x00\x05\x00\x00\x00\x00;", "no image in it"),
    "bmp unknown header": (
        b"BM" + b"\0" * 12 + struct.pack("<I", 20) + b"\0" * 40,
        "unknown 20-byte info header",
    ),
    "webp unknown chunk": (b"RIFF\x20\0\0\0WEBPABCD" + b"\0" * 20, "not VP8, VP8L or VP8X"),
    "jxl container without codestream": (bytes.fromhex(JXL["container"])[:32], "without a codestream box"),
}


@pytest.mark.parametrize("case", list(BAD_HEADERS))
def test_a_header_that_cannot_be_read_is_a_bad_image_tensorflow_cannot_decode_either(case: str) -> None:
    from trainer._tf import tf

    data, words = BAD_HEADERS[case]
    with pytest.raises(imageheaders.BadImageHeader, match=words):
        imageheaders.read_image_header(data)
    with pytest.raises(tf.errors.InvalidArgumentError):
        decoded(data)


# --- pixel bombs ------------------------------------------------------------------------------


def png_bomb(width: int, height: int) -> bytes:
    """A PNG whose IHDR says width x height: refused from its header, its data never read."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def jpeg_bomb(width: int, height: int) -> bytes:
    sof = struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    return b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00\xff\xc0" + sof + b"\xff\xd9"


def gif_bomb(side: int, frames: int) -> bytes:
    """A GIF of `frames` frames of side x side pixels (each one LZW byte long)."""
    frame = b"," + struct.pack("<HHHHB", 0, 0, side, side, 0) + b"\x02\x01\x00\x00"
    return b"GIF89a" + struct.pack("<HHBBB", side, side, 0, 0, 0) + frame * frames + b";"


def write_images(
    folder: Path, count: int, *, seed: int = 0, fmt: str = "PNG", size: tuple[int, int] = (12, 10)
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (folder / f"img{i}.{fmt.lower()}").write_bytes(save(noise(*size, seed=seed * 100 + i), fmt))


def two_classes(root: Path, count: int = 4) -> Path:
    write_images(root / "train" / "a", count, seed=1)
    write_images(root / "train" / "b", count, seed=2)
    return root


def test_pixel_bombs_are_refused_from_their_headers_before_anything_is_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer import images

    root = two_classes(tmp_path / "src")
    bombs = {
        "huge.png": png_bomb(20000, 20000),
        "huge.jpg": jpeg_bomb(30000, 20000),
        "frames.gif": gif_bomb(3000, 10),
    }
    for name, data in bombs.items():
        (root / "train" / "b" / name).write_bytes(data)
    (root / "train" / "a" / "limit.png").write_bytes(png_bomb(8192, 8192))  # exactly the limit: allowed
    assert imageheaders.read_image_header(png_bomb(8192, 8192)).pixels == MAX_IMAGE_PIXELS

    def never(*args: Any) -> Any:
        raise AssertionError("an image was decoded")

    monkeypatch.setattr(images, "decode", never)
    out = tmp_path / "out"
    with pytest.raises(PrepareError) as err:
        P.prepare(PrepareConfig(source=f"folder:{root}", output_dir=str(out), image_size=32))
    lines = str(err.value).splitlines()
    limit = "over the limit of 67,108,864 pixels (8192x8192), so it is not decoded; downscale it"
    b = root / "train" / "b"
    assert lines == [
        (
            f"image {b / 'frames.gif'} is a GIF of 10 frames of 3000x3000 pixels: 90,000,000 pixels to decode "
            f"(TensorFlow reads every frame of a GIF, even to keep the first), {limit} (training uses at most "
            "1024x1024) or remove it"
        ),
        (
            f"image {b / 'huge.jpg'} is 30000x20000 pixels (600,000,000 pixels), {limit} (training uses at most "
            "1024x1024) or remove it"
        ),
        (
            f"image {b / 'huge.png'} is 20000x20000 pixels (400,000,000 pixels), {limit} (training uses at most "
            "1024x1024) or remove it"
        ),
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no output, no staging folder


def test_an_image_not_checked_while_listing_is_refused_before_decoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gs:// images are not opened while listing (a request each): each is checked from its
    header as it is read, before it is decoded. Here a local source stands in, its listing check
    switched off; the image is a real 72 MP PNG that TensorFlow would decode without complaint."""
    root = two_classes(tmp_path / "src")
    big = root / "train" / "b" / "big.png"
    Image.new("L", (9000, 8000)).save(big)
    monkeypatch.setattr(folders, "check_image_file", lambda p: None)
    out = tmp_path / "out"
    with pytest.raises(
        PrepareError, match=rf"image {big} is 9000x8000 pixels \(72,000,000 pixels\), over the limit"
    ):
        P.prepare(PrepareConfig(source=f"folder:{root}", output_dir=str(out), image_size=32))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_unreadable_headers_and_unsupported_variants_are_bad_images_all_named_at_once(tmp_path: Path) -> None:
    root = two_classes(tmp_path / "src")
    b = root / "train" / "b"
    (b / "text.jpg").write_text("not an image")
    (b / "cut.png").write_bytes(save(noise(8, 8), "PNG")[:20])
    (b / "translucent.webp").write_bytes(save(translucent(), "WEBP"))
    (b / "palette.bmp").write_bytes(colour_bmp()[0])
    with pytest.raises(PrepareError) as err:
        P.prepare(PrepareConfig(source=f"folder:{root}", output_dir=str(tmp_path / "out"), image_size=32))
    assert str(err.value).splitlines() == [
        f"cannot decode image {b / 'cut.png'}: a PNG without its IHDR chunk first",
        (
            f"cannot decode image {b / 'palette.bmp'}: an 8-bit BMP with a colour palette, whose indices "
            "TensorFlow reads as grey levels; convert it to PNG or JPEG, or remove it"
        ),
        f"cannot decode image {b / 'text.jpg'}: its content is not JPEG, PNG, GIF, BMP, WebP or JPEG XL",
        (
            f"cannot decode image {b / 'translucent.webp'}: a WebP with transparency, which TensorFlow "
            "decodes only with 4 channels, not RGB; convert it to PNG or JPEG, or remove it"
        ),
    ]


def test_many_bad_images_are_counted_past_the_ones_shown(tmp_path: Path) -> None:
    root = two_classes(tmp_path / "src")
    for i in range(source.MAX_PROBLEMS_SHOWN + 5):
        (root / "train" / "b" / f"bad{i:02d}.png").write_text("no")
    with pytest.raises(PrepareError) as err:
        P.prepare(PrepareConfig(source=f"folder:{root}", output_dir=str(tmp_path / "out"), image_size=32))
    lines = str(err.value).splitlines()
    assert len(lines) == source.MAX_PROBLEMS_SHOWN + 1 and lines[-1] == "... and 5 more like these"


def test_a_good_header_on_corrupt_data_is_still_named_when_decoding_fails(tmp_path: Path) -> None:
    root = two_classes(tmp_path / "src")
    whole = save(noise(64, 48), "JPEG")
    cut = root / "train" / "b" / "cut.jpg"
    cut.write_bytes(whole[: len(whole) // 3])
    assert imageheaders.read_image_header(cut.read_bytes()).width == 64
    with pytest.raises(PrepareError, match=rf"cannot decode image {cut}: "):
        P.prepare(PrepareConfig(source=f"folder:{root}", output_dir=str(tmp_path / "out"), image_size=32))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


# --- every format used, everything else listed --------------------------------------------------


def read_all(out: Path) -> list[np.ndarray]:
    from trainer import data, datasetinfo

    meta = datasetinfo.load_metadata(str(out))
    found = []
    for split in ("train", "validation", "test"):
        for x, _ in data.make_dataset(str(out), meta, split, batch_size=1, training=False):
            found.append(x.numpy()[0])
    return found


def test_gif_bmp_webp_and_jpeg_xl_images_are_used_with_their_true_pixels(tmp_path: Path) -> None:
    from trainer import images

    root = tmp_path / "src"
    files = {
        "train/a/x.png": save(noise(7, 5, seed=1), "PNG"),
        "train/a/x.gif": save(noise(7, 5, seed=2).convert("P"), "GIF"),
        "train/a/x.bmp": save(noise(7, 5, seed=3), "BMP"),
        "train/a/grey.bmp": save(noise(7, 5, seed=4).convert("L"), "BMP"),
        "train/b/x.webp": save(noise(7, 5, seed=5), "WEBP", lossless=True),
        "train/b/x.jxl": jxl("small"),
        "train/b/y.gif": animated_gif(),
        "train/b/z.png": save(noise(7, 5, seed=6), "PNG"),
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    out = tmp_path / "out"
    meta = P.prepare(PrepareConfig(source=f"folder:{root}", output_dir=str(out), image_size=32, shards=1))
    assert sum(s["count"] for s in meta["splits"].values()) == len(files)
    assert meta["source_info"]["skipped"] == {"count": 0, "kinds": []}

    def truth(data: bytes) -> np.ndarray:
        rgb = (
            np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
            if not data.startswith(b"\xff\x0a")
            else jxl_small_pixels()
        )
        return np.asarray(images.resize(rgb, 32))

    prepared = {hashlib.sha256(x.tobytes()).hexdigest() for x in read_all(out)}
    for rel, data in files.items():
        assert hashlib.sha256(truth(data).tobytes()).hexdigest() in prepared, rel


def tree_state(root: Path) -> dict[str, str]:
    """Every path under `root` with its content's hash (folders: "dir"; links: their target)."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                state[rel] = f"link:{os.readlink(p)}"
            elif p.is_dir():
                state[rel] = "dir"
            else:
                state[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return state


def messy_folder(root: Path) -> Path:
    """Two classes of PNGs, and one of everything a real folder holds beside them."""
    two_classes(root)
    write_images(root / "test" / "a", 2, seed=3)
    write_images(root / "test" / "b", 2, seed=4)
    (root / "train" / "a" / "scan.tiff").write_bytes(save(noise(8, 8), "TIFF"))
    (root / "train" / "b" / "scan.TIF").write_bytes(save(noise(8, 8), "TIFF"))
    (root / "train" / "b" / "photo.heic").write_bytes(b"\0\0\0\x18ftypheic")
    (root / "train" / "a" / "notes.txt").write_text("labels checked by Ann")
    (root / "train" / "a" / "LICENSE").write_text("CC-BY")
    write_images(root / "train" / "a" / "old", 2, seed=5)  # a nested folder of images
    (root / "train" / "stray.png").write_bytes(save(noise(8, 8), "PNG"))  # beside the class folders
    (root / "README.md").write_text("my dataset")
    (root / ".DS_Store").write_bytes(b"\0")
    (root / "train" / "a" / ".DS_Store").write_bytes(b"\0")
    (root / "train" / "b" / "._img0.png").write_bytes(b"\0\x05\x16\x07")  # macOS AppleDouble, not a PNG
    write_images(root / "train" / ".ipynb_checkpoints", 1, seed=6)  # a hidden folder: not a class
    return root


SKIPPED_LINE = (
    "prepare: skipped 12 entries of the source (not used, left as they are): 1 .heic (TensorFlow cannot "
    "decode HEIF), 1 .tif (TensorFlow cannot decode TIFF), 1 .tiff (TensorFlow cannot decode TIFF), 1 .txt "
    "(not an image), 1 file at the top (only the split folders are read there), 1 file beside the class "
    "folders (images go inside a class folder), 1 file without extension (not an image), 1 nested folder "
    "(class folders are read one level deep), 4 hidden; e.g. train/b/photo.heic, train/b/scan.TIF, "
    "train/a/scan.tiff, train/a/notes.txt"
)


def test_entries_not_used_are_listed_by_kind_once_recorded_and_kept(tmp_path: Path) -> None:
    root = messy_folder(tmp_path / "src")
    before = tree_state(root)
    lines = io.StringIO()
    out = tmp_path / "out"
    meta = P.prepare(
        PrepareConfig(source=f"folder:{root}", output_dir=str(out), image_size=32),
        Progress(bars=False, out=lines),
    )
    said = [line for line in lines.getvalue().splitlines() if "skipped" in line]
    assert said == [SKIPPED_LINE], lines.getvalue()
    assert meta["class_names"] == ["a", "b"]  # not the hidden .ipynb_checkpoints
    assert sum(v["count"] for v in meta["splits"].values()) == 12  # the 8 train and 4 test PNGs
    skipped = json.loads((out / "metadata.json").read_text())["source_info"]["skipped"]
    assert skipped["count"] == 12
    assert {k["kind"]: (k["count"], k["examples"]) for k in skipped["kinds"]} == {
        ".heic": (1, ["train/b/photo.heic"]),
        ".tif": (1, ["train/b/scan.TIF"]),
        ".tiff": (1, ["train/a/scan.tiff"]),
        ".txt": (1, ["train/a/notes.txt"]),
        "file at the top": (1, ["README.md"]),
        "file beside the class folders": (1, ["train/stray.png"]),
        "file without extension": (1, ["train/a/LICENSE"]),
        "nested folder": (1, ["train/a/old/"]),
        "hidden": (4, []),
    }
    assert tree_state(root) == before  # nothing of the source moved, changed or deleted


def test_the_command_ends_by_pointing_at_the_skipped_entries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = messy_folder(tmp_path / "src")
    code = P.main([f"--source=folder:{root}", f"--output_dir={tmp_path / 'out'}", "--image_size=32"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[-1].endswith("; 12 source entries skipped (listed above, and in source_info.skipped)"), out
    assert sum(line.startswith("prepare: skipped 12 entries") for line in out) == 1, out


def test_a_class_of_undecodable_files_is_refused_saying_what_is_there(tmp_path: Path) -> None:
    root = two_classes(tmp_path / "src")
    for f in (root / "train" / "b").iterdir():
        f.unlink()
    for i in range(2):
        (root / "train" / "b" / f"scan{i}.tiff").write_bytes(save(noise(8, 8), "TIFF"))
    with pytest.raises(PrepareError) as err:
        P.prepare(PrepareConfig(source=f"folder:{root}", output_dir=str(tmp_path / "out"), image_size=32))
    assert str(err.value) == (
        f"class 'b' has no images in {root / 'train' / 'b'} (allowed: .jpg, .jpeg, .png, .gif, .bmp, .webp, "
        ".jxl; skipped there: 2 .tiff (TensorFlow cannot decode TIFF))"
    )


# --- the listing without TensorFlow --------------------------------------------------------------


def test_listing_is_bounded_by_entries_and_by_time(tmp_path: Path) -> None:
    root = tmp_path / "src"
    png = save(noise(4, 4), "PNG")
    for name in ("a", "b"):
        (root / "train" / name).mkdir(parents=True)
        for i in range(150):
            (root / "train" / name / f"{i}.png").write_bytes(png)
    listing = folders.list_folder(str(root), budget=folders.ListingBudget(entries=100, seconds=60))
    assert (listing.complete, listing.stopped) == (False, "stopped after 100 entries")
    assert not listing.problems  # what was not reached is not called a problem

    class Clock:
        now = 0.0

        def __call__(self) -> float:
            self.now += 0.01  # each look at the clock takes 10 ms
            return self.now

    listing = folders.list_folder(
        str(root), budget=folders.ListingBudget(entries=10**6, seconds=4.0, clock=Clock())
    )
    assert (listing.complete, listing.stopped) == (
        True,
        f"stopped after 4 s: {listing.files_checked} images checked",
    )
    assert not listing.problems
    assert 0 < listing.files_checked < 300
    assert sum(len(paths) for paths, _ in listing.splits.values()) == 300


@pytest.mark.serial  # timed: beside one other serial test at most (make test)
def test_the_file_system_root_and_files_are_refused_at_once(tmp_path: Path) -> None:
    start = time.monotonic()
    assert folders.list_folder("/").problems == [
        (
            "--source folder:/: / is the file system's root, not an image folder; name the folder that holds "
            f"train/ (expected {folders.FOLDER_LAYOUT})"
        )
    ]
    assert time.monotonic() - start < 1
    f = tmp_path / "x.zip"
    f.write_bytes(b"PK")
    assert folders.list_folder(str(f)).problems == [
        f"--source folder:{f}: {f} is a file, not a folder; expected {folders.FOLDER_LAYOUT}"
    ]


def test_many_unknown_top_folders_are_one_problem(tmp_path: Path) -> None:
    for name in ("bin", "etc", "lib", "opt", "usr", "var", "home"):
        (tmp_path / name).mkdir()
    problems = folders.list_folder(str(tmp_path)).problems
    assert problems == [
        (
            f"--source folder:{tmp_path}: 7 unknown split folders in {tmp_path} (bin, etc, home, lib, opt, ...); "
            f"allowed split folders: train, validation, test; is {tmp_path} the image folder? expected "
            f"{folders.FOLDER_LAYOUT}"
        ),
        f"--source folder:{tmp_path} has no train/ folder; expected {folders.FOLDER_LAYOUT}",
    ]


# --- SIGTERM ----------------------------------------------------------------------------------


@pytest.mark.serial  # timed: beside one other serial test at most (make test)
def test_sigterm_during_preparation_exits_143_and_leaves_no_staging_folder(tmp_path: Path) -> None:
    """The local job runner stops a replica with SIGTERM (then SIGKILL after a grace period).
    Python's default for SIGTERM ends the process without any `finally`: the staging folder was
    left beside the output. 1,200 copies (hard links) of a 2000x2000 JPEG keep preparation busy
    for tens of seconds here; SIGTERM goes as soon as the staging folder exists."""
    root = tmp_path / "src"
    image = root / "train" / "a" / "0.jpg"
    image.parent.mkdir(parents=True)
    pixels = ((np.indices((2000, 2000)).sum(0) // 5) % 256).astype(np.uint8)
    Image.fromarray(np.stack([pixels, pixels.T, 255 - pixels], -1)).save(image, quality=90)
    (root / "train" / "b").mkdir()
    for cls in ("a", "b"):
        for i in range(600):
            if (cls, i) != ("a", 0):
                os.link(image, root / "train" / cls / f"{i}.jpg")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainer.prepare",
            f"--source=folder:{root}",
            f"--output_dir={out}",
            "--image_size=224",
        ],
        cwd=ROOT,
        env=trainer_env({"TF_CPP_MIN_LOG_LEVEL": "2"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not glob.glob(str(tmp_path / ".out.staging-*")):
            assert proc.poll() is None, (
                f"preparation ended before it staged anything: {proc.communicate()[0]}"
            )
            assert time.monotonic() < deadline, "no staging folder after 120 s"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == P.TERMINATED_EXIT_CODE == 143, output
    assert "stopped on SIGTERM: nothing was published and no staging folder is left" in output
    assert "Traceback" not in output, output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"], output  # no output, no .out.staging-*


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_sigterm_whose_exception_python_drops_still_stops_the_next_image() -> None:
    """The cause of the lost SIGTERM: Python runs the handler between two bytecodes of whatever
    the main thread runs, and drops an exception raised inside a `__del__` (or a weakref callback,
    or C code that clears errors, as during an import). The old handler had already set SIGTERM to
    SIG_IGN, so the preparation ran on to its end. Now the signal is recorded, stays caught, and
    the next image's progress update raises."""

    class Collected:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs here, where Python drops exceptions

    with P.sigterm_unwinds():
        Collected()
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, signal.SIG_DFL)
        progress = Progress(bars=False, out=io.StringIO(), stop=P.stop_if_asked)
        with pytest.raises(P.Terminated), progress.count("train", 10) as update:
            update(1)
    P.stop_if_asked()  # outside the block the record is gone: a later preparation starts afresh


@pytest.mark.parametrize("planted", ["link", "file", "folder"])
def test_the_beam_engine_refuses_a_work_folder_it_did_not_make_and_deletes_nothing(
    tmp_path: Path, planted: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`<output>.beam-work` is the Beam engine's to resume into and remove only when it made it:
    a link there (removing through it deleted the folder it points to), a file or a folder of
    the user's is refused before any work, named, and left as it was."""

    users = tmp_path / "users"
    users.mkdir()
    (users / "keep.txt").write_text("mine")
    out = tmp_path / "dataset"
    work = Path(prepareconfig.work_dir(str(out)))
    if planted == "link":
        work.symlink_to(users)
    elif planted == "file":
        work.write_text("mine")
    else:
        (users / "keep.txt").rename(tmp_path / "keep.txt")
        users.rename(work)
        (tmp_path / "keep.txt").rename(work / "keep.txt")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    code = P.main(["--source=synthetic", f"--output_dir={out}", "--engine=beam"])
    assert code == 1 and str(work) in capsys.readouterr().err
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
    kept = work / "keep.txt" if planted == "folder" else (work if planted == "file" else users / "keep.txt")
    assert kept.read_text() == "mine"


def test_the_beam_engine_refuses_a_flag_neither_it_nor_beam_knows() -> None:
    """`--image-size=48` (a hyphen typo) was handed to Beam, which only logs what it does not
    know: the job engine refuses it, and so does the Beam engine now; Beam's own options pass."""
    base = ["--source=synthetic", "--output_dir=/tmp/x", "--engine=beam"]
    with pytest.raises(SystemExit) as exit_:
        P.parse_args([*base, "--image-size=48"])
    assert exit_.value.code == 2
    config = P.parse_args([*base, "--runner", "DirectRunner", "--temp_location=gs://b/t"])
    assert config.beam_args == ("--runner", "DirectRunner", "--temp_location=gs://b/t")


def test_beam_workers_are_bounded_by_this_machines_cpus_and_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """24 workers on 2 CPUs started 49 TensorFlow processes and reached 17 GB before the kernel
    killed them: more workers than the CPUs or the available memory hold are refused, naming both;
    0 means as many as both allow."""
    from trainer.preparation import beamrun

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    config = PrepareConfig(source="synthetic", output_dir="/tmp/x", engine="beam", beam_workers=24)
    with pytest.raises(PrepareError, match="--beam_workers 24") as err:
        beamrun.local_workers(config)
    assert "2 CPUs" in str(err.value) and "GiB available" in str(err.value)
    assert beamrun.local_workers(PrepareConfig(source="synthetic", output_dir="/tmp/x", beam_workers=0)) <= 2
    assert beamrun.local_workers(PrepareConfig(source="synthetic", output_dir="/tmp/x", beam_workers=1)) == 1


def test_a_tfds_image_of_more_than_4_channels_is_refused_before_any_work() -> None:
    import types

    import tensorflow_datasets as tfds

    from trainer.preparation.source import PrepareError
    from trainer.preparation.tfdssource import image_classification_keys

    def info(channels: int) -> Any:
        features = {
            "image": tfds.features.Image(shape=(None, None, channels)),
            "label": tfds.features.ClassLabel(num_classes=2),
        }
        return types.SimpleNamespace(features=features, supervised_keys=("image", "label"))

    assert image_classification_keys(info(2), "grey_alpha") == ("image", "label")
    with pytest.raises(PrepareError, match="multispectral"):
        image_classification_keys(info(5), "multispectral")
