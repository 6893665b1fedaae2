"""Which accelerators Vertex AI custom training accepts on which machine, in which region.

Checked before anything is submitted, naming what is allowed (sources and rules:
docs/vertex.md#gpus-for-training-what-google-allows-and-what-this-project-checks).
`N1_GPU_COUNTS` is the GPUs-per-N1-machine table of Google's "Using GPUs for training models in
the cloud"; `FIXED_GPU_MACHINES` the families whose GPUs come with the machine. `REGION_GPUS` is a
snapshot of Vertex AI's "accelerators by region" page written from memory (2026-11), NOT yet
checked against it: verify it before trusting a rejection (`check_gpu_region=false` warns instead).

The accelerator names are aiplatform_v1's `AcceleratorType` enum less the TPUs (a test keeps them
equal). Refused whatever the machine (`UNUSABLE_GPUS`): NVIDIA_TESLA_K80
(https://cloud.google.com/compute/docs/eol/k80-eol; docs/facts.md, fact 31) and NVIDIA_GB200 (Arm
hosts). B200 and RTX PRO 6000 run only through the compute_90 PTX (`PTX_ONLY_GPUS`, a warning).
"""

from __future__ import annotations

from typing import Any


def gpu_tables() -> dict[str, Any]:
    """The tables, built inside a function so that KFP can ship them (`additional_funcs`)."""
    K80, P4, P100 = "NVIDIA_TESLA_K80", "NVIDIA_TESLA_P4", "NVIDIA_TESLA_P100"
    T4, V100 = "NVIDIA_TESLA_T4", "NVIDIA_TESLA_V100"
    A100, A100_80GB, L4 = "NVIDIA_TESLA_A100", "NVIDIA_A100_80GB", "NVIDIA_L4"
    H100, H100_MEGA, H200 = "NVIDIA_H100_80GB", "NVIDIA_H100_MEGA_80GB", "NVIDIA_H200_141GB"
    B200, GB200, RTX_PRO_6000 = "NVIDIA_B200", "NVIDIA_GB200", "NVIDIA_RTX_PRO_6000"
    ANY, UP_TO_4 = (1, 2, 4, 8), (1, 2, 4)

    def row(*counts: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        return {gpu: c for gpu, c in zip((K80, P4, P100, T4, V100), counts, strict=True) if c}

    small = row(ANY, UP_TO_4, UP_TO_4, UP_TO_4, ANY)  # up to 8 vCPUs
    n16 = row((2, 4, 8), UP_TO_4, UP_TO_4, UP_TO_4, (2, 4, 8))
    n32 = row((4, 8), (2, 4), (2, 4), (2, 4), (4, 8))
    big = row((), (4,), (), (4,), (8,))  # 64 and 96 vCPUs (n1-highcpu-64 alone also takes K80 and P100)
    by_vcpus = {2: small, 4: small, 8: small, 16: n16, 32: n32, 64: big, 96: big}
    sizes = {
        "standard": (4, 8, 16, 32, 64, 96),
        "highmem": (2, 4, 8, 16, 32, 64, 96),
        "highcpu": (16, 32, 64, 96),
    }
    n1 = {f"n1-{family}-{v}": by_vcpus[v] for family, vcpus in sizes.items() for v in vcpus}
    n1["n1-highcpu-64"] = row((8,), (4,), (4,), (4,), (8,))
    fixed = {
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
        # Compute Engine's accelerator-optimized families (A4, A4X, G4), written from memory
        # like REGION_GPUS: verify before trusting a refusal.
        "a4-highgpu-8g": (B200, 8),
        "a4x-highgpu-4g": (GB200, 4),
        **{f"g4-standard-{v}": (RTX_PRO_6000, v // 48) for v in (48, 96, 192, 384)},
    }
    regions = {
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
    }
    unusable = {
        K80: 'end of support (aiplatform_v1 AcceleratorType: "Deprecated: Nvidia Tesla K80 GPU has '
        'reached end of support"), and TensorFlow 2.21 has no kernels for its compute capability 3.7 '
        "(it needs 6.0 or newer): the job would train on CPU",
        GB200: "its A4X machines have Arm (NVIDIA Grace) host CPUs and the trainer image is linux/amd64",
    }
    return {
        "unusable": unusable,
        "ptx_only": (B200, RTX_PRO_6000),
        "n1": n1,
        "fixed": fixed,
        "regions": {r: frozenset(g) for r, g in regions.items()},
        "gpus": tuple(sorted({g for r in n1.values() for g in r} | {g for g, _ in fixed.values()})),
        "none": ("", "ACCELERATOR_TYPE_UNSPECIFIED"),
        "n1_columns": (K80, P4, P100, T4, V100),  # the guide's table's columns, in its order
    }


_TABLES = gpu_tables()
N1_GPU_COUNTS: dict[str, dict[str, tuple[int, ...]]] = _TABLES["n1"]
FIXED_GPU_MACHINES: dict[str, tuple[str, int]] = _TABLES["fixed"]
REGION_GPUS: dict[str, frozenset[str]] = _TABLES["regions"]
UNUSABLE_GPUS: dict[str, str] = _TABLES["unusable"]
PTX_ONLY_GPUS: tuple[str, ...] = _TABLES["ptx_only"]
K80, P4, P100, T4, V100 = _TABLES["n1_columns"]


def allowed_counts(machine_type: str, accelerator_type: str) -> tuple[int, ...]:
    """The accelerator counts Vertex accepts for this pair (empty: the pair is impossible)."""
    tables = gpu_tables()
    if machine_type in tables["fixed"]:
        gpu, count = tables["fixed"][machine_type]
        return (count,) if gpu == accelerator_type else ()
    return tables["n1"].get(machine_type, {}).get(accelerator_type, ())


def validate_machine(
    machine_type: str,
    accelerator_type: str | None,
    accelerator_count: int | None,
    region: str | None = None,
    region_strict: bool = True,
) -> list[str]:
    """Raises ValueError naming what is allowed unless Vertex AI accepts this machine (and this
    TensorFlow can use its GPU); returns warnings. No accelerator: type None, "" or
    ACCELERATOR_TYPE_UNSPECIFIED, count 0 or None. A GPU `REGION_GPUS` does not list for `region`
    is an error, or with `region_strict=False` a warning."""
    import re

    tables = gpu_tables()
    fixed, n1, regions, gpus, none = (tables[k] for k in ("fixed", "n1", "regions", "gpus", "none"))
    warnings: list[str] = []
    if not isinstance(machine_type, str) or not re.match(
        r"^[a-z][a-z0-9]*-[a-z0-9]+(-[0-9]+[a-z]*)?$", machine_type
    ):
        raise ValueError(
            f"machine type {machine_type!r} is not a Compute Engine machine type name (e.g. n1-standard-8)"
        )
    gpu = accelerator_type or ""
    fixed_gpu, fixed_count = fixed.get(machine_type, ("", 0))
    count = accelerator_count or 0
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"accelerator count must be a whole number >= 0, got {accelerator_count!r}")

    usable = [g for g in gpus if g not in tables["unusable"]]
    if gpu in none:
        if count:
            raise ValueError(
                f"accelerator count {count} given without an accelerator type; set the type too "
                f"(one of {', '.join(usable)}) or a count of 0"
            )
        if fixed_count:
            raise ValueError(
                f"{machine_type} comes with {fixed_count} x {fixed_gpu}: set that accelerator type and count"
            )
        return warnings
    if gpu in tables["unusable"]:
        raise ValueError(f"{gpu} cannot be used: {tables['unusable'][gpu]}; usable: {', '.join(usable)}")
    if gpu not in gpus:
        raise ValueError(f"unknown accelerator type {gpu!r}; allowed: {', '.join(usable)}")
    if count == 0:
        raise ValueError(f"accelerator type {gpu} needs an accelerator count (0 given)")

    counts = allowed_counts(machine_type, gpu)
    if not counts:
        if fixed_count:
            raise ValueError(f"{machine_type} comes with {fixed_count} x {fixed_gpu}, not {gpu}")
        hosts = sorted(m for m in [*n1, *fixed] if allowed_counts(m, gpu))
        raise ValueError(
            f"{gpu} cannot be attached to {machine_type}; machine types that take it: {', '.join(hosts)}"
        )
    if count not in counts:
        raise ValueError(f"{machine_type} takes {' or '.join(map(str, counts))} x {gpu}, not {count}")
    if gpu in tables["ptx_only"]:
        warnings.append(
            f"{gpu}: TensorFlow 2.21 has no native kernels for it and runs through its compute_90 PTX, "
            "compiled by the driver on first use (slow start; unverified on this GPU)"
        )
    if region and (region not in regions or gpu not in regions[region]):
        if region not in regions:
            problem = (
                f"region {region!r} is not in this project's GPU table (known regions: "
                f"{', '.join(sorted(regions))})"
            )
        else:
            offering = sorted(r for r, gpus in regions.items() if gpu in gpus)
            problem = (
                f"{gpu} is not offered in {region} (it offers {', '.join(sorted(regions[region]))}); "
                f"regions with {gpu}: {', '.join(offering) or 'none known'}"
            )
        note = (
            "the table is a snapshot of Vertex AI's accelerators-by-region page "
            "(https://cloud.google.com/vertex-ai/docs/general/locations#accelerators)"
        )
        if region_strict:
            raise ValueError(
                f"{problem}; {note}: if Google now offers it there, set check_gpu_region=false "
                "to proceed with a warning"
            )
        warnings.append(f"{problem}; proceeding (check_gpu_region=false); {note}")
    return warnings
