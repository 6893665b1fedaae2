"""The real GCPC launcher creates the compiled training CustomJob against a local fake
JobService, which checks the request the way Vertex would receive it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.cloud import aiplatform_v1
from google.cloud.aiplatform_v1.services.job_service.transports.grpc import JobServiceGrpcTransport

import pipeline
from tests.fakes import GrpcFake, insecure_client
from tests.test_pipeline import default_pools, render_payload, root_values


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return json.loads(pipeline.compile_pipeline(tmp_path_factory.mktemp("c") / "p.json").read_text())


def test_launcher_creates_the_training_job(
    spec: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from google_cloud_pipeline_components.container.v1.custom_job import launcher
    from google_cloud_pipeline_components.container.v1.gcp_launcher import job_remote_runner

    jobs: dict[str, aiplatform_v1.CustomJob] = {}

    def create(request: aiplatform_v1.CreateCustomJobRequest) -> aiplatform_v1.CustomJob:
        job = aiplatform_v1.CustomJob(request.custom_job)
        job.name = f"{request.parent}/customJobs/4242"
        job.state = aiplatform_v1.JobState.JOB_STATE_PENDING  # type: ignore[assignment]
        jobs[job.name] = job
        return job

    def get(request: aiplatform_v1.GetCustomJobRequest) -> aiplatform_v1.CustomJob:
        job = jobs[request.name]
        job.state = aiplatform_v1.JobState.JOB_STATE_SUCCEEDED  # type: ignore[assignment]
        return job

    fake = GrpcFake()
    fake.add(
        "google.cloud.aiplatform.v1.JobService",
        "CreateCustomJob",
        aiplatform_v1.CreateCustomJobRequest,
        create,
    )
    fake.add("google.cloud.aiplatform.v1.JobService", "GetCustomJob", aiplatform_v1.GetCustomJobRequest, get)
    fake.start()
    monkeypatch.setattr(
        job_remote_runner.aiplatform.gapic,
        "JobServiceClient",
        insecure_client(aiplatform_v1.JobServiceClient, JobServiceGrpcTransport, fake.address),
    )
    image = "us-central1-docker.pkg.dev/p/r/trainer@sha256:" + "1" * 64
    pools = default_pools(spec)
    for pool in pools:
        pool["container_spec"]["image_uri"] = image
    payload = render_payload(
        spec,
        "train-model",
        {
            ("plan-jobs", "training_pools"): pools,
            ("best-trial", "worker_pool_specs"): pools,
            ("plan-jobs", "training_dir"): "gs://b/root/run/train",
        },
        root_values(
            spec, project="p", location="us-central1", service_account="sa@p-proj.iam.gserviceaccount.com"
        ),
    )
    resources = tmp_path / "gcp_resources"
    try:
        launcher.main(
            [
                "--type",
                "CustomJob",
                "--project",
                "p",
                "--location",
                "us-central1",
                "--payload",
                json.dumps(payload),
                "--gcp_resources",
                str(resources),
            ]
        )
    finally:
        fake.stop()

    [request] = fake.calls("CreateCustomJob")
    assert request.parent == "projects/p/locations/us-central1"
    job = request.custom_job
    chief, workers = job.job_spec.worker_pool_specs
    assert (chief.replica_count, workers.replica_count) == (1, 1)
    for pool in (chief, workers):
        assert pool.machine_spec.machine_type == "n1-standard-8"
        assert pool.machine_spec.accelerator_type == aiplatform_v1.AcceleratorType.NVIDIA_TESLA_V100
        assert pool.machine_spec.accelerator_count == 1
        assert pool.container_spec.image_uri == image
        assert list(pool.container_spec.command) == ["python", "-m", "trainer.task"]
        assert list(pool.container_spec.args) == ["--data_dir=gs://b/data", "--epochs=2"]
    assert job.job_spec.base_output_directory.output_uri_prefix == "gs://b/root/run/train"
    assert job.job_spec.scheduling.restart_job_on_worker_restart is True
    assert job.job_spec.service_account == "sa@p-proj.iam.gserviceaccount.com"
    assert fake.calls("GetCustomJob")  # the launcher followed the job to its end
    uri = json.loads(resources.read_text())["resources"][0]["resourceUri"]
    assert uri.endswith("/v1/projects/p/locations/us-central1/customJobs/4242")
