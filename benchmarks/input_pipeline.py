"""`input`: images per second through our training input pipeline versus the codelab's.

Both read the same 1,000 cassava-like training images (500x500 and 500x375 JPEGs):
- codelab: `tfds.load('cassava')` of the full-size JPEGs; every epoch decodes each JPEG,
  resizes it to 300 and casts it to float32/255 in a `map`, then `shuffle(1000)`, batch,
  prefetch, DATA sharding (`codelab.create_dataset`, unchanged);
- ours: `trainer.data.make_dataset` over the same images prepared once by `trainer.prepare`
  (300x300 uint8 TFRecords; the one-off preparation is measured by the `prepare` benchmark).

Each side runs in its own process for 3 epochs at batch 64, consuming every batch, and
reports images delivered per second (first batch to last, shuffle-buffer fill included) and
its peak resident memory. The sides alternate, `REPEATS` times (`common.alternate`); the best
run of each counts, every run is kept in the result.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

from benchmarks import fixtures
from benchmarks.common import alternate, busy_note, make_result, rss_self_mib

NAME = "input"
IMAGE_SIZE = 300
BATCH_SIZE = 64
EPOCHS = 3
REPEATS = 2
GOAL: dict[str, Any] = {
    "description": ">= 5x the codelab pipeline's images/s, with no more peak memory",
    "min_ratio": 5.0,
    "max_peak_memory_ratio": 1.0,
}


def run(work: Path, results_dir: Path) -> dict[str, Any]:
    source = fixtures.cassava_source(work=work)
    ours_dir = fixtures.prepared(source, IMAGE_SIZE, work)
    common = {"batch_size": BATCH_SIZE, "epochs": EPOCHS}
    sides = {
        "codelab": (
            "benchmarks.input_pipeline:measure_codelab",
            {"data_dir": str(source.tfds_dir), "image_size": IMAGE_SIZE, **common},
        ),
        "ours": ("benchmarks.input_pipeline:measure_ours", {"data_dir": str(ours_dir), **common}),
    }
    runs = alternate(NAME, sides, REPEATS, work)
    rate = {side: max(f["images_per_second"] for f in r) for side, r in runs.items()}  # best: least disturbed
    peak = {side: max(f["peak_rss_mib"] for f in r) for side, r in runs.items()}
    ratio = rate["ours"] / rate["codelab"]
    memory_ratio = peak["ours"] / peak["codelab"]
    goal_met = ratio >= GOAL["min_ratio"] and memory_ratio <= GOAL["max_peak_memory_ratio"]
    return make_result(
        NAME,
        inputs={
            "train_images": source.spec.train_images,
            "source_image_sizes_wxh": [f"{source.spec.width}x{h}" for h in source.spec.heights],
            "image_size": IMAGE_SIZE,
            "batch_size": BATCH_SIZE,
            "epochs": EPOCHS,
            "repeats": REPEATS,
            "ours_prepared_encoding": "raw uint8",
        },
        figures={
            "images_per_second": rate,
            "peak_rss_mib": peak,
            "peak_memory_ratio": round(memory_ratio, 3),
            "runs": runs,
        },
        ratio=ratio,
        goal=GOAL,
        goal_met=goal_met,
        notes=busy_note(r for side_runs in runs.values() for r in side_runs),
        summary=(
            f"ours {rate['ours']:,.0f} img/s vs codelab {rate['codelab']:,.0f} img/s; "
            f"peak RSS {peak['ours']:,.0f} vs {peak['codelab']:,.0f} MiB"
        ),
    )


# --- run in child processes -----------------------------------------------------------------


def consume(batches: Any, epochs: int, steps: int | None) -> dict[str, Any]:
    """Pulls every batch of `epochs` epochs (`steps` per epoch from one repeating iterator, or
    each pass of a finite dataset); returns the figures."""
    from trainer._tf import tf

    per_epoch, images = [], 0
    started = time.perf_counter()
    iterator = iter(batches) if steps is not None else None
    for _ in range(epochs):
        epoch_start, epoch_images = time.perf_counter(), 0
        for x, _y in itertools.islice(iterator, steps) if iterator is not None else batches:
            epoch_images += int(tf.shape(x)[0])
        per_epoch.append({"images": epoch_images, "seconds": round(time.perf_counter() - epoch_start, 3)})
        images += epoch_images
    seconds = time.perf_counter() - started
    return {
        "images": images,
        "seconds": round(seconds, 3),
        "images_per_second": round(images / seconds, 1),
        "epochs": per_epoch,
    }


def measure_codelab(data_dir: str, image_size: int, batch_size: int, epochs: int) -> dict[str, Any]:
    from benchmarks import codelab

    rss_before = rss_self_mib()
    ds, _ = codelab.create_dataset(batch_size, data_dir=data_dir, image_size=image_size)
    return {**consume(ds, epochs, steps=None), "rss_after_import_mib": rss_before}


def measure_ours(data_dir: str, batch_size: int, epochs: int) -> dict[str, Any]:
    from trainer import data, datasetinfo

    rss_before = rss_self_mib()
    meta = datasetinfo.load_metadata(data_dir)
    ds = data.make_dataset(data_dir, meta, "train", batch_size=batch_size, training=True)
    figures = consume(ds, epochs, steps=data.steps_per_epoch(meta, batch_size))
    return {**figures, "rss_after_import_mib": rss_before}
