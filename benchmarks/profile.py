"""Where a training step's time goes: the TF profiler's op breakdown, without TensorBoard.

`python -m benchmarks.profile train --side ours [--mixed_precision] [--image_size 64]` trains a few
warm-up steps of the `train` benchmark's configuration, traces `--steps` more with `tf.profiler`
and prints the host ops by total time, parsed from the trace's XPlane protobuf (no TensorBoard
profile plugin needed). Used for BENCHMARKS.md's findings; not part of `make bench`.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks import fixtures
from benchmarks.common import WORK_DIR, ours_resnet50

CONTAINERS = {"Process", "Run", "RunWithBorrowedArgs", "MakeIterator"}
"""Events that nest other events (whole steps, executor runs): not ops."""


def op_breakdown(logdir: str, top: int = 25) -> list[tuple[str, float, int]]:
    """(op name, total milliseconds, count) of the host plane's events, by total time."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = sorted(Path(logdir).rglob("*.xplane.pb"))
    if not paths:
        raise FileNotFoundError(f"no .xplane.pb under {logdir}")
    space = xplane_pb2.XSpace()
    space.ParseFromString(paths[0].read_bytes())
    totals: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.defaultdict(int)
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            # Op-level lines only: the TF executor's per-op events (their names look like
            # "name:OpType"); skip the Python/trace-me lines that nest whole steps.
            for event in line.events:
                name = names.get(event.metadata_id, "?")
                if ":" not in name or name.startswith(("$", "Iterator::")):
                    continue
                op_type = name.rsplit(":", 1)[1].strip()
                if op_type in CONTAINERS or op_type.startswith("__inference"):
                    continue
                totals[op_type] += event.duration_ps / 1e9
                counts[op_type] += 1
    return sorted(((k, v, counts[k]) for k, v in totals.items()), key=lambda t: -t[1])[:top]


def profile_train(side: str, image_size: int, batch_size: int, mixed_precision: bool, steps: int) -> None:
    from benchmarks import codelab
    from trainer import data, datasetinfo
    from trainer._tf import tf

    source = fixtures.cassava_source(work=WORK_DIR)
    if side == "codelab":
        ds, classes = codelab.create_dataset(batch_size, data_dir=str(source.tfds_dir), image_size=image_size)
        ds = ds.repeat()
        with tf.distribute.MultiWorkerMirroredStrategy().scope():
            model = codelab.create_model(classes)
    else:
        data_dir = str(fixtures.prepared(source, image_size, WORK_DIR))
        meta = datasetinfo.load_metadata(data_dir)
        model, _, _ = ours_resnet50(image_size, batch_size, meta.num_classes, mixed_precision, xla=False)
        ds = data.make_dataset(data_dir, meta, "train", batch_size=batch_size, training=True)
    model.fit(ds, epochs=1, steps_per_epoch=5, verbose=0)
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as logdir:
        started = time.perf_counter()
        tf.profiler.experimental.start(logdir)
        model.fit(ds, epochs=1, steps_per_epoch=steps, verbose=0)
        tf.profiler.experimental.stop()
        seconds = time.perf_counter() - started
        breakdown = op_breakdown(logdir)
    total = sum(ms for _, ms, _ in breakdown)
    print(f"{side}: {steps} steps in {seconds:.1f}s ({steps * batch_size / seconds:.1f} img/s, traced)")  # noqa: T201
    for name, ms, count in breakdown:
        print(f"  {name:40} {ms / steps:9.1f} ms/step {100 * ms / total:5.1f}%  x{count // steps}")  # noqa: T201


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile")
    parser.add_argument("what", choices=["train"])
    parser.add_argument("--side", choices=["ours", "codelab"], default="ours")
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--mixed_precision", action="store_true")
    args = parser.parse_args(argv)
    profile_train(args.side, args.image_size, args.batch_size, args.mixed_precision, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
