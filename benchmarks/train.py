"""`train`: training images per second on this CPU, ours versus the codelab-style trainer.

A small configuration, so that it finishes in minutes on 2 cores: ResNet50 (random weights,
every layer trained, as the codelab trains every layer), 64x64 images, batch 32, both sides
reading the same 1,000 cassava-like JPEGs:
- codelab: `codelab.create_dataset` (decode + resize + float32/255 every epoch, shuffle 1000)
  and `codelab.create_model` under `MultiWorkerMirroredStrategy()`, as the codelab's `main()`;
- ours: `trainer.data.make_dataset` over the prepared uint8 images and
  `trainer.model.build_model`/`compile_model` under `trainer.distribute.create_strategy`, the
  exact pieces `trainer.task.run` uses, with the trainer's defaults (augmentation, dropout).
  Variants: `ours` (float32, the trainer's default), `ours_bf16` (`--mixed_precision true`,
  which is mixed_bfloat16 on a CPU) and `ours_malloc` (`ours` with TensorFlow's default host
  allocator, malloc: the baseline of the BFC one trainer._tf sets on a machine without a GPU,
  docs/facts.md, fact 39; never the headline). `--xla true` is not measured: on this CPU it
  made training about 4x slower (12 vs 47 img/s, see BENCHMARKS.md) and took minutes.

Each run, in its own process, fits as its trainer does (`_train`), timed by
`clock.make_clock`: the codelab's whole second epoch (the first one traces, its last partial
batch included; the second is a fresh pass of its pipeline: shuffle buffer refilled, every JPEG
decoded again), and ours one epoch's worth of steps after `WARMUP_STEPS` steps (its in-memory
cache still filling from the TFRecords: conservative for ours). The sides alternate, `REPEATS`
times; the best run of each counts. The headline ratio is our fastest variant over the codelab.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import fixtures
from benchmarks.common import best, busy_note, make_result, run_child, say

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
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for repeat in range(REPEATS):
        for side, (target, kwargs) in sides.items():
            log = work / "logs" / f"train-{side}-{repeat}.log"
            child = run_child(target, kwargs, log=log, env=VARIANT_ENV.get(side))
            runs[side].append(child.merged())
            say(
                f"train {side} run {repeat + 1}/{REPEATS}: "
                f"{child.figures['images_per_second']:,.1f} img/s (timed epoch)"
            )

    rate = {side: best(r, "images_per_second") for side, r in runs.items()}
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


def _train(
    model: Any, dataset: Any, *, warmup_steps: int | None, steps: int, batch_size: int | None
) -> dict[str, Any]:
    """One fit, timed by `clock.make_clock`: `warmup_steps` then `steps` timed steps (ours:
    `trainer.task.run`'s ProgressLogger attached), or (`warmup_steps` None: the codelab) two
    whole epochs, the second timed, with Keras's default progress bar as in the codelab."""
    from benchmarks.clock import make_clock

    clock = make_clock(warmup_steps)
    if warmup_steps is None:
        model.fit(dataset, epochs=2, callbacks=[clock], verbose=1)
    else:
        from trainer import callbacks

        logger = callbacks.ProgressLogger("bench", 1, warmup_steps + steps, batch_size or 0)
        model.fit(
            dataset, epochs=1, steps_per_epoch=warmup_steps + steps, callbacks=[logger, clock], verbose=0
        )
    return {
        "timed_steps": clock.steps,
        "timed_seconds": round(clock.seconds, 3),
        "warmup_seconds": round(clock.warmup_seconds, 3),
    }


def _tfds_train_images(data_dir: str) -> int:
    """Examples in the TFDS train split: what one codelab epoch delivers."""
    import tensorflow_datasets as tfds

    return int(tfds.builder("cassava", data_dir=data_dir).info.splits["train"].num_examples)


def measure_codelab(data_dir: str, image_size: int, batch_size: int) -> dict[str, Any]:
    from benchmarks import codelab
    from benchmarks.common import rss_self_mib
    from trainer._tf import tf

    rss_before = rss_self_mib()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    train_data, number_of_classes = codelab.create_dataset(
        batch_size, data_dir=data_dir, image_size=image_size
    )
    with strategy.scope():
        model = codelab.create_model(number_of_classes)
    figures = _train(model, train_data, warmup_steps=None, steps=0, batch_size=None)
    images = _tfds_train_images(data_dir)
    return {
        **figures,
        "images_per_second": round(images / figures["timed_seconds"], 2),
        "timed_images": images,
        "rss_after_import_mib": rss_before,
    }


def measure_ours(
    data_dir: str, image_size: int, batch_size: int, warmup_steps: int, mixed_precision: bool, xla: bool
) -> dict[str, Any]:
    from benchmarks.common import resnet50_config, rss_self_mib
    from trainer import data, datasetinfo, distribute, task
    from trainer import model as model_lib
    from trainer._tf import keras, tf

    rss_before = rss_self_mib()
    strategy = distribute.create_strategy(distribute.ClusterInfo())
    config = resnet50_config(data_dir, image_size, batch_size, mixed_precision, xla)
    meta = datasetinfo.load_metadata(data_dir)
    precision = task._precision_policy(mixed_precision, bool(tf.config.list_physical_devices("GPU")))
    keras.mixed_precision.set_global_policy(precision)
    global_batch = batch_size * strategy.num_replicas_in_sync
    steps = data.steps_per_epoch(meta, global_batch)
    ds = data.make_dataset(data_dir, meta, "train", batch_size=global_batch, training=True)
    with strategy.scope():
        model = model_lib.build_model(config, meta.num_classes, meta.image_size)
        model_lib.compile_model(model, config)
    figures = _train(model, ds, warmup_steps=warmup_steps, steps=steps, batch_size=global_batch)
    images = figures["timed_steps"] * global_batch
    return {
        **figures,
        "images_per_second": round(images / figures["timed_seconds"], 2),
        "timed_images": images,
        "precision": precision,
        "rss_after_import_mib": rss_before,
    }
