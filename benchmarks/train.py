"""`train`: training images per second on this CPU, ours versus the codelab-style trainer.

ResNet50 (random weights, every layer trained, as in the codelab), 64x64 images, batch 32, both
sides reading the same 1,000 cassava-like JPEGs:
- codelab: `codelab.create_dataset` (decode + resize + float32/255 every epoch, shuffle 1000)
  and `codelab.create_model` under `MultiWorkerMirroredStrategy()`, as the codelab's `main()`;
- ours: `trainer.data.make_dataset` over the prepared uint8 images and `common.ours_resnet50`,
  the exact pieces `trainer.task.run` uses, with the trainer's defaults (augmentation, dropout).
  Variants: `ours` (float32, the trainer's default), `ours_bf16` (`--mixed_precision true`,
  which is mixed_bfloat16 on a CPU) and `ours_malloc` (`ours` with TensorFlow's default host
  allocator, malloc: the baseline of the BFC one trainer._tf sets on a machine without a GPU,
  docs/facts.md, fact 39; never the headline). `--xla true` is not measured: on this CPU it
  made training about 4x slower (see BENCHMARKS.md).

Each run, in its own process, fits as its trainer does, timed (`clock.fit_timed`): the codelab's
whole second epoch (a fresh pass of its pipeline: every JPEG decoded again), and ours one
epoch's worth of steps after `WARMUP_STEPS` steps (its cache still filling: conservative for ours). The sides alternate, `REPEATS` times (`common.alternate`);
the best run of each counts. The headline ratio is our fastest variant over the codelab.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import fixtures
from benchmarks.clock import fit_timed
from benchmarks.common import alternate, busy_note, make_result, ours_resnet50, rss_self_mib

NAME = "train"
IMAGE_SIZE = 64
BATCH_SIZE = 32
WARMUP_STEPS = 3
REPEATS = 2
VARIANTS: dict[str, dict[str, Any]] = {
    "ours": {"mixed_precision": False, "xla": False},
    "ours_bf16": {"mixed_precision": True, "xla": False},
    "ours_malloc": {"mixed_precision": False, "xla": False},
}
VARIANT_ENV = {"ours_malloc": {"TF_CPU_ALLOCATOR_USE_BFC": "false"}}
GOAL = {"description": "none set (the issue's goals are for input and gpu); reported for tracking"}


def run(work: Path, results_dir: Path) -> dict[str, Any]:
    source = fixtures.cassava_source(work=work)
    ours_dir = fixtures.prepared(source, IMAGE_SIZE, work)
    common = {"image_size": IMAGE_SIZE, "batch_size": BATCH_SIZE}
    sides: dict[str, tuple[str, dict[str, Any]]] = {
        "codelab": ("benchmarks.train:measure_codelab", {"data_dir": str(source.tfds_dir), **common}),
        **{
            name: (
                "benchmarks.train:measure_ours",
                {"data_dir": str(ours_dir), **common, "warmup_steps": WARMUP_STEPS, **flags},
            )
            for name, flags in VARIANTS.items()
        },
    }
    runs = alternate(NAME, sides, REPEATS, work, env=VARIANT_ENV)

    rate = {side: max(f["images_per_second"] for f in r) for side, r in runs.items()}  # best: least disturbed
    fastest = max((v for v in VARIANTS if v not in VARIANT_ENV), key=lambda v: rate[v])
    ratio = rate[fastest] / rate["codelab"]
    return make_result(
        NAME,
        inputs={
            "backbone": "resnet50",
            "weights": None,
            "trained_layers": "all",
            "train_images": source.spec.train_images,
            "image_size": IMAGE_SIZE,
            "batch_size": BATCH_SIZE,
            "warmup": f"codelab: one whole epoch (its last batch is partial); ours: {WARMUP_STEPS} steps",
            "measured": "one epoch's worth of steps after the warm-up, within the same fit",
            "repeats": REPEATS,
            "variants": VARIANTS,
        },
        figures={
            "images_per_second": rate,
            "fastest_ours": fastest,
            "bfc_over_malloc": round(rate["ours"] / rate["ours_malloc"], 3),
            "runs": runs,
        },
        ratio=ratio,
        goal=GOAL,
        goal_met=None,
        notes=busy_note(r for side_runs in runs.values() for r in side_runs),
        summary=(
            f"ours {rate['ours']:,.1f} img/s (float32), {rate['ours_bf16']:,.1f} img/s (--mixed_precision, "
            f"bfloat16) vs codelab {rate['codelab']:,.1f} img/s (ResNet50, {IMAGE_SIZE}px, batch "
            f"{BATCH_SIZE}, CPU); ratio: {fastest}; ours with malloc instead of BFC "
            f"{rate['ours_malloc']:,.1f} img/s"
        ),
    )


# --- run in child processes -----------------------------------------------------------------


def measure_codelab(data_dir: str, image_size: int, batch_size: int) -> dict[str, Any]:
    import tensorflow_datasets as tfds

    from benchmarks import codelab
    from trainer._tf import tf

    rss_before = rss_self_mib()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    train_data, number_of_classes = codelab.create_dataset(
        batch_size, data_dir=data_dir, image_size=image_size
    )
    with strategy.scope():
        model = codelab.create_model(number_of_classes)
    figures = fit_timed(model, train_data, warmup_steps=None)
    images = int(tfds.builder("cassava", data_dir=data_dir).info.splits["train"].num_examples)  # one epoch
    return {
        **figures,
        "images_per_second": round(images / figures["timed_seconds"], 2),
        "timed_images": images,
        "rss_after_import_mib": rss_before,
    }


def measure_ours(
    data_dir: str, image_size: int, batch_size: int, warmup_steps: int, mixed_precision: bool, xla: bool
) -> dict[str, Any]:
    from trainer import data, datasetinfo

    rss_before = rss_self_mib()
    meta = datasetinfo.load_metadata(data_dir)
    model, strategy, precision = ours_resnet50(image_size, batch_size, meta.num_classes, mixed_precision, xla)
    global_batch = batch_size * strategy.num_replicas_in_sync
    ds = data.make_dataset(data_dir, meta, "train", batch_size=global_batch, training=True)
    steps = data.steps_per_epoch(meta, global_batch)
    figures = fit_timed(model, ds, warmup_steps=warmup_steps, steps=steps, ours_batch_size=global_batch)
    images = figures["timed_steps"] * global_batch
    return {
        **figures,
        "images_per_second": round(images / figures["timed_seconds"], 2),
        "timed_images": images,
        "precision": precision,
        "rss_after_import_mib": rss_before,
    }
