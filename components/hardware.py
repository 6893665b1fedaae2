"""Which accelerators Vertex AI custom training accepts on which machine, in which region.

Validated before anything is submitted, so a bad worker pool fails in milliseconds with a
message naming what is allowed, not minutes later in the Vertex console.

`N1_GPU_COUNTS` is the compatibility table of GPUs per N1 machine type from the GPU training
guide (`../shared/seeds/001_*.txt`), cell by cell. `FIXED_GPU_MACHINES` are the current GPU
machine families, whose GPUs come with the machine (A100 on a2, L4 on g2, H100/H200 on a3).
`REGION_GPUS` is a snapshot of Vertex AI's "accelerators by region" page, NOT yet checked against
it (written from memory, 2026-11): verify it before trusting a rejection. A region missing
from it is rejected with the list of known regions, so extend it when Google adds one.
"""

from __future__ import annotations

import re

K80, P4, P100, T4, V100 = (
    "NVIDIA_TESLA_K80",
    "NVIDIA_TESLA_P4",
    "NVIDIA_TESLA_P100",
    "NVIDIA_TESLA_T4",
    "NVIDIA_TESLA_V100",
)
A100, A100_80GB, L4 = "NVIDIA_TESLA_A100", "NVIDIA_A100_80GB", "NVIDIA_L4"
H100, H100_MEGA, H200 = "NVIDIA_H100_80GB", "NVIDIA_H100_MEGA_80GB", "NVIDIA_H200_141GB"
NO_ACCELERATOR = ("", "ACCELERATOR_TYPE_UNSPECIFIED")

_ANY = (1, 2, 4, 8)
_UP_TO_4 = (1, 2, 4)


def _row(
    k80: tuple[int, ...],
    p4: tuple[int, ...],
    p100: tuple[int, ...],
    t4: tuple[int, ...],
    v100: tuple[int, ...],
) -> dict[str, tuple[int, ...]]:
    return {
        gpu: counts for gpu, counts in ((K80, k80), (P4, p4), (P100, p100), (T4, t4), (V100, v100)) if counts
    }


_SMALL = _row(_ANY, _UP_TO_4, _UP_TO_4, _UP_TO_4, _ANY)  # up to 8 vCPUs
_16 = _row((2, 4, 8), _UP_TO_4, _UP_TO_4, _UP_TO_4, (2, 4, 8))
_32 = _row((4, 8), (2, 4), (2, 4), (2, 4), (4, 8))
_BIG = _row((), (4,), (), (4,), (8,))  # 64 and 96 vCPUs: no K80, no P100 (memory limits)

N1_GPU_COUNTS: dict[str, dict[str, tuple[int, ...]]] = {
    "n1-standard-4": _SMALL,
    "n1-standard-8": _SMALL,
    "n1-standard-16": _16,
    "n1-standard-32": _32,
    "n1-standard-64": _BIG,
    "n1-standard-96": _BIG,
    "n1-highmem-2": _SMALL,
    "n1-highmem-4": _SMALL,
    "n1-highmem-8": _SMALL,
    "n1-highmem-16": _16,
    "n1-highmem-32": _32,
    "n1-highmem-64": _BIG,
    "n1-highmem-96": _BIG,
    "n1-highcpu-16": _16,
    "n1-highcpu-32": _32,
    "n1-highcpu-64": _row((8,), (4,), (4,), (4,), (8,)),
    "n1-highcpu-96": _BIG,
}

FIXED_GPU_MACHINES: dict[str, tuple[str, int]] = {
    **{f"a2-highgpu-{n}g": (A100, n) for n in (1, 2, 4, 8)},
    "a2-megagpu-16g": (A100, 16),
    **{f"a2-ultragpu-{n}g": (A100_80GB, n) for n in (1, 2, 4, 8)},
    **{f"g2-standard-{v}": (L4, 1) for v in (4, 8, 12, 16, 32)},
    "g2-standard-24": (L4, 2),
    "g2-standard-48": (L4, 4),
    "g2-standard-96": (L4, 8),
    **{f"a3-highgpu-{n}g": (H100, n) for n in (1, 2, 4, 8)},
    "a3-megagpu-8g": (H100_MEGA, 8),
    "a3-ultragpu-8g": (H200, 8),
}

