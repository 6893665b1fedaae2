"""A small, learnable, leaf-like image set in the cassava archive's layout.

`cassavaleafdata/{train,validation,test}/{cbb,cbsd,cgm,cmd,healthy}/<split>-<class>-<i>.jpg`,
read by the real TFDS `cassava` builder as in production. Classes differ by colour and texture,
as the real diseases do, so a small model reaches high accuracy in a few epochs.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

CASSAVA_CLASSES = ("cbb", "cbsd", "cgm", "cmd", "healthy")
ARCHIVE_FOLDER = "cassavaleafdata"


def _smooth_noise(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """Low-frequency noise in [0, 1]: a random (cells+1)^2 grid, bilinearly upsampled."""
    grid = rng.random((cells + 1, cells + 1))
    pos = np.linspace(0, cells, size, endpoint=False)
    i = pos.astype(int)
    f = pos - i
    rows = grid[i] * (1 - f)[:, None] + grid[i + 1] * f[:, None]
    return rows[:, i] * (1 - f)[None, :] + rows[:, i + 1] * f[None, :]


def _leaf_mask(rng: np.random.Generator, size: int) -> np.ndarray:
    """A palmate leaf: 5 to 7 elongated lobes radiating from a common centre."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    cy, cx = 0.5 + rng.uniform(-0.08, 0.08, 2)
    base = rng.uniform(0, 2 * np.pi)
    mask = np.zeros((size, size), bool)
    lobes = int(rng.integers(5, 8))
    for k in range(lobes):
        angle = base + 2 * np.pi * k / lobes + rng.uniform(-0.15, 0.15)
        length, width = rng.uniform(0.28, 0.42), rng.uniform(0.08, 0.12)
        dy, dx = yy - cy, xx - cx
        along = dx * np.cos(angle) + dy * np.sin(angle)
        across = -dx * np.sin(angle) + dy * np.cos(angle)
        mask |= ((along - length / 2) / (length / 2)) ** 2 + (across / width) ** 2 <= 1
    return mask


GREEN, PALE, YELLOW, BROWN, DARK = np.array(
    [(46, 125, 50), (150, 175, 90), (215, 205, 70), (125, 80, 35), (55, 40, 25)], np.float32
)


def _paint_healthy(rng: np.random.Generator, size: int) -> np.ndarray:
    return GREEN * (0.9 + 0.2 * _smooth_noise(rng, size, 3))[..., None]


def _paint_cmd(rng: np.random.Generator, size: int) -> np.ndarray:
    out = np.where((_smooth_noise(rng, size, 8) > 0.55)[..., None], YELLOW, GREEN)
    return out * (0.9 + 0.2 * _smooth_noise(rng, size, 3))[..., None]


def _paint_cbsd(rng: np.random.Generator, size: int) -> np.ndarray:
    angle = rng.uniform(0, np.pi)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    phase = (xx * np.cos(angle) + yy * np.sin(angle)) * rng.uniform(5, 8) + rng.uniform(0, 1)
    return np.where((phase % 1.0 < 0.35)[..., None], BROWN, GREEN)  # streaks


def _paint_cbb(rng: np.random.Generator, size: int) -> np.ndarray:
    out = np.broadcast_to(GREEN, (size, size, 3)).copy()
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    for _ in range(int(rng.integers(6, 11))):
        cy, cx = rng.uniform(0.2, 0.8, 2)
        half = rng.uniform(0.04, 0.09)
        # Angular (square-ish, rotated) water-soaked spots.
        a = rng.uniform(0, np.pi / 2)
        u = np.abs((xx - cx) * np.cos(a) + (yy - cy) * np.sin(a))
        v = np.abs(-(xx - cx) * np.sin(a) + (yy - cy) * np.cos(a))
        out[(u < half) & (v < half)] = DARK
    return out


def _paint_cgm(rng: np.random.Generator, size: int) -> np.ndarray:
    out = PALE * (0.9 + 0.2 * _smooth_noise(rng, size, 3))[..., None]
    out[rng.random((size, size)) < 0.06] = 235  # speckles
    return out


PAINTERS: dict[str, Callable[[np.random.Generator, int], np.ndarray]] = {
    "cbb": _paint_cbb,
    "cbsd": _paint_cbsd,
    "cgm": _paint_cgm,
    "cmd": _paint_cmd,
    "healthy": _paint_healthy,
}


def make_image(rng: np.random.Generator, class_name: str, size: int) -> np.ndarray:
    """One uint8 [size, size, 3] leaf of `class_name` on a soil background."""
    soil = np.array((110, 85, 60), np.float32) * (0.7 + 0.5 * _smooth_noise(rng, size, 6))[..., None]
    image = np.where(_leaf_mask(rng, size)[..., None], PAINTERS[class_name](rng, size), soil)
    image = image * rng.uniform(0.85, 1.15) + rng.normal(0, 6, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def split_counts(per_class: int) -> dict[str, int]:
    """Images per class in each split for `per_class` training images per class."""
    held_out = max(2, per_class // 3)
    return {"train": per_class, "validation": held_out, "test": held_out}


def write_archive(
    root: str,
    *,
    per_class: int,
    image_size: int,
    seed: int,
    progress: Callable[[int], None],
) -> str:
    """Writes the archive tree under `root`; returns `root` (what download_and_extract gives)."""
    # Here, not at the top: make_image is numpy-only, and `python -m trainer.serve` uses it under
    # the serving check's TensorFlow, which has no tf_keras.
    from trainer._tf import tf

    rng = np.random.default_rng(seed)
    for split, count in split_counts(per_class).items():
        for class_name in CASSAVA_CLASSES:
            folder = os.path.join(root, ARCHIVE_FOLDER, split, class_name)
            os.makedirs(folder, exist_ok=True)
            for i in range(count):
                jpeg = tf.io.encode_jpeg(make_image(rng, class_name, image_size), quality=92)
                tf.io.write_file(os.path.join(folder, f"{split}-{class_name}-{i}.jpg"), jpeg)
                progress(1)
    return root
