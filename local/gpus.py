"""No silent CPU training: a pool that asks for GPUs (`machine_spec.accelerator_count`) on a machine
that has fewer is refused before any process starts, with the trainer's one line
(`gpu_shortfall`, worded as `trainer.distribute.gpu_shortfall`; tests/local/test_jobs_gpus.py
keeps them equal). The GPUs are found without TensorFlow (`local_gpus`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path


class GpusMissing(ValueError):
    """A pool asks for more GPUs than this machine has."""


GPU_DRIVER_DIR = "/proc/driver/nvidia/gpus"


def local_gpus(driver_dir: str = GPU_DRIVER_DIR, environ: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs a process started here would see: the driver's `<PCI bus id>/` entries (their
    `information` file's `Model:`, else the bus id) in bus order, narrowed by `CUDA_VISIBLE_DEVICES`
    (its indices up to the first that is not a non-negative number, as CUDA reads it)."""
    env = os.environ if environ is None else environ
    try:
        buses = sorted(os.listdir(driver_dir))
    except OSError:
        return []
    names = [_model(Path(driver_dir, bus, "information")) or bus for bus in buses]
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return names
    items = (item.strip() for item in visible.split(","))
    return [names[int(i)] for i in itertools.takewhile(lambda i: i.isdigit() and int(i) < len(names), items)]


def _model(information: Path) -> str:
    """The `Model:` line of a driver `information` file; "" when it has none or cannot be read."""
    with contextlib.suppress(OSError):
        for line in information.read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                return line.partition(":")[2].strip()
    return ""


def gpu_shortfall(
    pool: str,
    role: str,
    machine_type: str,
    accelerator_type: str,
    asked: int,
    devices: Sequence[str],
    seen_by: str,
) -> str | None:
    """`trainer.distribute.gpu_shortfall`'s rule and words (the trainer is not imported here)."""
    gpus = len(devices)
    if gpus >= asked:
        return None
    seen = ", ".join(devices) or "none"
    return (
        f"GPU check failed: {pool} ({role}) asked for {asked} x {accelerator_type} on "
        f"{machine_type}, but {seen_by} sees {gpus} GPU{'' if gpus == 1 else 's'} "
        f"(devices: {seen}); refusing to train on CPU (docs/vertex.md#no-silent-cpu-training)"
    )
