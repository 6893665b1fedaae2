"""The local job runner and GPUs: each pool's `container_spec.env` reaches its replicas (names
Vertex sets itself refused), and a pool asking for GPUs this machine lacks is refused before any
process starts, with the trainer's one line (`local.gpus.gpu_shortfall` against
`trainer.distribute.gpu_shortfall`). GPUs are found in a fake `/proc/driver/nvidia/gpus`."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from components import tuning, worker_pools
from local import gpus, jobs, tuner
from trainer import config, distribute
from trainer.config import GpuRequest

V100, T4 = "NVIDIA_TESLA_V100", "NVIDIA_TESLA_T4"
# A replica that records the variables it got, as <role>.json in the folder it is given.
RECORD = r"""
import json, os, sys
role = json.loads(os.environ["TF_CONFIG"])["task"]["type"]
with open(os.path.join(sys.argv[1], role + ".json"), "w") as f:
    json.dump(dict(os.environ), f)
"""


def driver_dir(tmp_path: Path, *models: str) -> str:
    """A stand-in for /proc/driver/nvidia/gpus: one folder per GPU, named by its PCI bus id."""
    root = tmp_path / "gpus"
    root.mkdir()
    for i, model in enumerate(models):
        entry = root / f"0000:00:{4 + i:02x}.0"
        entry.mkdir()
        uuid = f"GPU-{i}{i}aaaaaa-2222-3333-4444-555555555555"
        (entry / "information").write_text(
            f"Model: \t\t {model}\nIRQ:   \t\t 35\nGPU UUID: \t {uuid}\nBus Type: \t PCIe\n"
        )
    return str(root)


def test_gpus_are_the_drivers_entries_narrowed_by_cuda_visible_devices(tmp_path: Path) -> None:
    root = driver_dir(tmp_path, "Tesla T4", "Tesla V100-SXM2-16GB")
    assert gpus.local_gpus(root, {}) == ["Tesla T4", "Tesla V100-SXM2-16GB"]
    assert gpus.local_gpus(root, {"CUDA_VISIBLE_DEVICES": "1"}) == ["Tesla V100-SXM2-16GB"]
    assert gpus.local_gpus(root, {"CUDA_VISIBLE_DEVICES": ""}) == []
    assert gpus.local_gpus(root, {"CUDA_VISIBLE_DEVICES": "-1"}) == []
    assert gpus.local_gpus(root, {"CUDA_VISIBLE_DEVICES": "0,7,1"}) == [
        "Tesla T4"
    ]  # stops at 7, as CUDA does
    assert gpus.local_gpus(str(tmp_path / "absent"), {}) == []  # no NVIDIA driver: no GPU
    # By UUID, or a prefix naming one GPU (Slurm and containers give them so).
    assert gpus.local_gpus(root, {"CUDA_VISIBLE_DEVICES": "GPU-11aaaaaa-2222-3333-4444-555555555555,0"}) == [
        "Tesla V100-SXM2-16GB",
        "Tesla T4",
    ]
    assert gpus.local_gpus(root, {"CUDA_VISIBLE_DEVICES": "GPU-00"}) == ["Tesla T4"]
    assert gpus.local_gpus(root, {"CUDA_VISIBLE_DEVICES": "GPU-,1"}) == []  # a prefix naming both: none


@pytest.mark.parametrize(
    ("pool", "role", "machine", "gpu", "asked", "devices"),
    [
        ("workerpool0", "chief", "n1-standard-8", V100, 1, []),
        ("workerpool1", "worker", "n1-standard-16", T4, 4, ["Tesla T4"]),
        ("workerpool1", "worker", "a2-highgpu-2g", "NVIDIA_TESLA_A100", 2, ["A100", "A100"]),
        ("workerpool0", "chief", "n1-standard-4", "", 0, []),
    ],
)
def test_the_local_refusal_is_the_trainers_line(
    pool: str, role: str, machine: str, gpu: str, asked: int, devices: list[str]
) -> None:
    seen_by = "this machine (/proc/driver/nvidia/gpus)"
    local = gpus.gpu_shortfall(pool, role, machine, gpu, asked, devices, seen_by)
    trainer = distribute.gpu_shortfall(
        pool, role, GpuRequest(machine, gpu, asked), len(devices), devices, seen_by
    )
    assert local == trainer
    assert (local is None) is (len(devices) >= asked)


def gpu_specs(
    tmp_path: Path, count: int = 1, env: list[dict[str, str]] | None = None
) -> list[dict[str, Any]]:
    """The pipeline's own pools (chief + one worker, `count` V100s each) running RECORD."""
    script = tmp_path / "record.py"
    script.write_text(RECORD)
    specs = worker_pools.build_worker_pool_specs(
        image_uri="img",
        command=["python", str(script)],
        args=[str(tmp_path)],
        chief_machine_type="n1-standard-8",
        chief_accelerator_type=V100 if count else "",
        chief_accelerator_count=count,
        worker_count=1,
    )
    for spec in specs:
        spec["container_spec"]["env"] += env or []
    return specs