REGION_GPUS: dict[str, frozenset[str]] = {
    region: frozenset(gpus)
    for region, gpus in {
        "us-central1": (K80, P4, P100, T4, V100, A100, A100_80GB, L4, H100, H100_MEGA, H200),
        "us-east1": (K80, P100, T4, V100, L4, H100),
        "us-east4": (P4, T4, A100_80GB, L4, H100, H100_MEGA, H200),
        "us-west1": (K80, P100, T4, V100, A100, L4, H100),
        "us-west4": (P4, T4, A100, L4, H100),
        "northamerica-northeast1": (P4, T4),
        "southamerica-east1": (T4,),
        "europe-west1": (K80, P100, T4, L4),
        "europe-west2": (T4, L4),
        "europe-west4": (K80, P4, P100, T4, V100, A100, A100_80GB, L4, H100, H100_MEGA),
        "asia-east1": (K80, P100, T4, L4),
        "asia-northeast1": (T4, A100, L4, H100),
        "asia-northeast3": (T4, A100, L4),
        "asia-southeast1": (P4, T4, A100, A100_80GB, L4, H100),
        "australia-southeast1": (P4, T4),
    }.items()
}

ALL_GPUS = tuple(
    sorted({g for row in N1_GPU_COUNTS.values() for g in row} | {g for g, _ in FIXED_GPU_MACHINES.values()})
)
_MACHINE_TYPE = re.compile(r"^[a-z][a-z0-9]*-[a-z0-9]+(-[0-9]+[a-z]*)?$")


def allowed_counts(machine_type: str, accelerator_type: str) -> tuple[int, ...]:
    """The accelerator counts Vertex accepts for this pair (empty: the pair is impossible)."""
    if machine_type in FIXED_GPU_MACHINES:
        gpu, count = FIXED_GPU_MACHINES[machine_type]
        return (count,) if gpu == accelerator_type else ()
    return N1_GPU_COUNTS.get(machine_type, {}).get(accelerator_type, ())


def validate_machine(
    machine_type: str,
    accelerator_type: str | None,
    accelerator_count: int | None,
    region: str | None = None,
) -> None:
    """Raises ValueError naming what is allowed unless Vertex AI accepts this machine.

    `accelerator_type` None, "" or ACCELERATOR_TYPE_UNSPECIFIED with a count of 0 (or None)
    means no accelerator. Type and count go together. GPU machine families (a2, g2, a3) must
    carry exactly their built-in GPUs.
    """
    if not isinstance(machine_type, str) or not _MACHINE_TYPE.match(machine_type):
        raise ValueError(
            f"machine type {machine_type!r} is not a Compute Engine machine type name (e.g. n1-standard-8)"
        )
    gpu = accelerator_type or ""
    count = accelerator_count or 0
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"accelerator count must be a whole number >= 0, got {accelerator_count!r}")

    if gpu in NO_ACCELERATOR:
        if count:
            raise ValueError(
                f"accelerator count {count} given without an accelerator type; set the type too "
                f"(one of {', '.join(ALL_GPUS)}) or a count of 0"
            )
        if machine_type in FIXED_GPU_MACHINES:
            fixed_gpu, fixed_count = FIXED_GPU_MACHINES[machine_type]
            raise ValueError(
                f"{machine_type} comes with {fixed_count} x {fixed_gpu}: set that accelerator type and count"
            )
        return
    if gpu not in ALL_GPUS:
        raise ValueError(f"unknown accelerator type {gpu!r}; allowed: {', '.join(ALL_GPUS)}")
    if count == 0:
        raise ValueError(f"accelerator type {gpu} needs an accelerator count (0 given)")

    counts = allowed_counts(machine_type, gpu)
    if not counts:
        if machine_type in FIXED_GPU_MACHINES:
            fixed_gpu, fixed_count = FIXED_GPU_MACHINES[machine_type]
            raise ValueError(f"{machine_type} comes with {fixed_count} x {fixed_gpu}, not {gpu}")
        hosts = sorted(m for m in [*N1_GPU_COUNTS, *FIXED_GPU_MACHINES] if allowed_counts(m, gpu))
        raise ValueError(
            f"{gpu} cannot be attached to {machine_type}; machine types that take it: {', '.join(hosts)}"
        )
    if count not in counts:
        raise ValueError(f"{machine_type} takes {' or '.join(map(str, counts))} x {gpu}, not {count}")
    if region is not None:
        if region not in REGION_GPUS:
            raise ValueError(
                f"unknown region {region!r} for GPU training; known regions: {', '.join(sorted(REGION_GPUS))}"
            )
        if gpu not in REGION_GPUS[region]:
            offering = sorted(r for r, gpus in REGION_GPUS.items() if gpu in gpus)
            raise ValueError(
                f"{gpu} is not offered in {region} (it offers {', '.join(sorted(REGION_GPUS[region]))}); "
                f"regions with {gpu}: {', '.join(offering)}"
            )
