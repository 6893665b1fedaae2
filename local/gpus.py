"""No silent CPU training: a pool that asks for GPUs (`machine_spec.accelerator_count`) on a machine
that has fewer is refused before any process starts, with the trainer's one line
(`gpu_shortfall`, worded as `trainer.distribute.gpu_shortfall`; tests/local/test_jobs_gpus.py
keeps them equal). The GPUs are found without TensorFlow (`local_gpus`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path


class GpusMissing(ValueError):
    """A pool asks for more GPUs than this machine has."""


GPU_DRIVER_DIR = "/proc/driver/nvidia/gpus"


def local_gpus(driver_dir: str = GPU_DRIVER_DIR, environ: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs a process started here would see: the driver's `<PCI bus id>/` entries (their
    `information` file's `Model:`, else the bus id) in bus order, narrowed by `CUDA_VISIBLE_DEVICES`
    as CUDA reads it: indices or `GPU-<UUID>` (or a prefix naming one GPU) up to the first that
    names none."""
    env = os.environ if environ is None else environ
    try:
        buses = sorted(os.listdir(driver_dir))
    except OSError:
        return []
    found = [_fields(Path(driver_dir, bus, "information")) for bus in buses]
    names = [fields.get("Model") or bus for fields, bus in zip(found, buses, strict=True)]
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return names

    def index(item: str) -> int | None:
        if item.isdigit():
            return int(item) if int(item) < len(names) else None
        matches = [
            i for i, fields in enumerate(found) if item and fields.get("GPU UUID", "").startswith(item)
        ]
        return matches[0] if item.startswith("GPU-") and len(matches) == 1 else None

    shown = []
    for item in visible.split(","):
        if (i := index(item.strip())) is None:
            break
        shown.append(names[i])
    return shown


def _fields(information: Path) -> dict[str, str]:
    """A driver `information` file's `Name: value` lines (`Model`, `GPU UUID`); {} unreadable."""
    with contextlib.suppress(OSError):
        lines = information.read_text(errors="replace").splitlines()
        return {k.strip(): v.strip() for k, sep, v in (line.partition(":") for line in lines) if sep}
    return {}


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
