"""The validator against Google's table of GPUs per N1 machine type, cell by cell (the table of
"Using GPUs for training models in the cloud", as copied in docs/vertex.md#gpus-per-n1-machine-type)."""

from __future__ import annotations

from typing import Any

import pytest

from components.hardware import (
    FIXED_GPU_MACHINES,
    K80,
    P4,
    P100,
    PTX_ONLY_GPUS,
    T4,
    UNUSABLE_GPUS,
    V100,
    allowed_counts,
    gpu_tables,
    validate_machine,
)

GPUS = (K80, P4, P100, T4, V100)
# Google's table as printed (docs/vertex.md#gpus-per-n1-machine-type): machine type -> allowed
# counts per GPU column ("-" = none).
GUIDE_TABLE = """
n1-standard-4   1,2,4,8 1,2,4 1,2,4 1,2,4 1,2,4,8
n1-standard-8   1,2,4,8 1,2,4 1,2,4 1,2,4 1,2,4,8
n1-standard-16  2,4,8   1,2,4 1,2,4 1,2,4 2,4,8
n1-standard-32  4,8     2,4   2,4   2,4   4,8
n1-standard-64  -       4     -     4     8
n1-standard-96  -       4     -     4     8
n1-highmem-2    1,2,4,8 1,2,4 1,2,4 1,2,4 1,2,4,8
n1-highmem-4    1,2,4,8 1,2,4 1,2,4 1,2,4 1,2,4,8
n1-highmem-8    1,2,4,8 1,2,4 1,2,4 1,2,4 1,2,4,8
n1-highmem-16   2,4,8   1,2,4 1,2,4 1,2,4 2,4,8
n1-highmem-32   4,8     2,4   2,4   2,4   4,8
n1-highmem-64   -       4     -     4     8
n1-highmem-96   -       4     -     4     8
n1-highcpu-16   2,4,8   1,2,4 1,2,4 1,2,4 2,4,8
n1-highcpu-32   4,8     2,4   2,4   2,4   4,8
n1-highcpu-64   8       4     4     4     8
n1-highcpu-96   -       4     -     4     8
"""


def cells() -> list[tuple[str, str, int, bool]]:
    out = []
    for line in GUIDE_TABLE.strip().splitlines():
        machine, *columns = line.split()
        for gpu, column in zip(GPUS, columns, strict=True):
            allowed = set() if column == "-" else {int(c) for c in column.split(",")}
            out += [(machine, gpu, count, count in allowed) for count in (1, 2, 3, 4, 8, 16)]
    return out


@pytest.mark.parametrize(("machine", "gpu", "count", "ok"), cells())
def test_every_cell_of_the_n1_table(machine: str, gpu: str, count: int, ok: bool) -> None:
    assert (count in allowed_counts(machine, gpu)) == ok
    if gpu == K80:  # the table keeps Google's K80 column, but no K80 job is accepted
        with pytest.raises(ValueError, match="NVIDIA_TESLA_K80 cannot be used: end of support"):
            validate_machine(machine, gpu, count)
    elif ok:
        validate_machine(machine, gpu, count)
    else:
        with pytest.raises(ValueError, match=f"{gpu}|{machine}"):
            validate_machine(machine, gpu, count)


@pytest.mark.parametrize(
    ("machine", "spec"), sorted((m, s) for m, s in FIXED_GPU_MACHINES.items() if s[0] not in UNUSABLE_GPUS)
)
def test_gpu_families_take_exactly_their_built_in_gpus(machine: str, spec: tuple[str, int]) -> None:
    gpu, count = spec
    validate_machine(machine, gpu, count)
    with pytest.raises(ValueError, match=f"takes {count} x {gpu}, not {count * 2}"):
        validate_machine(machine, gpu, count * 2)
    with pytest.raises(ValueError, match=f"comes with {count} x {gpu}"):
        validate_machine(machine, T4 if gpu != T4 else V100, count)
    with pytest.raises(ValueError, match=f"comes with {count} x {gpu}: set that"):
        validate_machine(machine, None, 0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("n1-standard-8", V100, 0), "needs an accelerator count"),
        (("n1-standard-8", None, 2), "given without an accelerator type"),
        (("n1-standard-8", "NVIDIA_TESLA_X9", 1), "unknown accelerator type 'NVIDIA_TESLA_X9'; allowed:"),
        (("n1-standard-8", V100, -1), "must be a whole number >= 0"),
        (("n1-standard-2", V100, 1), "NVIDIA_TESLA_V100 cannot be attached to n1-standard-2; machine types"),
        (("N1 standard", V100, 1), "is not a Compute Engine machine type name"),
        (
            ("n1-standard-8", V100, 1, "mars-central1"),
            "region 'mars-central1' is not in this project's GPU table",
        ),
        (("a4x-highgpu-4g", "NVIDIA_GB200", 4), "NVIDIA_GB200 cannot be used: its A4X machines have Arm"),
        (
            ("a3-highgpu-8g", "NVIDIA_H100_80GB", 8, "southamerica-east1"),
            "is not offered in southamerica-east1",
        ),
    ],
)
def test_inconsistent_or_incomplete_settings_are_named(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ValueError) as err:
        validate_machine(*args)
    assert message in str(err.value)


def test_cpu_machines_and_the_codelab_defaults_pass() -> None:
    validate_machine("n1-standard-4", None, 0)
    validate_machine("e2-standard-8", "ACCELERATOR_TYPE_UNSPECIFIED", 0)
    validate_machine("n1-standard-8", V100, 1, region="us-central1")


def test_the_accelerators_are_aiplatforms_enum_less_the_tpus() -> None:
    from google.cloud import aiplatform_v1

    members = aiplatform_v1.AcceleratorType.__members__  # proto-plus enums are IntEnums
    enum = set(members) - {"ACCELERATOR_TYPE_UNSPECIFIED"}
    assert set(gpu_tables()["gpus"]) == {g for g in enum if not g.startswith("TPU_")}


def test_a_gpu_past_the_region_table_is_refused_naming_the_override_or_warned_with_it() -> None:
    with pytest.raises(ValueError, match="set check_gpu_region=false"):
        validate_machine("a3-highgpu-8g", "NVIDIA_H100_80GB", 8, "southamerica-east1")
    warnings = validate_machine(
        "a3-highgpu-8g", "NVIDIA_H100_80GB", 8, "southamerica-east1", region_strict=False
    )
    assert len(warnings) == 1 and "not offered in southamerica-east1" in warnings[0]
    assert "proceeding (check_gpu_region=false)" in warnings[0]
    warnings = validate_machine("n1-standard-8", V100, 1, "mars-central1", region_strict=False)
    assert "'mars-central1' is not in this project's GPU table" in warnings[0]
    # the override never lets an impossible machine through
    with pytest.raises(ValueError, match="takes 8 x"):
        validate_machine("a3-highgpu-8g", "NVIDIA_H100_80GB", 4, "southamerica-east1", region_strict=False)


@pytest.mark.parametrize("gpu", PTX_ONLY_GPUS)
def test_gpus_without_native_kernels_are_warned_about(gpu: str) -> None:
    machine = next(m for m, (g, _) in FIXED_GPU_MACHINES.items() if g == gpu)
    warnings = validate_machine(machine, gpu, FIXED_GPU_MACHINES[machine][1])
    assert any("compute_90 PTX" in w for w in warnings)
    assert validate_machine("n1-standard-8", V100, 1) == []
