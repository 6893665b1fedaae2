"""`make gpu-check` (`launch.gpucheck`) against local fakes: the real aiplatform_v1 JobServiceClient
to a fake JobService over gRPC (every request parsed strictly), the image's tag looked up in a fake
Artifact Registry, the check's result read back from gcp-storage-emulator; and everything refused
before any request. Never Google."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform_v1
from google.cloud.aiplatform_v1.services.job_service.transports.grpc import JobServiceGrpcTransport

from components import buildcontext
from launch import gpucheck
from tests.conftest import TEST_BUCKET
from tests.fakes import GrpcFake, RegistryFake, StrictRequest, insecure_client

ROOT = Path(__file__).resolve().parents[2]
BUCKET = TEST_BUCKET
REPOSITORY = "us-central1-docker.pkg.dev/p-proj/training"
DIGEST = "sha256:" + "7" * 64
JOBS = "google.cloud.aiplatform.v1.JobService"
V100 = "NVIDIA_TESLA_V100"
LINE = (
    "GPU check failed: workerpool0 (chief) asked for 1 x NVIDIA_TESLA_V100 on n1-standard-8, but "
    "TensorFlow sees 0 GPUs (devices: CPU:0; TensorFlow 2.21.0 built without CUDA); refusing to train "
    "on CPU (docs/vertex.md#no-silent-cpu-training)"
)


def settings_env(**extra: str) -> dict[str, str]:
    return {
        "PROJECT_ID": "p-proj",
        "REGION": "us-central1",
        "PIPELINE_ROOT": f"gs://{BUCKET}/root",
        "ARTIFACT_REPOSITORY": REPOSITORY,
        "SERVICE_ACCOUNT": "pipelines@p-proj.iam.gserviceaccount.com",
        "LABELS": "team=ml",
        **extra,
    }


class FakeJobs:
    """JobService: a created job is RUNNING on its first poll, then ends as `outcome` says, having
    written `result` where the container's trainer.gpucheck would (AIP_MODEL_DIR)."""

    def __init__(self, storage: Any) -> None:
        self.storage = storage
        self.grpc = GrpcFake()
        self.strict: dict[str, StrictRequest] = {}
        self.jobs: dict[str, aiplatform_v1.CustomJob] = {}
        self.outcome = ("JOB_STATE_SUCCEEDED", "")
        self.result: dict[str, Any] | None = {}
        for method, request_type, handler in (
            ("CreateCustomJob", aiplatform_v1.CreateCustomJobRequest, self.create),
            ("GetCustomJob", aiplatform_v1.GetCustomJobRequest, self.get),
            ("CancelCustomJob", aiplatform_v1.CancelCustomJobRequest, self.cancel),
        ):
            self.strict[method] = StrictRequest(request_type)
            self.grpc.add(JOBS, method, self.strict[method], handler)
        self.grpc.start()
        self.client = insecure_client(
            aiplatform_v1.JobServiceClient, JobServiceGrpcTransport, self.grpc.address
        )()

    def create(self, request: aiplatform_v1.CreateCustomJobRequest) -> aiplatform_v1.CustomJob:
        job = aiplatform_v1.CustomJob(request.custom_job)
        job.name = f"{request.parent}/customJobs/{4200 + len(self.jobs)}"
        job.state = aiplatform_v1.JobState.JOB_STATE_PENDING  # type: ignore[assignment]
        self.jobs[job.name] = job
        return job

    def get(self, request: aiplatform_v1.GetCustomJobRequest) -> aiplatform_v1.CustomJob:
        job = self.jobs[request.name]
        if job.state == aiplatform_v1.JobState.JOB_STATE_PENDING:
            job.state = aiplatform_v1.JobState.JOB_STATE_RUNNING  # type: ignore[assignment]
            return job
        state, message = self.outcome
        job.state = getattr(aiplatform_v1.JobState, state)
        if message:
            job.error.message = message
        if self.result is not None:
            base = job.job_spec.base_output_directory.output_uri_prefix.removeprefix(f"gs://{BUCKET}/")
            blob = self.storage.bucket(BUCKET).blob(f"{base}/model/{gpucheck.RESULT_FILE}")
            blob.upload_from_string(json.dumps(self.result))
        return job

    def cancel(self, request: aiplatform_v1.CancelCustomJobRequest) -> Any:
        from google.protobuf import empty_pb2

        self.jobs[request.name].state = aiplatform_v1.JobState.JOB_STATE_CANCELLED  # type: ignore[assignment]
        return empty_pb2.Empty()

    def refusals(self) -> list[str]:
        return [r for s in self.strict.values() for r in s.refused]


