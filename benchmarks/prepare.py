"""`prepare`: images per second of dataset preparation (`trainer.prepare.prepare`), per source.

- synthetic: generates the leaf images (160x160 JPEGs, `--synthetic_per_class 200`: 1,000
  train, 330 validation, 330 test), prepares them through the real TFDS cassava builder, then
  writes our TFRecords at 224 pixels;
- folder: the benchmark's 1,200 cassava-like JPEGs (500x500 and 500x375) from a folder
  (`--source folder:PATH`), decoded, resized to 224 and written.

Each source runs in its own process into a fresh output folder; the figure is images written
per second of `prepare()` (TensorFlow's import excluded, reported separately), with the
synthetic source's phases timed: generating JPEGs, the TFDS build, and our resize-and-write.
No baseline: the codelab prepares nothing (it decodes every epoch; see `input`).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import fixtures
from benchmarks.common import busy_note, make_result, run_child, say

NAME = "prepare"
IMAGE_SIZE = 224
SYNTHETIC_PER_CLASS = 200
GOAL = {"description": "none set; reported for tracking"}


def run(work: Path, results_dir: Path) -> dict[str, Any]:
    source = fixtures.cassava_source(work=work)
    sources: dict[str, dict[str, Any]] = {
        "synthetic": {"source": "synthetic", "synthetic_per_class": SYNTHETIC_PER_CLASS},
        "folder": {"source": f"folder:{source.archive / fixtures.ARCHIVE_FOLDER}"},
    }
    runs: dict[str, dict[str, Any]] = {}
    for name, kwargs in sources.items():
        with tempfile.TemporaryDirectory(prefix=f"bench-prepare-{name}-", dir=work) as tmp:
            child = run_child(
                "benchmarks.prepare:measure",
                {**kwargs, "output_dir": str(Path(tmp) / "out"), "image_size": IMAGE_SIZE},
                log=work / "logs" / f"prepare-{name}.log",
            )
        runs[name] = child.merged()
        say(f"prepare {name}: {runs[name]['images_per_second']:,.0f} img/s ({runs[name]['images']} images)")
    rate = {name: float(r["images_per_second"]) for name, r in runs.items()}
    return make_result(
        NAME,
        inputs={
            "image_size": IMAGE_SIZE,
            "encoding": "raw",
            "shards": 32,
            "synthetic_per_class": SYNTHETIC_PER_CLASS,
            "synthetic_source_size": 160,
            "folder_images": source.spec.train_images
            + 2 * source.spec.heldout_per_class * fixtures.NUM_CLASSES,
            "folder_source_sizes_wxh": [f"{source.spec.width}x{h}" for h in source.spec.heights],
        },
        figures={"images_per_second": rate, "runs": runs},
        ratio=None,
        goal=GOAL,
        goal_met=None,
        notes=busy_note(runs.values()),
        summary=f"synthetic {rate['synthetic']:,.0f} img/s, folder {rate['folder']:,.0f} img/s (to {IMAGE_SIZE}px)",
    )


# --- run in child processes -----------------------------------------------------------------


def measure(source: str, output_dir: str, image_size: int, synthetic_per_class: int = 60) -> dict[str, Any]:
    import contextlib
    from unittest import mock

    import tensorflow_datasets as tfds

    from trainer import synthetic
    from trainer.prepare import PrepareConfig, prepare

    phases: dict[str, float] = {}

    def timed(name: str, function: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - started

        return wrapper

    builder_class = tfds.core.DatasetBuilder
    patches = [
        mock.patch.object(synthetic, "write_archive", timed("generate_jpegs", synthetic.write_archive)),
        mock.patch.object(
            builder_class, "download_and_prepare", timed("tfds_build", builder_class.download_and_prepare)
        ),
    ]
    config = PrepareConfig(
        source=source, output_dir=output_dir, image_size=image_size, synthetic_per_class=synthetic_per_class
    )
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        started = time.perf_counter()
        metadata = prepare(config)
        seconds = time.perf_counter() - started
    images = sum(split["count"] for split in metadata["splits"].values())
    phases["resize_and_write"] = seconds - sum(phases.values())
    return {
        "images": images,
        "seconds": round(seconds, 3),
        "images_per_second": round(images / seconds, 1),
        "phases_seconds": {k: round(v, 3) for k, v in phases.items()},
    }
