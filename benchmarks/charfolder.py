"""An image folder whose classes depend on orientation, rendered here: for `make bench
BENCH=folder` and the folder test of the local run.

Eight characters, `b d p q 6 9 n u`: each is another one flipped or turned, so a model must learn
where a shape sits, and an augmentation that flips or turns the images destroys the labels (the
reason `augment=auto` is `none` for a folder). `clean`: DejaVu Sans at a few sizes and positions,
dark on light; `hard`: twelve DejaVu faces, tilted, blurred, random grey levels and pixel noise.

The fonts are those matplotlib ships (`mpl-data/fonts/ttf`): no extra dependency, and a seed gives
the same folder on every machine with the same Pillow. The layout is what `--dataset_source
folder:PATH` takes: `PATH/{train,test}/<class>/`.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL import Image

CLASSES = ("b", "d", "p", "q", "6", "9", "n", "u")
SIDE = 96
"""Pixels of each square image (the pipeline resizes to `image_size` when it prepares)."""


@dataclasses.dataclass(frozen=True)
class Variant:
    train_per_class: int
    test_per_class: int
    fonts: tuple[str, ...]
    max_tilt_degrees: float
    max_blur: float
    noise: float


_ALL_FACES = tuple(
    f"DejaVu{family}{face}.ttf"
    for family, faces in (
        ("Sans", ("", "-Bold", "-Oblique", "-BoldOblique")),
        ("Serif", ("", "-Bold", "-Italic", "-BoldItalic")),
        ("SansMono", ("", "-Bold", "-Oblique", "-BoldOblique")),
    )
    for face in faces
)
VARIANTS = {
    "clean": Variant(100, 25, ("DejaVuSans.ttf",), 0.0, 0.0, 0.0),
    "hard": Variant(64, 16, _ALL_FACES, 12.0, 1.5, 12.0),
}


def _render(char: str, font_path: Path, rng: random.Random, variant: Variant) -> Image.Image:
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    hard = variant.max_tilt_degrees > 0
    background = rng.randint(170, 255) if hard else 255
    ink = rng.randint(0, 90) if hard else 0
    image = Image.new("L", (SIDE, SIDE), background)
    font = ImageFont.truetype(str(font_path), rng.randint(44, 64))
    draw = ImageDraw.Draw(image)
    left, top, right, bottom = draw.textbbox((0, 0), char, font=font)
    width, height = int(right - left), int(bottom - top)
    # Anywhere the whole character fits with a margin of 4 pixels.
    x = rng.randint(4, max(4, SIDE - 4 - width)) - int(left)
    y = rng.randint(4, max(4, SIDE - 4 - height)) - int(top)
    draw.text((x, y), char, fill=ink, font=font)
    if hard:
        angle = rng.uniform(-variant.max_tilt_degrees, variant.max_tilt_degrees)
        image = image.rotate(angle, resample=Image.Resampling.BILINEAR, fillcolor=background)
        image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0.0, variant.max_blur)))
        pixels: Any = image.load()  # an "L" image: one int per pixel
        for i, j in itertools.product(range(SIDE), repeat=2):
            pixels[i, j] = int(min(255, max(0, pixels[i, j] + rng.gauss(0.0, variant.noise))))
    return image.convert("RGB")


def render(root: Path, variant: str, seed: int = 0, per_class: tuple[int, int] | None = None) -> Path:
    """Writes the folder `root` (`train/<class>/NNN.png`, `test/<class>/NNN.png`) and returns it.
    `per_class` (training, test) replaces the variant's counts (a smaller folder for tests).
    Refuses a `root` that already has files: it never mixes two renderings."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    spec = VARIANTS[variant]
    if per_class is not None:
        spec = dataclasses.replace(spec, train_per_class=per_class[0], test_per_class=per_class[1])
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty: render into a new folder")
    import matplotlib

    fonts = [Path(matplotlib.get_data_path()) / "fonts" / "ttf" / name for name in spec.fonts]
    missing = [str(f) for f in fonts if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"matplotlib's DejaVu fonts are missing: {', '.join(missing)}")
    rng = random.Random(f"{variant}-{seed}")
    for split, count in (("train", spec.train_per_class), ("test", spec.test_per_class)):
        for char in CLASSES:
            folder = root / split / char
            folder.mkdir(parents=True)
            for n in range(count):
                image = _render(char, rng.choice(fonts), rng, spec)
                image.save(folder / f"{char}-{n:03d}.png")
    return root
