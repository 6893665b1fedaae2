"""Every trainer pool carries its own GPU request in `container_spec.env` (`pool_env`), which the
trainer reads with `trainer.config.gpu_request`: the names are the same on both sides, the values
round-trip to the pool's machine_spec, and the env is what aiplatform_v1 takes."""

from __future__ import annotations

import re
from typing import Any

import pytest
from google.cloud import aiplatform_v1
from google.protobuf import json_format

from components import worker_pools
from tests.components import test_steps
from trainer import config
from trainer.config import GpuRequest

V100, T4 = "NVIDIA_TESLA_V100", "NVIDIA_TESLA_T4"


def pools(**overrides: Any) -> list[dict[str, Any]]:
    """tests/components/test_steps.py's pools, with workers of another machine and GPU than the chief's."""
    hardware = {
        "worker_count": 2,
        "worker_machine_type": "n1-standard-16",
        "worker_accelerator_type": T4,
        "worker_accelerator_count": 2,
    }
    return test_steps.pools(**{**hardware, **overrides})


def request_of(spec: dict[str, Any]) -> GpuRequest | None:
    return config.gpu_request({e["name"]: e["value"] for e in spec["container_spec"]["env"]})


def test_each_pool_carries_its_own_request() -> None:
    chief, workers = pools()
    assert request_of(chief) == GpuRequest("n1-standard-8", V100, 1)
    assert request_of(workers) == GpuRequest("n1-standard-16", T4, 2)


def test_copied_worker_settings_carry_the_chiefs_request() -> None:
    chief, workers = pools(worker_machine_type="", worker_accelerator_type="", worker_accelerator_count=0)
    assert request_of(workers) == request_of(chief) == GpuRequest("n1-standard-8", V100, 1)


def test_a_cpu_pool_asks_for_no_gpu() -> None:
    [pool] = pools(worker_count=0, chief_accelerator_type="", chief_accelerator_count=0)
    assert pool["container_spec"]["env"] == [
        {"name": "TRAINER_POOL_MACHINE_TYPE", "value": "n1-standard-8"},
        {"name": "TRAINER_POOL_ACCELERATOR_TYPE", "value": "ACCELERATOR_TYPE_UNSPECIFIED"},
        {"name": "TRAINER_POOL_ACCELERATOR_COUNT", "value": "0"},
    ]
    assert request_of(pool) == GpuRequest("n1-standard-8", "", 0)


def test_the_reduction_server_pool_gets_no_request() -> None:
    specs = pools(chief_machine_type="n1-standard-16", chief_accelerator_type=T4, reduction_server_count=1)
    assert "env" not in specs[2]["container_spec"]


@pytest.mark.parametrize(
    "specs",
    [pools(), pools(worker_count=0, chief_accelerator_type="", chief_accelerator_count=0)],
    ids=["gpu", "cpu"],
)
def test_the_env_is_what_vertex_takes(specs: list[dict[str, Any]]) -> None:
    """aiplatform_v1: `ContainerSpec.env` (at most 100), `EnvVar.name` a C identifier, `value`
    required; no name of the variables Vertex sets itself (AIP_*, CLOUD_ML_*)."""
    for spec in specs:
        json_format.ParseDict(
            spec, aiplatform_v1.WorkerPoolSpec.pb(aiplatform_v1.WorkerPoolSpec()), ignore_unknown_fields=False
        )
        env = spec["container_spec"]["env"]
        assert len(env) <= 100
        for item in env:
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", item["name"]), item
            assert not item["name"].startswith(("AIP_", "CLOUD_ML_")), item
            assert item["value"] and "$(" not in item["value"], item


def test_the_names_are_the_trainers() -> None:
    names = [e["name"] for e in worker_pools.pool_env("n1-standard-8")]
    assert tuple(names) == config.POOL_ENV
    assert worker_pools.pool_env("n1-standard-8")[1]["value"] == config.NO_ACCELERATOR


def test_the_shipped_component_writes_the_env() -> None:
    """The planning step runs its own source file on Vertex (`additional_funcs`)."""
    from components import plan

    [executor] = plan.plan_jobs.pipeline_spec.deployment_spec["executors"].values()
    namespace: dict[str, Any] = {"__name__": "shipped"}
    exec(compile(str(executor["container"]["command"][-1]), "shipped.py", "exec"), namespace)
    [pool] = namespace["build_worker_pool_specs"](
        image_uri="img",
        command=["python"],
        args=[],
        chief_machine_type="g2-standard-8",
        chief_accelerator_type="NVIDIA_L4",
        chief_accelerator_count=1,
    )
    assert request_of(pool) == GpuRequest("g2-standard-8", "NVIDIA_L4", 1)
