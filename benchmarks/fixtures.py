"""The data the benchmarks share, built once and cached in `WORK_DIR` (git-ignored).

1. A cassava-like archive: synthetic leaves (`trainer.synthetic`) at cassava's typical
   resolution (500x500 and 500x375 JPEGs, alternately) in the real archive's layout.
2. That archive prepared by the real TFDS `cassava` builder, offline, exactly as
   `trainer.prepare` prepares its synthetic source (docs/facts.md, fact 17): a TFDS data folder
   where `tfds.load('cassava', data_dir=...)` runs unchanged. The codelab's pipeline reads it.
3. Our prepared dataset (`trainer.prepare --source tfds:cassava`) from that same TFDS folder,
   at a given image size: what our input pipeline reads. Same images, same labels.

Nothing is downloaded. Building happens in child processes (TensorFlow is imported there).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from benchmarks.common import WORK_DIR, run_child, say
from trainer.synthetic import ARCHIVE_FOLDER, CASSAVA_CLASSES  # numpy only, no TensorFlow

SPLIT_FOLDERS = ("train", "validation", "test")
NUM_CLASSES = len(CASSAVA_CLASSES)


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """The cassava-like source: `train_per_class` x 5 training images."""

    train_per_class: int = 200
    heldout_per_class: int = 20  # validation and test images per class (TFDS's cassava needs every split)
    width: int = 500
    heights: tuple[int, ...] = (500, 375)  # cassava's typical 500x500 and 500x375 (W x H), alternately
    seed: int = 2024

    @property
    def train_images(self) -> int:
        return self.train_per_class * NUM_CLASSES

    def key(self) -> str:
        return hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()[:12]


@dataclasses.dataclass(frozen=True)
class CassavaSource:
    spec: SourceSpec
    archive: Path  # holds cassavaleafdata/<split>/<class>/*.jpg (folder:PATH: archive / ARCHIVE_FOLDER)
    tfds_dir: Path  # a TFDS data folder where `cassava` is prepared


def built(folder: Path, params: dict[str, Any], what: str, *steps: tuple[str, dict[str, Any], Path]) -> None:
    """Builds `folder` with the child processes `steps` (target, kwargs, log) unless its DONE.json
    says it was built with `params`; a stale or half-built folder is removed first."""
    marker = folder / "DONE.json"
    params = json.loads(json.dumps(params))  # tuples become lists, as in the file
    if marker.exists() and json.loads(marker.read_text(encoding="utf-8")) == params:
        return
    shutil.rmtree(folder, ignore_errors=True)
    say(f"{what} in {folder} (once; cached)")
    folder.mkdir(parents=True)
    for target, kwargs, log in steps:
        run_child(target, kwargs, log=log)
    marker.write_text(json.dumps(params, sort_keys=True), encoding="utf-8")


def cassava_source(spec: SourceSpec | None = None, work: Path = WORK_DIR) -> CassavaSource:
    """The archive and its TFDS preparation, built unless already cached."""
    spec = spec or SourceSpec()
    folder, logs = work / f"cassava-{spec.key()}", work / "logs"
    source = CassavaSource(spec, folder / "download", folder / "tfds")
    archive = {"root": str(source.archive), **dataclasses.asdict(spec)}
    tfds = {"archive": str(source.archive), "data_dir": str(source.tfds_dir)}
    built(
        folder,
        {"spec": dataclasses.asdict(spec), "version": 1},
        "building the cassava-like source",
        ("benchmarks.fixtures:build_archive", archive, logs / "fixtures.log"),
        ("benchmarks.fixtures:build_tfds", tfds, logs / "fixtures-tfds.log"),
    )
    return source


def prepared(source: CassavaSource, image_size: int, work: Path = WORK_DIR) -> Path:
    """Our prepared dataset (raw uint8, 32 shards) of `source` at `image_size`."""
    folder = work / f"prepared-{source.spec.key()}-{image_size}"
    kwargs = {"tfds_dir": str(source.tfds_dir), "output_dir": str(folder / "data"), "image_size": image_size}
    built(
        folder,
        {"spec": dataclasses.asdict(source.spec), "image_size": image_size, "version": 1},
        f"preparing our dataset at {image_size}px",
        ("benchmarks.fixtures:build_prepared", kwargs, work / "logs" / f"fixtures-prepared-{image_size}.log"),
    )
    return folder / "data"


# --- run in child processes -----------------------------------------------------------------


def _write_images(jobs: list[tuple[str, str, int, list[int]]], width: int) -> int:
    import numpy as np

    from trainer import synthetic
    from trainer._tf import tf

    for path, class_name, height, seed in jobs:
        rng = np.random.default_rng(seed)  # one generator per image: any worker, same pixels
        image = synthetic.make_image(rng, class_name, width)
        top = (width - height) // 2
        image = image[top : top + height]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(tf.io.encode_jpeg(image, quality=92).numpy())
    return len(jobs)


def build_archive(
    root: str,
    train_per_class: int,
    heldout_per_class: int,
    width: int,
    heights: list[int],
    seed: int,
) -> dict[str, Any]:
    """Writes the archive tree, one image generator process per CPU."""
    import concurrent.futures
    import multiprocessing

    jobs = []
    for s, split in enumerate(SPLIT_FOLDERS):
        count = train_per_class if split == "train" else heldout_per_class
        for c, class_name in enumerate(CASSAVA_CLASSES):
            folder = os.path.join(root, ARCHIVE_FOLDER, split, class_name)
            for i in range(count):
                # File names are unique per split, as the cassava builder needs.
                path = os.path.join(folder, f"{split}-{class_name}-{i}.jpg")
                jobs.append((path, class_name, heights[i % len(heights)], [seed, s, c, i]))
    workers = max(1, min(len(os.sched_getaffinity(0)), 8))
    chunks = [jobs[i::workers] for i in range(workers)]
    context = multiprocessing.get_context("spawn")  # no fork after TensorFlow threads exist
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        return {"images": sum(pool.map(_write_images, chunks, [width] * len(chunks)))}


def build_tfds(archive: str, data_dir: str) -> dict[str, Any]:
    """Prepares `cassava` from the local archive with TFDS's own builder (no download)."""
    import tempfile

    import tensorflow_datasets as tfds

    from trainer.preparation.localarchive import local_archive

    builder = tfds.builder("cassava", data_dir=data_dir)
    with tempfile.TemporaryDirectory() as scratch, local_archive(builder, archive, scratch):
        builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    return {"splits": {name: split.num_examples for name, split in builder.info.splits.items()}}


def build_prepared(tfds_dir: str, output_dir: str, image_size: int) -> dict[str, Any]:
    from trainer.prepare import PrepareConfig, prepare

    config = PrepareConfig(
        source="tfds:cassava", output_dir=output_dir, image_size=image_size, tfds_data_dir=tfds_dir
    )
    return {"splits": {name: split["count"] for name, split in prepare(config)["splits"].items()}}