@pytest.fixture
def vertex(gcs: Any) -> Iterator[FakeJobs]:
    fake = FakeJobs(gcs)
    yield fake
    fake.grpc.stop()


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A build context of its own (a folder, not a git checkout), so that the tag stays put
    while this checkout's files change."""
    root = tmp_path_factory.mktemp("checkout")
    for name in buildcontext.CONTEXT_FILES:
        (root / name).write_text(f"{name}\n")
    (root / "trainer").mkdir()
    (root / "trainer" / "gpucheck.py").write_text("print('check')\n")
    return root


@pytest.fixture(scope="module")
def tag(context: Path) -> str:
    return buildcontext.context_tag(buildcontext.context_members(context))


@pytest.fixture
def registry(tag: str) -> Iterator[RegistryFake]:
    fake = RegistryFake()
    fake.manifests[f"p-proj/training/trainer:{tag}"] = DIGEST
    yield fake
    fake.stop()


def no_request(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("a request was sent")


def make_check(vertex: FakeJobs, gcs: Any, registry: RegistryFake, context: Path) -> Callable[..., int]:
    def call(*argv: str, **env: str) -> int:
        return gpucheck.main(
            list(argv),
            settings_env(**env),
            Path("/nonexistent"),
            credentials=AnonymousCredentials(),
            job_client=vertex.client,
            storage_client=gcs,
            session=requests.Session(),
            registry_host=registry.host,
            root=context,
            poll_seconds=0,
        )

    return call


def result(**overrides: Any) -> dict[str, Any]:
    """A summary as trainer.gpucheck writes it after one NCCL all-reduce over one V100."""
    return {
        "ok": True,
        "error": None,
        "pool": "workerpool0",
        "role": "chief",
        "asked": {"machine_type": "n1-standard-8", "accelerator_type": V100, "accelerator_count": 1},
        "tensorflow": "2.21.0",
        "build": {"is_cuda_build": True, "cuda_version": "12.5.1", "cudnn_version": "9"},
        "devices": ["CPU:0", "GPU:0"],
        "gpus": 1,
        "nvidia_smi": ["0, Tesla V100-SXM2-16GB, 550.54.15, 16384 MiB, 7.0"],
        "all_reduce": {
            "implementation": "NcclAllReduce",
            "gpus": 1,
            "megabytes": 64.0,
            "first_seconds": 1.25,
            "seconds": 0.0031,
            "iterations": 10,
            "bus_gb_per_second": None,
            "correct": True,
        },
        "wall_seconds": 9.5,
        **overrides,
    }


# --- the request, and reading the result back ------------------------------------------------------


def test_the_job_runs_the_check_on_this_checkouts_image_with_the_chiefs_gpus(
    vertex: FakeJobs,
    gcs: Any,
    registry: RegistryFake,
    context: Path,
    tag: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    vertex.result = result()
    assert make_check(vertex, gcs, registry, context)() == 0
    out = capsys.readouterr().out
    assert not vertex.refusals()
    assert registry.requests == [f"HEAD /v2/p-proj/training/trainer/manifests/{tag}"]
    [request] = vertex.grpc.calls("CreateCustomJob")
    assert request.parent == "projects/p-proj/locations/us-central1"
    job = request.custom_job
    [pool] = job.job_spec.worker_pool_specs
    assert pool.replica_count == 1
    assert pool.machine_spec.machine_type == "n1-standard-8"  # the pipeline's chief, by default
    assert pool.machine_spec.accelerator_type == aiplatform_v1.AcceleratorType.NVIDIA_TESLA_V100
    assert pool.machine_spec.accelerator_count == 1
    assert pool.container_spec.image_uri == f"{REPOSITORY}/trainer@{DIGEST}"  # pinned by digest
    assert list(pool.container_spec.command) == ["python", "-m", "trainer.gpucheck"]
    # The same request a training pool carries, which the check reads with the trainer's rule.
    assert {e.name: e.value for e in pool.container_spec.env} == {
        "TRAINER_POOL_MACHINE_TYPE": "n1-standard-8",
        "TRAINER_POOL_ACCELERATOR_TYPE": V100,
        "TRAINER_POOL_ACCELERATOR_COUNT": "1",
    }
    spec = job.job_spec
    assert re.fullmatch(
        rf"gs://{BUCKET}/root/gpu-check/\d{{8}}-\d{{6}}-[0-9a-f]{{6}}",
        spec.base_output_directory.output_uri_prefix,
    )
    assert spec.scheduling.disable_retries is True
    assert spec.scheduling.timeout.total_seconds() == 1800
    assert spec.service_account == "pipelines@p-proj.iam.gserviceaccount.com"
    assert dict(job.labels) == {"team": "ml"}
    assert vertex.grpc.calls("GetCustomJob")  # followed to its end
    assert "JOB_STATE_SUCCEEDED" in out
    assert "workerpool0 (chief): TensorFlow 2.21.0 sees 1 GPU (devices: CPU:0, GPU:0)" in out
    assert "nvidia-smi: 0, Tesla V100-SXM2-16GB" in out
    assert (
        "NCCL all-reduce of 64 MiB over 1 GPU(s): first 1.250 s (set-up included), then 3.10 ms each" in out
    )
    assert "OK: the image sees the GPUs it was given" in out


def test_flags_choose_another_machine_and_gpu(
    vertex: FakeJobs, gcs: Any, registry: RegistryFake, context: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vertex.result = result()
    code = make_check(vertex, gcs, registry, context)(
        "--chief_machine_type=g2-standard-24",
        "--chief_accelerator_type=NVIDIA_L4",
        "--chief_accelerator_count=2",
        "--timeout=600s",
    )
    assert code == 0, capsys.readouterr().err
    [request] = vertex.grpc.calls("CreateCustomJob")
    [pool] = request.custom_job.job_spec.worker_pool_specs
    assert (pool.machine_spec.machine_type, pool.machine_spec.accelerator_count) == ("g2-standard-24", 2)
    assert {e.name: e.value for e in pool.container_spec.env}["TRAINER_POOL_ACCELERATOR_COUNT"] == "2"
    assert request.custom_job.job_spec.scheduling.timeout.total_seconds() == 600


def test_a_job_that_cannot_see_its_gpus_fails_with_the_trainers_line(
    vertex: FakeJobs, gcs: Any, registry: RegistryFake, context: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vertex.outcome = ("JOB_STATE_FAILED", "The replica workerpool0-0 exited with a non-zero status of 3.")
    vertex.result = result(ok=False, error=LINE, devices=["CPU:0"], gpus=0, nvidia_smi=None, all_reduce=None)
    assert make_check(vertex, gcs, registry, context)() == 1
    captured = capsys.readouterr()
    assert "TensorFlow 2.21.0 sees 0 GPUs (devices: CPU:0)" in captured.out
    assert "nvidia-smi: not in the image" in captured.out
    assert captured.err.strip() == f"make gpu-check: the check failed (JOB_STATE_FAILED): {LINE}"


def test_a_job_that_never_ran_the_check_shows_vertexs_error(
    vertex: FakeJobs, gcs: Any, registry: RegistryFake, context: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vertex.outcome = ("JOB_STATE_FAILED", "Unable to pull the image.\n(details)")
    vertex.result = None
    assert make_check(vertex, gcs, registry, context)() == 1
    assert (
        "the check failed (JOB_STATE_FAILED): Unable to pull the image. (details)" in capsys.readouterr().err
    )


def test_no_wait_submits_and_returns(
    vertex: FakeJobs, gcs: Any, registry: RegistryFake, context: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert make_check(vertex, gcs, registry, context)("--no_wait") == 0
    out = capsys.readouterr().out
    assert vertex.grpc.calls("CreateCustomJob") and not vertex.grpc.calls("GetCustomJob")
    assert "gcloud ai custom-jobs stream-logs projects/p-proj/locations/us-central1/customJobs/4200" in out
    assert "console: https://console.cloud.google.com/" in out


def test_an_image_given_is_used_as_it_is(
    vertex: FakeJobs, gcs: Any, registry: RegistryFake, context: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vertex.result = result()
    image = "europe-docker.pkg.dev/other/repo/trainer:v1"
    assert make_check(vertex, gcs, registry, context)(f"--image={image}") == 0
    assert registry.requests == []
    [request] = vertex.grpc.calls("CreateCustomJob")
    assert request.custom_job.job_spec.worker_pool_specs[0].container_spec.image_uri == image


def test_ctrl_c_while_waiting_cancels_the_job(
    vertex: FakeJobs, gcs: Any, registry: RegistryFake, context: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*_args: Any, **_kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(gpucheck, "wait", interrupted)
    assert make_check(vertex, gcs, registry, context)() == 130
    [cancel] = vertex.grpc.calls("CancelCustomJob")
    assert cancel.name.endswith("/customJobs/4200")


# --- refused before any request ----------------------------------------------------------------------


def test_an_image_this_checkout_never_built_is_named(
    vertex: FakeJobs, gcs: Any, context: Path, tag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = RegistryFake()
    try:
        assert make_check(vertex, gcs, empty, context)() == 2
    finally:
        empty.stop()
    err = capsys.readouterr().err
    assert f"{REPOSITORY}/trainer:{tag}, is not in Artifact Registry" in err
    assert "`make run` builds it first" in err and "--image" in err
    assert not vertex.grpc.calls("CreateCustomJob")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (
            ["--chief_accelerator_type=NVIDIA_TESLA_K80"],
            "chief_accelerator_type: chief pool: NVIDIA_TESLA_K80 cannot be used",
        ),
        (
            ["--chief_accelerator_count=3"],
            "chief_accelerator_count: chief pool: n1-standard-8 takes 1 or 2 or 4 or 8",
        ),
        (["--chief_machine_type=n1 standard"], "chief_machine_type: chief pool: machine type 'n1 standard'"),
        (["--chief_accelerator_type=NVIDIA_L4", "--chief_machine_type=g2-standard-8"], ""),
    ],
)
def test_bad_hardware_is_named_before_any_request(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpucheck, "run", lambda *a, **k: 0)  # past the checks: nothing more here
    code = gpucheck.main(argv, settings_env(), Path("/nonexistent"), credentials=AnonymousCredentials())
    err = capsys.readouterr().err
    if named:
        assert code == 2 and "bad flags (nothing was sent)" in err and named in err, err
    else:
        assert code == 0, err


def test_a_gpu_the_region_table_lacks_needs_the_override(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--chief_machine_type=a3-highgpu-1g", "--chief_accelerator_type=NVIDIA_H100_80GB"]
    env = settings_env(
        REGION="europe-west2", ARTIFACT_REPOSITORY="europe-west2-docker.pkg.dev/p-proj/training"
    )
    assert gpucheck.main(argv, env, Path("/nonexistent"), credentials=AnonymousCredentials()) == 2
    assert "check_gpu_region=false" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--timeout=10s"], "argument --timeout: expected whole seconds like '1800s', from 60s"),
        (["--chief_accelerator_count=one"], "argument --chief_accelerator_count: invalid int value"),
        (["--check_gpu_region=maybe"], "argument --check_gpu_region: expected true or false"),
        (["--epochs=2"], "unrecognized arguments: --epochs=2"),
        (["--image=trainer latest"], "argument --image: expected an image like <region>-docker.pkg.dev/"),
        (["--image=Docker.io/x"], "argument --image: expected an image like"),
    ],
)
def test_bad_flags_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        gpucheck.main(argv, settings_env(), Path("/nonexistent"), credentials=AnonymousCredentials())
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_without_a_project_it_says_it_needs_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpucheck.main([], {}, Path("/nonexistent"), credentials=no_request) == 2
    err = capsys.readouterr().err
    assert "needs a Google Cloud project" in err and "PROJECT_ID" in err
    assert ".venv/bin/python -m trainer.gpucheck" in err


def test_missing_settings_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    env = {k: v for k, v in settings_env().items() if k not in ("PIPELINE_ROOT", "ARTIFACT_REPOSITORY")}
    assert gpucheck.main([], env, Path("/nonexistent"), credentials=no_request) == 2
    err = capsys.readouterr().err
    assert "PIPELINE_ROOT is not set" in err and "ARTIFACT_REPOSITORY is not set" in err


def test_no_credentials_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import google.auth
    from google.auth import exceptions

    def none(*_args: Any, **_kwargs: Any) -> Any:
        raise exceptions.DefaultCredentialsError("Your default credentials were not found.")

    monkeypatch.setattr(google.auth, "default", none)
    assert gpucheck.main([], settings_env(), Path("/nonexistent")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("make gpu-check: no Google Cloud credentials") and "\n" not in err


# --- agreements with the other layers -----------------------------------------------------------------


def test_the_result_file_is_the_one_the_check_writes() -> None:
    from trainer import gpucheck as in_image

    assert gpucheck.RESULT_FILE == in_image.RESULT_FILE
    assert set(gpucheck.RESULT_READ) <= set(in_image.RESULT_KEYS)
    assert ["python", "-m", in_image.__name__] == gpucheck.COMMAND


def test_the_default_machine_is_the_pipelines_chief() -> None:
    import pipeline

    defaults = {q.name: q.default for q in pipeline.PARAMETERS}
    assert gpucheck.hardware_defaults() == {name: defaults[name] for name in gpucheck.HARDWARE}


def test_the_image_is_the_one_the_pipeline_builds(context: Path, tag: str) -> None:
    """`components.image.build_trainer_image` names `<repository>/<image_name>:<tag>`."""
    import inspect

    from components import image
    from launch import settings

    default = inspect.signature(image.build_trainer_image.python_func).parameters["image_name"].default
    config = settings.load(settings_env(), Path("/nonexistent"))
    assert gpucheck.checkout_image(config, context) == (f"{REPOSITORY}/{default}", tag)
    assert gpucheck.ROOT == ROOT  # the context `make run` uploads (launch.submit.upload_context)


@pytest.mark.process
@pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")
def test_make_gpu_check_without_a_project_is_a_settings_error(tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("PROJECT_ID", "MAKEFLAGS", "MAKELEVEL", "ARGS")}
    env["HOME"] = str(tmp_path)
    done = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-C",
            str(ROOT),
            "-o",
            ".venv/.setup-stamp",
            f"PY={sys.executable}",
            "gpu-check",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "make gpu-check: needs a Google Cloud project" in done.stderr
    assert "make gpu-check: exit code 2, usage or settings error: nothing was started" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_real_client_is_made_for_the_api_endpoint(
    gcs: Any, registry: RegistryFake, context: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No client injected: `launch.gpucheck` makes aiplatform_v1's JobServiceClient itself, here
    for API_ENDPOINT on a loopback port (REST), and the body parses strictly as a CustomJob."""
    from tests.fakes import RestFake, strict_json

    fake = RestFake()
    jobs = r"/v1/projects/p-proj/locations/us-central1/customJobs"

    def create(_m: Any, _q: Any, body: Any) -> tuple[int, Any]:
        strict_json(aiplatform_v1.CustomJob, body)
        return 200, {
            **body,
            "name": "projects/p-proj/locations/us-central1/customJobs/77",
            "state": "JOB_STATE_PENDING",
        }

    fake.route("POST", jobs, create)
    try:
        code = gpucheck.main(
            ["--no_wait"],
            settings_env(API_ENDPOINT=f"http://{fake.address}"),
            Path("/nonexistent"),
            credentials=AnonymousCredentials(),
            storage_client=gcs,
            session=requests.Session(),
            registry_host=registry.host,
            root=context,
        )
    finally:
        fake.stop()
    assert code == 0, capsys.readouterr().err
    [body] = fake.bodies("POST", jobs)
    assert body["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"] == [
        "python",
        "-m",
        "trainer.gpucheck",
    ]
    assert "submitted projects/p-proj/locations/us-central1/customJobs/77" in capsys.readouterr().out


def test_vertex_out_of_reach_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    """`make gpu-check` with no network ended in a client library's traceback after its retries:
    Vertex is tried once first, and out of reach is one line naming it (launch.cloud.reach)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends
    env = settings_env(API_ENDPOINT=f"http://127.0.0.1:{port}")
    code = gpucheck.main(
        ["--image=x/y@sha256:" + "0" * 64], env, Path("/nonexistent"), credentials=AnonymousCredentials()
    )
    err = capsys.readouterr().err
    assert code == 1 and f"127.0.0.1:{port}" in err and "Traceback" not in err, err