def run(specs: list[dict[str, Any]], tmp_path: Path, **kwargs: Any) -> str:
    out = io.StringIO()
    jobs.run_job(
        specs,
        str(tmp_path / "base"),
        display_name="job",
        project="proj",
        log_dir=tmp_path / "logs",
        out=out,
        **kwargs,
    )
    return out.getvalue()


def test_a_gpu_pool_on_a_machine_without_gpus_is_refused_before_any_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs, "local_gpus", lambda: [])
    with pytest.raises(gpus.GpusMissing) as err:
        run(gpu_specs(tmp_path), tmp_path)
    assert str(err.value) == (
        "GPU check failed: workerpool0 (chief) asked for 1 x NVIDIA_TESLA_V100 on n1-standard-8, but this "
        "machine (/proc/driver/nvidia/gpus) sees 0 GPUs (devices: none); refusing to train on CPU "
        "(docs/vertex.md#no-silent-cpu-training)"
    )
    assert not (tmp_path / "chief.json").exists() and not (tmp_path / "logs").exists()


def test_a_gpu_pool_runs_where_the_gpus_are_and_every_replica_gets_its_pools_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs, "local_gpus", lambda: ["Tesla V100-SXM2-16GB"])
    run(gpu_specs(tmp_path, env=[{"name": "TF_CPP_MIN_LOG_LEVEL", "value": "1"}]), tmp_path)
    for role in ("chief", "worker"):
        env = json.loads((tmp_path / f"{role}.json").read_text())
        assert config.gpu_request(env) == GpuRequest("n1-standard-8", V100, 1)
        assert env["TF_CPP_MIN_LOG_LEVEL"] == "1"  # the pool's env over the runner's own default
        assert json.loads(env["TF_CONFIG"])["task"]["type"] == role  # Vertex's variables stay Vertex's


def test_cpu_pools_carry_a_request_of_no_gpu_and_always_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs, "local_gpus", lambda: [])
    run(gpu_specs(tmp_path, count=0), tmp_path)
    env = json.loads((tmp_path / "chief.json").read_text())
    assert config.gpu_request(env) == GpuRequest("n1-standard-8", "", 0)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"name": "AIP_MODEL_DIR", "value": "/x"}, "AIP_MODEL_DIR is set by Vertex AI itself"),
        ({"name": "CLOUD_ML_JOB_ID", "value": "x"}, "CLOUD_ML_JOB_ID is set by Vertex AI itself"),
        ({"name": "TF_CONFIG", "value": "{}"}, "TF_CONFIG is set by Vertex AI itself"),
        ({"name": "MY-VAR", "value": "x"}, "'MY-VAR' is not a C identifier"),
        ({"name": "DATA", "value": "$(HOME)/data"}, "Vertex AI expands $(VAR_NAME) references"),
    ],
)
def test_env_the_runner_cannot_reproduce_is_refused_naming_the_pool(
    tmp_path: Path, env: dict[str, str], named: str
) -> None:
    with pytest.raises(ValueError, match=None) as err:
        jobs.replicas(gpu_specs(tmp_path, count=0, env=[env]), log=lambda m: None)
    assert str(err.value).startswith("pool 0 container_spec.env: ") and named in str(err.value)


def test_an_escaped_reference_is_kept_as_it_is(tmp_path: Path) -> None:
    [chief, _] = jobs.replicas(
        gpu_specs(tmp_path, count=0, env=[{"name": "X", "value": "$$(HOME)"}]), log=print
    )
    assert dict(chief.env)["X"] == "$$(HOME)"


def test_a_tuning_job_asking_for_missing_gpus_fails_before_any_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trials run the tuning job's pools through the same runner: the refusal ends the job."""
    monkeypatch.setattr(jobs, "local_gpus", lambda: [])
    space = [{"parameter_id": "dropout", "double_value_spec": {"min_value": 0.0, "max_value": 0.3}}]
    with pytest.raises(gpus.GpusMissing, match="workerpool0 \\(chief\\) asked for 1 x NVIDIA_TESLA_V100"):
        tuner.run_tuning(
            gpu_specs(tmp_path),
            str(tmp_path / "tune"),
            tuning.study_metrics(),
            space,
            max_trial_count=2,
            parallel_trial_count=1,
            out=io.StringIO(),
        )
    assert not (tmp_path / "chief.json").exists()
