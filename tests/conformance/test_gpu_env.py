"""No silent CPU training, through the real GCPC launchers: every training replica's container,
and every tuning trial's (the study's `trial_job_spec`), carries its pool's GPU request
(`TRAINER_POOL_*`) in the request Vertex receives; the one-replica CPU jobs ask for none."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pipeline
from components import worker_pools
from tests.conformance import harness
from tests.test_pipeline import root_values
from trainer import config
from trainer.config import GpuRequest

pytestmark = pytest.mark.conformance
V100, T4 = "NVIDIA_TESLA_V100", "NVIDIA_TESLA_T4"


@pytest.fixture(scope="module")
def fake_vertex() -> Iterator[harness.VertexFake]:
    fake = harness.VertexFake().start()
    yield fake
    fake.stop()


def requests_of(pools: list[dict[str, Any]]) -> list[GpuRequest | None]:
    return [
        config.gpu_request({e["name"]: e["value"] for e in pool["container_spec"].get("env", [])})
        for pool in pools
    ]


def test_every_replica_and_trial_carries_its_pools_request(
    fake_vertex: harness.VertexFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    template = harness.load_template(pipeline.compile_pipeline(tmp_path / "pipeline.json"))
    root = root_values(
        template,
        project=harness.PROJECT,
        location="us-central1",
        context_uri="gs://p-proj-pipelines/root/contexts/src-0123456789abcdef0123.tar.gz",
        artifact_repository="us-central1-docker.pkg.dev/p-proj/training",
        source_commit=harness.SOURCE_COMMIT,
        tune=True,
    )
    run = harness.Run(
        spec=harness.taken(template, tune=True), region="us-central1", root=harness.go_numbers(root)
    )
    gpu = {
        "chief_machine_type": "n1-standard-8",
        "chief_accelerator_type": V100,
        "chief_accelerator_count": 1,
        "worker_count": 2,
        "worker_machine_type": "n1-standard-16",
        "worker_accelerator_type": T4,
        "worker_accelerator_count": 2,
    }
    cpu = {"chief_machine_type": "n1-standard-4"}
    for job, command, hardware in (
        ("prepare", "trainer.prepare", cpu),
        ("tuning", "trainer.task", gpu),
        ("training", "trainer.task", gpu),
        ("evaluation", "trainer.evaluate", cpu),
    ):
        pools = worker_pools.build_worker_pool_specs(
            image_uri=harness.IMAGE,
            command=["python", "-m", command],
            args=[],
            region="us-central1",
            **hardware,
        )
        run.upstream[("plan-jobs", f"{job}_pools")] = harness.go_numbers(pools)
        run.upstream[("plan-jobs", f"{job}_dir")] = run.job_dir(job)
    run.upstream[("best-trial", "worker_pool_specs")] = run.upstream[("plan-jobs", "training_pools")]
    run.upstream[("plan-jobs", "measurement_selection_type")] = "BEST_MEASUREMENT"
    with harness.launchers_against(fake_vertex, monkeypatch) as vertex:
        for task in ("prepare-dataset", "tune-hyperparameters", "train-model", "evaluate-models"):
            harness.launch(run, task, vertex, tmp_path)
    gpus = [GpuRequest("n1-standard-8", V100, 1), GpuRequest("n1-standard-16", T4, 2)]
    train = harness.as_dict(run.requests["train-model"])["custom_job"]["job_spec"]["worker_pool_specs"]
    assert requests_of(train) == gpus
    tune = harness.as_dict(run.requests["tune-hyperparameters"])["hyperparameter_tuning_job"]
    assert requests_of(tune["trial_job_spec"]["worker_pool_specs"]) == gpus
    for task in ("prepare-dataset", "evaluate-models"):
        [pool] = harness.as_dict(run.requests[task])["custom_job"]["job_spec"]["worker_pool_specs"]
        assert requests_of([pool]) == [GpuRequest("n1-standard-4", "", 0)], task
