"""`prepare`: images per second of dataset preparation (`trainer.prepare.prepare`), per source.

- synthetic: generates the leaf images (160x160 JPEGs, `--synthetic_per_class 200`: 1,000
  train, 330 validation, 330 test), prepares them through the real TFDS cassava builder, then
  writes our TFRecords at 224 pixels;
- folder: the benchmark's 1,200 cassava-like JPEGs (500x500 and 500x375) from a folder
  (`--source folder:PATH`), decoded, resized to 224 and written.

Each source runs in its own process into a fresh output folder; the figure is images written
per second of `prepare()` (TensorFlow's import excluded), with the synthetic source's phases
timed: generating JPEGs, the TFDS build, and our resize-and-write. No baseline: the codelab
prepares nothing (it decodes every epoch; see `input`).

The Beam rows (`--engine beam`, trainer/preparation/beamprep.py, DirectRunner workers): the
folder at 1 and 2 workers, and a folder 10 times its size (each image linked 10 times) at 2
workers, beside the job engine on the same 10x folder. Memory is the whole process tree's,
sampled every 0.1 s: the tree's peak total RSS, and the largest single process's peak.
"""

from __future__ import annotations

import contextlib
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
TIMES = 10  # the larger folder: each image linked this many times


def run(work: Path, results_dir: Path) -> dict[str, Any]:
    source = fixtures.cassava_source(work=work)
    folder = source.archive / fixtures.ARCHIVE_FOLDER
    big = tenfold(folder, work / f"{folder.name}-x{TIMES}")
    tree_cases = {  # measured with their process tree's memory
        "beam_1_worker": (folder, "beam", 1),
        "beam_2_workers": (folder, "beam", 2),
        "beam_2_workers_10x": (big, "beam", 2),
        "job_10x": (big, "job", 0),
    }
    cases: dict[str, dict[str, Any]] = {
        "synthetic": {"source": "synthetic", "synthetic_per_class": SYNTHETIC_PER_CLASS},
        "folder": {"source": f"folder:{folder}"},
        **{
            k: {"source": f"folder:{src}", "engine": e, "beam_workers": w}
            for k, (src, e, w) in tree_cases.items()
        },
    }
    runs: dict[str, dict[str, Any]] = {}
    for name, kwargs in cases.items():
        with tempfile.TemporaryDirectory(prefix=f"bench-prepare-{name}-", dir=work) as tmp:
            runs[name] = run_child(
                f"benchmarks.prepare:{'measure_tree' if name in tree_cases else 'measure'}",
                {**kwargs, "output_dir": str(Path(tmp) / "out"), "image_size": IMAGE_SIZE},
                log=work / "logs" / f"prepare-{name}.log",
            )
        tree = runs[name].get("tree_peak_rss_mib")
        say(
            f"prepare {name}: {runs[name]['images_per_second']:,.0f} img/s ({runs[name]['images']} images)"
            + (f", tree peak {tree:,.0f} MiB" if tree is not None else "")
        )
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
        summary=(
            f"synthetic {rate['synthetic']:,.0f} img/s, folder {rate['folder']:,.0f} img/s (to {IMAGE_SIZE}px); "
            f"Beam folder {rate['beam_1_worker']:,.0f} img/s at 1 worker, {rate['beam_2_workers']:,.0f} at 2 "
            f"({rate['beam_2_workers'] / rate['folder']:.2f}x the job); at 10x the folder Beam (2 workers) "
            f"{rate['beam_2_workers_10x']:,.0f} img/s, the job {rate['job_10x']:,.0f} "
            f"({rate['beam_2_workers_10x'] / rate['job_10x']:.2f}x); peak tree RSS "
            f"{runs['beam_2_workers']['tree_peak_rss_mib']:,.0f} MiB at 1x, "
            f"{runs['beam_2_workers_10x']['tree_peak_rss_mib']:,.0f} MiB at 10x"
        ),
    )


def tenfold(folder: Path, out: Path) -> Path:
    """`folder`'s layout with each image linked TIMES times under other names."""
    if out.exists():
        return out
    tmp = out.with_name(out.name + ".partial")
    for image in sorted(folder.rglob("*")):
        if image.is_file():
            rel = image.relative_to(folder)
            (tmp / rel.parent).mkdir(parents=True, exist_ok=True)
            for i in range(TIMES):
                (tmp / rel.parent / f"{i}-{rel.name}").symlink_to(image.resolve())
    tmp.rename(out)
    return out


# --- run in child processes -----------------------------------------------------------------


def _timed_prepare(config: Any, *args: Any) -> dict[str, Any]:
    """`trainer.prepare.prepare(config, *args)`, timed: images written, seconds, images per second."""
    from trainer.prepare import prepare

    started = time.perf_counter()
    metadata = prepare(config, *args)
    seconds = time.perf_counter() - started
    images = sum(split["count"] for split in metadata["splits"].values())
    return {"images": images, "seconds": round(seconds, 3), "images_per_second": round(images / seconds, 1)}


def measure(source: str, output_dir: str, image_size: int, synthetic_per_class: int = 60) -> dict[str, Any]:
    from unittest import mock

    import tensorflow_datasets as tfds

    from trainer import synthetic
    from trainer.prepare import PrepareConfig

    phases: dict[str, float] = {}

    def timed(name: str, function: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - started

        return wrapper

    builder = tfds.core.DatasetBuilder
    config = PrepareConfig(
        source=source, output_dir=output_dir, image_size=image_size, synthetic_per_class=synthetic_per_class
    )
    with (
        mock.patch.object(synthetic, "write_archive", timed("generate_jpegs", synthetic.write_archive)),
        mock.patch.object(builder, "download_and_prepare", timed("tfds_build", builder.download_and_prepare)),
    ):
        figures = _timed_prepare(config)
    phases["resize_and_write"] = figures["seconds"] - sum(phases.values())
    return {**figures, "phases_seconds": {k: round(v, 3) for k, v in phases.items()}}


def _tree_rss_mib() -> tuple[float, float]:
    """(total, largest) resident MiB of this process and its descendants (psutil reads /proc)."""
    import psutil

    sizes = [0.0]
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # gone since the listing
            sizes.append(process.memory_info().rss / 2**20)
    return sum(sizes), max(sizes)


def measure_tree(
    source: str, output_dir: str, image_size: int, engine: str, beam_workers: int
) -> dict[str, Any]:
    """`prepare()` with `engine`, timed, its process tree's memory sampled every 0.1 s."""
    import threading

    from trainer.preparation.progress import Progress
    from trainer.prepare import PrepareConfig

    peaks = {"tree": 0.0, "process": 0.0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            total, largest = _tree_rss_mib()
            peaks["tree"] = max(peaks["tree"], total)
            peaks["process"] = max(peaks["process"], largest)

    config = PrepareConfig(
        source=source, output_dir=output_dir, image_size=image_size, engine=engine, beam_workers=beam_workers
    )
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    figures = _timed_prepare(config, Progress(bars=False))
    stop.set()
    thread.join()
    return {
        "engine": engine,
        "beam_workers": beam_workers,
        **figures,
        "tree_peak_rss_mib": round(peaks["tree"], 1),
        "largest_process_peak_rss_mib": round(peaks["process"], 1),
    }
