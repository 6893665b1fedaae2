"""`memory`: peak memory of the training input pipeline while the dataset grows 10x past its
cache budget, streamed versus cached.

`trainer.data.make_dataset` caches a split decoded only when it fits the cache budget
(`trainer.data.plan_cache`), else streams it from the shards with a shuffle buffer sized to the
budget (`trainer.data.STREAM_BUFFER_FACTOR`). The budget here is 64 MiB, small enough for 2 cores:

- datasets of 1x, 3x and 10x the budget's worth of 300 px training images (1x: the smallest that
  does not fit, 249 images), synthesized as prepared raw-uint8 TFRecords (`trainer.prepare`'s
  shard writer and format, 32 shards, random pixels);
- streamed: each under the 64 MiB budget (the pipeline's own decision);
- cached (the baseline): the 1x and 10x datasets with the budget raised so that they are cached.

Each run (`common.alternate`) pulls 160 batches of 32 (seed 0), timed from creating the iterator
(cache and shuffle-buffer fill included); the best images/s and highest peak RSS of each side
count. The shards are read from the page cache: Cloud Storage would cost the streamed side more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import fixtures
from benchmarks.common import MIB, alternate, busy_note, make_result, rss_self_mib
from benchmarks.input_pipeline import consume

NAME = "memory"
IMAGE_SIZE = 300
BUDGET_MIB = 64
MULTIPLES = (1, 3, 10)
SHARDS = 32
BATCH_SIZE = 32
BATCHES = 160
REPEATS = 2
CACHED_BUDGET_MIB = 4096
"""The budget the cached runs get: more than the 10x dataset needs."""
FLAT_TOLERANCE_MIB = 32
"""Streamed peak RSS at 3x and 10x may exceed 1x's by half the budget (the data grows by 578 MiB).
Runs of one side differ by up to about 30 MiB (glibc's arenas), so a lower peak at 10x is no failure."""
EXAMPLE_BYTES = IMAGE_SIZE * IMAGE_SIZE * 3 + 256
"""`trainer.data.example_bytes` at 300 px (not imported here: it loads TensorFlow)."""
GOAL: dict[str, Any] = {
    "description": (
        f"streamed peak RSS flat (at most {FLAT_TOLERANCE_MIB} MiB above its 1x figure) while the "
        "dataset grows from 1x to 10x the cache budget"
    ),
    "flat_tolerance_mib": FLAT_TOLERANCE_MIB,
    "images_per_second": "reported (ratio: streamed at 10x / cached at 1x)",
}


def images_for(multiple: int) -> int:
    """1x: the smallest training split whose decoded size exceeds the budget."""
    return multiple * (BUDGET_MIB * MIB // EXAMPLE_BYTES + 1)


def dataset(work: Path, train_images: int) -> Path:
    folder = work / f"memory-{IMAGE_SIZE}px-{train_images}"
    kwargs = {"output_dir": str(folder / "data"), "train_images": train_images, "image_size": IMAGE_SIZE}
    fixtures.built(
        folder,
        {"train_images": train_images, "image_size": IMAGE_SIZE, "shards": SHARDS, "version": 2},
        f"synthesizing {train_images:,} prepared {IMAGE_SIZE}px images",
        ("benchmarks.memory:synthesize", kwargs, work / "logs" / f"memory-synthesize-{train_images}.log"),
    )
    return folder / "data"


SIDES = {
    "cached_1x": (1, CACHED_BUDGET_MIB),
    **{f"streamed_{m}x": (m, BUDGET_MIB) for m in MULTIPLES},
    "cached_10x": (10, CACHED_BUDGET_MIB),
}
"""Each side's dataset (a multiple of the budget) and cache budget."""


def run(work: Path, results_dir: Path) -> dict[str, Any]:
    dirs = {m: dataset(work, images_for(m)) for m in MULTIPLES}
    sides = {
        name: (
            "benchmarks.memory:measure",
            {
                "data_dir": str(dirs[multiple]),
                "budget_bytes": budget * MIB,
                "batch_size": BATCH_SIZE,
                "batches": BATCHES,
                "expect_cache": budget == CACHED_BUDGET_MIB,
            },
        )
        for name, (multiple, budget) in SIDES.items()
    }
    runs = alternate(NAME, sides, REPEATS, work)
    rate = {name: max(f["images_per_second"] for f in r) for name, r in runs.items()}  # best: least disturbed
    peak = {name: max(f["peak_rss_mib"] for f in r) for name, r in runs.items()}
    baseline = min(f["rss_after_import_mib"] for r in runs.values() for f in r)
    streamed = [f"streamed_{m}x" for m in MULTIPLES]
    growth = peak["streamed_10x"] - peak["streamed_1x"]
    spread = max(peak[s] for s in streamed) - min(peak[s] for s in streamed)
    flat = max(peak["streamed_3x"], peak["streamed_10x"]) - peak["streamed_1x"] <= FLAT_TOLERANCE_MIB
    ratios = {s: round(rate[s] / rate["cached_1x"], 3) for s in streamed}
    return make_result(
        NAME,
        inputs={
            "budget_mib": BUDGET_MIB,
            "image_size": IMAGE_SIZE,
            "example_bytes": EXAMPLE_BYTES,
            "train_images": {f"{m}x": images_for(m) for m in MULTIPLES},
            "decoded_mib": {f"{m}x": round(images_for(m) * EXAMPLE_BYTES / MIB, 1) for m in MULTIPLES},
            "shards": SHARDS,
            "encoding": "raw uint8",
            "batch_size": BATCH_SIZE,
            "batches": BATCHES,
            "repeats": REPEATS,
            "cached_budget_mib": CACHED_BUDGET_MIB,
        },
        figures={
            "peak_rss_mib": peak,
            "peak_rss_above_import_mib": {k: round(v - baseline, 1) for k, v in peak.items()},
            "rss_after_import_mib": baseline,
            "streamed_peak_growth_1x_to_10x_mib": round(growth, 1),
            "cached_peak_growth_1x_to_10x_mib": round(peak["cached_10x"] - peak["cached_1x"], 1),
            "streamed_peak_spread_mib": round(spread, 1),
            "images_per_second": rate,
            "images_per_second_ratio_to_cached_1x": ratios,
            "runs": runs,
        },
        ratio=ratios["streamed_10x"],
        goal=GOAL,
        goal_met=flat,
        notes=busy_note(r for side_runs in runs.values() for r in side_runs),
        summary=(
            f"streamed peak RSS {peak['streamed_1x']:,.0f} / {peak['streamed_3x']:,.0f} / "
            f"{peak['streamed_10x']:,.0f} MiB at 1x/3x/10x a {BUDGET_MIB} MiB budget vs cached "
            f"{peak['cached_1x']:,.0f} MiB (1x), {peak['cached_10x']:,.0f} MiB (10x); "
            f"streamed 10x {rate['streamed_10x']:,.0f} img/s vs cached 1x {rate['cached_1x']:,.0f} img/s"
        ),
    )


# --- run in child processes -----------------------------------------------------------------


def synthesize(output_dir: str, train_images: int, image_size: int) -> dict[str, Any]:
    """A prepared dataset as `trainer.prepare` writes it, random pixels: `train_images` training
    images, 8 each for validation and test, 5 classes in turn."""
    import os

    import numpy as np

    from trainer import images
    from trainer._tf import tf
    from trainer.preparation.prepareconfig import PrepareConfig
    from trainer.preparation.shards import ShardWriter, dataset_metadata, example_record, write_metadata

    os.makedirs(output_dir)
    config = PrepareConfig(
        source="benchmarks.memory", output_dir=output_dir, image_size=image_size, seed=2024
    )
    rng = np.random.default_rng(config.seed)
    classes = ["a", "b", "c", "d", "e"]
    splits = {}
    for split, count in (("train", train_images), ("validation", 8), ("test", 8)):
        writer = ShardWriter(output_dir, split, count, SHARDS)
        for i in range(count):
            pixels = rng.integers(0, 256, (image_size, image_size, 3), dtype=np.uint8)
            writer.write(example_record(images.encode(tf.constant(pixels), "raw").numpy(), i % len(classes)))
        writer.close()
        splits[split] = (writer.manifest, [len(range(c, count, len(classes))) for c in range(len(classes))])
    write_metadata(output_dir, dataset_metadata(config, {"generator": "random pixels"}, classes, splits, {}))
    return {"train_images": train_images}


def measure(
    data_dir: str, budget_bytes: int, batch_size: int, batches: int, expect_cache: bool
) -> dict[str, Any]:
    """Images per second of `batches` (an even number) training batches, and of their second half
    (`input_pipeline.consume`: two halves of one stream); refuses a side whose split the pipeline
    does not cache (or streams) as `expect_cache` says."""
    from trainer import data, datasetinfo

    rss_after_import = rss_self_mib()
    meta = datasetinfo.load_metadata(data_dir)
    lines: list[str] = []
    budget = data.CacheBudget(budget_bytes, "benchmark")
    ds = data.make_dataset(
        data_dir, meta, "train", batch_size=batch_size, training=True, seed=0, budget=budget, log=lines.append
    )
    plan = data.plan_cache(meta, budget)["train"]
    if plan.cache != expect_cache:
        raise RuntimeError(f"expected cached={expect_cache}: {lines[0]}")
    figures = consume(ds, 2, steps=batches // 2)
    second_half = figures.pop("epochs")[1]
    return {
        "cached": plan.cache,
        "shuffle_buffer": plan.shuffle_buffer,
        "train_images": plan.examples,
        "plan": lines[0],
        **figures,
        "second_half_images_per_second": round(second_half["images"] / second_half["seconds"], 1),
        "rss_after_import_mib": rss_after_import,
        "rss_at_end_mib": rss_self_mib(),
    }
