"""The conformance tier: every option combination of `ROWS`, through the real GCPC 2.22 launchers
or refused at the front door before any request
(docs/guarantees.md#conformance-the-real-launchers-every-option, whose table is generated from
`ROWS`: `python -m tests.conformance.test_conformance` rewrites it).

Accepted rows: the compiled template (`compiled/pipeline.json`, read once per module) rendered
with the row's parameter values and the worker pools the real `build_worker_pool_specs` returns
for them, run through the custom job, tuning job and model upload launchers in this process
(`tests.conformance.harness`); every captured request parsed strictly into its aiplatform_v1
type, then checked: what every run must carry (`check_*`), and the row's own `carries`. They
also pass `make run` (Vertex target) up to the PipelineJob request, their values in it.

Refused rows: `make run --target vertex` and `make schedule` exit 2, naming the row's parameters
at the start of a line of stderr, and the fake Vertex API, the Cloud Storage emulator and the
template registry saw nothing.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform_v1

import pipeline
from components import servingimage
from launch import cli, schedules, settings, submit
from tests.conformance import harness
from tests.conformance.harness import SYSTEM_LABELS, Run, as_dict, lookup
from tests.contract.test_submit import BUCKET, env
from tests.fakes import RestFake

pytestmark = pytest.mark.conformance

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "guarantees.md"
BEGIN = "<!-- BEGIN MATRIX: generated from tests/conformance/test_conformance.py ROWS -->"
END = "<!-- END MATRIX -->"

V100 = "NVIDIA_TESLA_V100"
H100, A100, L4 = "NVIDIA_H100_80GB", "NVIDIA_TESLA_A100", "NVIDIA_L4"
TENSORBOARD = "projects/123/locations/us-central1/tensorboards/456"
SERVICE_ACCOUNT = "trainer@p-proj.iam.gserviceaccount.com"
KMS_KEY = "projects/p-proj/locations/us-central1/keyRings/r/cryptoKeys/k"
NETWORK = "projects/123/global/networks/vpc"
LABELS_59 = {f"k{i:02}": "v" for i in range(59)}
REDUCTION_SERVER_IMAGE = "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"
TRAIN = "train-model custom_job.job_spec"
TUNE = "tune-hyperparameters hyperparameter_tuning_job"
DATAFLOW = "launch-dataflow-preparation launch_parameter"
IMAGES = "folder:gs://p-proj-data/cassava-images"


def machine(machine_type: str, gpu: str = "", count: int = 0, role: str = "chief") -> dict[str, Any]:
    """The hardware parameters of one pool (`chief` or `worker`)."""
    return {
        f"{role}_machine_type": machine_type,
        f"{role}_accelerator_type": gpu,
        f"{role}_accelerator_count": count,
    }


def both(machine_type: str, gpu: str = "", count: int = 0) -> dict[str, Any]:
    return {**machine(machine_type, gpu, count), **machine(machine_type, gpu, count, "worker")}


def spec_of(machine_type: str, gpu: str = "", count: int = 0) -> dict[str, Any]:
    """A `machine_spec` as the request carries it."""
    return {
        "machine_type": machine_type,
        **({"accelerator_type": gpu, "accelerator_count": count} if gpu else {}),
    }


@dataclasses.dataclass(frozen=True)
class Row:
    """One option combination. `values`: the pipeline parameters it sets (flags of `make run`);
    `region`: REGION (the pipeline's location). Accepted rows list in `carries` what the
    requests must hold ("<task> <path>": value; None: absent); refused rows the parameters the
    rules must name (`refused`) and why (`rule`). `settings`: other settings (env) of the row."""

    name: str
    values: Mapping[str, Any]
    carries: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    refused: tuple[str, ...] = ()
    rule: str = ""
    region: str = "us-central1"
    settings: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def accepted(self) -> bool:
        return not self.refused


ROWS: tuple[Row, ...] = (
    # --- accepted ------------------------------------------------------------------------------
    Row(
        "defaults",
        {},
        {
            f"{TRAIN}.worker_pool_specs#": 2,
            f"{TRAIN}.worker_pool_specs[0].machine_spec": spec_of("n1-standard-8", V100, 1),
            f"{TRAIN}.worker_pool_specs[1].machine_spec": spec_of("n1-standard-8", V100, 1),
            f"{TRAIN}.worker_pool_specs[1].replica_count": 1,
            f"{TRAIN}.scheduling.strategy": "STANDARD",
            f"{TRAIN}.scheduling.timeout": "86400s",
            "prepare-dataset custom_job.job_spec.worker_pool_specs[0].machine_spec": spec_of("n1-standard-8"),
        },
    ),
    Row(
        "tune-bayesian",
        {"tune": True},
        {
            f"{TUNE}.study_spec.algorithm": None,
            f"{TUNE}.max_trial_count": 8,
            f"{TUNE}.parallel_trial_count": 2,
            f"{TUNE}.study_spec.metrics": [{"metric_id": "val_accuracy", "goal": "MAXIMIZE"}],
            f"{TUNE}.study_spec.parameters#": 4,
            f"{TUNE}.study_spec.measurement_selection_type": "BEST_MEASUREMENT",  # export_epoch=best
            f"{TUNE}.trial_job_spec.worker_pool_specs#": 2,
        },
    ),
    Row(
        "tune-random",
        {
            "tune": True,
            "search_algorithm": "RANDOM_SEARCH",
            "max_trial_count": 12,
            "parallel_trial_count": 3,
            "max_failed_trial_count": 2,
            "export_epoch": "last",
            "timeout": "7200s",
        },
        {
            f"{TUNE}.study_spec.measurement_selection_type": "LAST_MEASUREMENT",
            f"{TUNE}.study_spec.algorithm": "RANDOM_SEARCH",
            f"{TUNE}.max_trial_count": 12,
            f"{TUNE}.parallel_trial_count": 3,
            f"{TUNE}.max_failed_trial_count": 2,
            f"{TUNE}.trial_job_spec.scheduling.timeout": "7200s",
            f"{TRAIN}.scheduling.timeout": "7200s",
        },
    ),
    Row(
        "spot",
        {"scheduling_strategy": "SPOT"},
        {f"{TRAIN}.scheduling.strategy": "SPOT", f"{TRAIN}.scheduling.max_wait_duration": None},
    ),
    Row(
        "flex-start-a3",
        {"scheduling_strategy": "FLEX_START", **both("a3-highgpu-8g", H100, 8)},
        {
            f"{TRAIN}.scheduling.strategy": "FLEX_START",
            f"{TRAIN}.scheduling.max_wait_duration": "86400s",
            f"{TRAIN}.worker_pool_specs[0].machine_spec": spec_of("a3-highgpu-8g", H100, 8),
            f"{TRAIN}.worker_pool_specs[1].machine_spec": spec_of("a3-highgpu-8g", H100, 8),
        },
    ),
    Row(
        "flex-start-g2",
        {"scheduling_strategy": "FLEX_START", **both("g2-standard-8", L4, 1), "worker_count": 2},
        {
            f"{TRAIN}.scheduling.strategy": "FLEX_START",
            f"{TRAIN}.scheduling.max_wait_duration": "86400s",
            f"{TRAIN}.worker_pool_specs[0].machine_spec": spec_of("g2-standard-8", L4, 1),
            f"{TRAIN}.worker_pool_specs[1].machine_spec": spec_of("g2-standard-8", L4, 1),
            f"{TRAIN}.worker_pool_specs[1].replica_count": 2,
        },
    ),
    Row(
        "reduction-server",
        {"worker_count": 2, "reduction_server_count": 2, "tune": True},
        {
            f"{TRAIN}.worker_pool_specs#": 3,
            # The chief and workers run the reduction-server stage (Google's NCCL plugin) ...
            f"{TRAIN}.worker_pool_specs[0].container_spec.image_uri": harness.REDUCTION_IMAGE,
            f"{TRAIN}.worker_pool_specs[1].container_spec.image_uri": harness.REDUCTION_IMAGE,
            # ... and the trials neither that image nor reducers of their own.
            f"{TUNE}.trial_job_spec.worker_pool_specs#": 2,
            f"{TUNE}.trial_job_spec.worker_pool_specs[0].container_spec.image_uri": harness.IMAGE,
            f"{TRAIN}.worker_pool_specs[1].replica_count": 2,
            f"{TRAIN}.worker_pool_specs[2].replica_count": 2,
            f"{TRAIN}.worker_pool_specs[2].machine_spec": spec_of("n1-highcpu-16"),
            f"{TRAIN}.worker_pool_specs[2].container_spec.image_uri": REDUCTION_SERVER_IMAGE,
        },
    ),
    Row(
        "tensorboard",
        {"tensorboard": TENSORBOARD, "service_account": SERVICE_ACCOUNT, "tune": True},
        {
            f"{TRAIN}.tensorboard": TENSORBOARD,
            f"{TRAIN}.service_account": SERVICE_ACCOUNT,
            "prepare-dataset custom_job.job_spec.tensorboard": None,
            f"{TUNE}.trial_job_spec.service_account": SERVICE_ACCOUNT,
        },
    ),
    Row(
        "tensorboard-settings-account",
        {"tensorboard": TENSORBOARD},
        {
            f"{TRAIN}.tensorboard": TENSORBOARD,
            f"{TRAIN}.service_account": "pipelines@p-proj.iam.gserviceaccount.com",
        },
    ),
    Row(
        "cmek",
        {"encryption_spec_key_name": KMS_KEY, "tune": True},
        {
            "prepare-dataset custom_job.encryption_spec.kms_key_name": KMS_KEY,
            "train-model custom_job.encryption_spec.kms_key_name": KMS_KEY,
            f"{TUNE}.encryption_spec.kms_key_name": KMS_KEY,
            "upload-first-model model.encryption_spec.kms_key_name": KMS_KEY,
            "upload-model model.encryption_spec.kms_key_name": KMS_KEY,
        },
    ),
    Row(
        "network",
        {"network": NETWORK, "tune": True},
        {
            "prepare-dataset custom_job.job_spec.network": NETWORK,
            f"{TRAIN}.network": NETWORK,
            f"{TUNE}.trial_job_spec.network": NETWORK,
        },
    ),
    Row(
        "labels",
        {"labels": {"team": "ml", "env": "dev"}, "tune": True},
        {
            "train-model custom_job.labels": {"team": "ml", "env": "dev", **SYSTEM_LABELS},
            "prepare-dataset custom_job.labels": {"team": "ml", "env": "dev", **SYSTEM_LABELS},
            # GCPC 2.22's HyperparameterTuningJobRunOp has no labels input: Vertex's only.
            f"{TUNE}.labels": SYSTEM_LABELS,
            "upload-model model.labels": {
                "team": "ml",
                "env": "dev",
                "pipeline_run": harness.PIPELINE_JOB_NAME,
                "source_commit": harness.SOURCE_COMMIT,
                **SYSTEM_LABELS,
            },
        },
    ),
    Row(
        "labels-59",
        {"labels": LABELS_59},
        {
            "train-model custom_job.labels#": 60,
            # The gate then adds gate= and dataset= to the version: 64.
            "upload-model model.labels#": 62,
        },
        settings={"LABELS": ""},
    ),
    Row(
        "tune-spot",
        {"tune": True, "scheduling_strategy": "SPOT"},
        {
            f"{TRAIN}.scheduling.strategy": "SPOT",
            f"{TUNE}.trial_job_spec.scheduling": {"timeout": "86400s", "restart_job_on_worker_restart": True},
        },
    ),
    Row("workers-0", {"worker_count": 0}, {f"{TRAIN}.worker_pool_specs#": 1}),
    Row(
        "custom serving image (TensorFlow Serving)",
        {"serving_image": "custom"},
        {
            "upload-model model.container_spec": {
                "image_uri": harness.SERVING_IMAGE,
                "predict_route": "/v1/models/model:predict",
                "health_route": "/v1/models/model",
            },
        },
    ),
    Row(
        "workers-4",
        {"worker_count": 4},
        {f"{TRAIN}.worker_pool_specs#": 2, f"{TRAIN}.worker_pool_specs[1].replica_count": 4},
    ),
    Row(
        "cpu-only",
        {**both("n1-standard-8"), "mixed_precision": False},
        {
            f"{TRAIN}.worker_pool_specs[0].machine_spec": spec_of("n1-standard-8"),
            f"{TRAIN}.worker_pool_specs[1].machine_spec": spec_of("n1-standard-8"),
        },
    ),
    Row(
        "a2-highgpu-8g",
        both("a2-highgpu-8g", A100, 8),
        {
            f"{TRAIN}.worker_pool_specs[0].machine_spec": spec_of("a2-highgpu-8g", A100, 8),
            f"{TRAIN}.worker_pool_specs[1].machine_spec": spec_of("a2-highgpu-8g", A100, 8),
        },
    ),
    Row(
        "a3-highgpu-8g",
        both("a3-highgpu-8g", H100, 8),
        {
            f"{TRAIN}.scheduling.strategy": "STANDARD",
            f"{TRAIN}.worker_pool_specs[0].machine_spec": spec_of("a3-highgpu-8g", H100, 8),
            f"{TRAIN}.worker_pool_specs[1].machine_spec": spec_of("a3-highgpu-8g", H100, 8),
        },
    ),
    Row(
        "g2-standard-48",
        both("g2-standard-48", L4, 4),
        {
            f"{TRAIN}.worker_pool_specs[0].machine_spec": spec_of("g2-standard-48", L4, 4),
            f"{TRAIN}.worker_pool_specs[1].machine_spec": spec_of("g2-standard-48", L4, 4),
        },
    ),
    Row(
        "gpu-region-unchecked",
        {"check_gpu_region": False},
        {
            f"{TRAIN}.worker_pool_specs[0].machine_spec": spec_of("n1-standard-8", V100, 1),
            "upload-first-model parent": "projects/p-proj/locations/europe-west2",
        },
        region="europe-west2",
    ),
    Row(
        "persistent-resource",
        {"persistent_resource_id": "warm-pool", "tune": True},
        {
            "prepare-dataset custom_job.job_spec.persistent_resource_id": "warm-pool",
            f"{TRAIN}.persistent_resource_id": "warm-pool",
            "evaluate-models custom_job.job_spec.persistent_resource_id": "warm-pool",
            # GCPC 2.22's HyperparameterTuningJobRunOp has no such input: trials run on demand.
            f"{TUNE}.trial_job_spec.persistent_resource_id": None,
        },
    ),
    Row(
        "dataflow",
        {"prepare_engine": "beam", "dataset_source": IMAGES},
        {
            f"{DATAFLOW}.environment.sdk_container_image": harness.DATAFLOW_IMAGE,
            f"{DATAFLOW}.environment.max_workers": 8,
            f"{DATAFLOW}.environment.machine_type": "n1-standard-4",
            f"{DATAFLOW}.parameters.source": IMAGES,
            f"{DATAFLOW}.parameters.engine": "beam",
        },
    ),
    Row(
        "dataflow-settings",
        {
            "prepare_engine": "beam",
            "dataset_source": IMAGES,
            "dataflow_max_workers": 40,
            "dataflow_machine_type": "n2-highcpu-16",
            "dataflow_subnetwork": "regions/us-central1/subnetworks/dataflow",
            "service_account": SERVICE_ACCOUNT,
            "network": NETWORK,
            "encryption_spec_key_name": KMS_KEY,
            "labels": {"team": "ml", "env": "dev"},
            "tune": True,
        },
        {
            f"{DATAFLOW}.environment.max_workers": 40,
            f"{DATAFLOW}.environment.machine_type": "n2-highcpu-16",
            f"{DATAFLOW}.environment.service_account_email": SERVICE_ACCOUNT,
            # Dataflow takes the network's name; Vertex jobs, projects/<number>/global/networks/<name>.
            f"{DATAFLOW}.environment.network": "vpc",
            f"{DATAFLOW}.environment.subnetwork": "regions/us-central1/subnetworks/dataflow",
            f"{DATAFLOW}.environment.kms_key_name": KMS_KEY,
            f"{DATAFLOW}.environment.additional_user_labels": {"team": "ml", "env": "dev", **SYSTEM_LABELS},
            f"{TRAIN}.network": NETWORK,
            f"{TUNE}.trial_job_spec.network": NETWORK,
        },
    ),
    # --- refused -------------------------------------------------------------------------------
    Row(
        "grid-search",
        {"tune": True, "search_algorithm": "GRID_SEARCH"},
        refused=("search_algorithm",),
        rule="GRID_SEARCH needs every study parameter INTEGER, CATEGORICAL or DISCRETE; the study has DOUBLE ones",
    ),
    Row(
        "tensorboard-without-service-account",
        {"tensorboard": TENSORBOARD},
        refused=("tensorboard", "service_account"),
        rule="a TensorBoard needs a service account (SERVICE_ACCOUNT unset)",
        settings={"SERVICE_ACCOUNT": ""},
    ),
    Row(
        "tensorboard-other-region",
        {
            "tensorboard": "projects/123/locations/europe-west4/tensorboards/456",
            "service_account": SERVICE_ACCOUNT,
        },
        refused=("tensorboard",),
        rule="the TensorBoard must be in the job's region",
    ),
    Row(
        "flex-start-v100",
        {"scheduling_strategy": "FLEX_START"},
        refused=("scheduling_strategy",),
        rule="FLEX_START takes L4, A100, H100, H200 or B200 GPUs, not V100",
    ),
    Row(
        "spot-lowercase",
        {"scheduling_strategy": "spot"},
        refused=("scheduling_strategy",),
        rule="Scheduling.Strategy is a case-sensitive enum (the launcher raises KeyError: 'spot')",
    ),
    Row(
        "flex-start-mixed-pools",
        {
            "scheduling_strategy": "FLEX_START",
            **machine("a3-highgpu-8g", H100, 8),
            **machine("a3-highgpu-4g", H100, 4, "worker"),
        },
        refused=("scheduling_strategy",),
        rule="FLEX_START needs one machine configuration in every pool",
    ),
    Row(
        "flex-start-long-timeout",
        {"scheduling_strategy": "FLEX_START", **both("a3-highgpu-8g", H100, 8), "timeout": "700000s"},
        refused=("timeout",),
        rule="FLEX_START jobs run at most 7 days (604800s)",
    ),
    Row(
        "flex-start-reduction-server",
        {"scheduling_strategy": "FLEX_START", **both("a3-highgpu-8g", H100, 8), "reduction_server_count": 1},
        refused=("reduction_server_count",),
        rule="FLEX_START needs one machine configuration; the Reduction Server pool is CPU machines",
    ),
    Row(
        "k80",
        {"chief_accelerator_type": "NVIDIA_TESLA_K80"},
        refused=("chief_accelerator_type",),
        rule="K80 is past end of support; TF 2.21 has no kernels for compute capability 3.7",
    ),
    Row(
        "gpu-not-in-region",
        {"worker_accelerator_type": "NVIDIA_TESLA_T4"},
        refused=("chief_accelerator_type",),
        rule="the region table lists no V100 in europe-west2 (check_gpu_region left true)",
        region="europe-west2",
    ),
    Row(
        "labels-uppercase",
        {"labels": {"Team": "ml"}},
        refused=("labels",),
        rule="label keys are lowercase letters, digits, _ and -, starting with a letter",
    ),
    Row(
        "labels-60",
        {"labels": {**LABELS_59, "k59": "v"}},
        refused=("labels",),
        rule="the model version gets pipeline_run, source_commit, Vertex's "
        "vertex-ai-pipelines-run-billing-id, and the gate's gate and dataset: 59 of its 64 labels are left",
        settings={"LABELS": ""},
    ),
    Row(
        "labels-reserved",
        {"labels": {"gate": "mine"}},
        refused=("labels",),
        rule="the run sets pipeline_run, source_commit, gate and dataset on the model version itself",
        settings={"LABELS": ""},
    ),
    Row(
        "cmek-other-region",
        {"encryption_spec_key_name": "projects/p-proj/locations/europe-west4/keyRings/r/cryptoKeys/k"},
        refused=("encryption_spec_key_name",),
        rule="the CMEK key must be in the job's region",
    ),
    Row(
        "persistent-resource-bad-id",
        {"persistent_resource_id": "Warm_Pool"},
        refused=("persistent_resource_id",),
        rule="a persistent resource's ID is 1 to 63 lowercase letters, digits and hyphens, starting with a letter "
        "(CreatePersistentResourceRequest.persistent_resource_id)",
    ),
    Row(
        "persistent-resource-spot",
        {"persistent_resource_id": "warm-pool", "scheduling_strategy": "SPOT"},
        refused=("persistent_resource_id", "scheduling_strategy"),
        rule="a job on a persistent resource runs on the resource's machines: SPOT and FLEX_START choose "
        "machines started for a job",
    ),
    Row(
        "dataflow-tfds",
        {"prepare_engine": "beam"},
        refused=("dataset_source", "prepare_engine"),
        rule="TFDS builds cassava in one process before Beam starts (its generator is no Beam transform): "
        "on Dataflow that is the Flex Template's launcher, whose time Dataflow bounds",
    ),
    Row(
        "dataflow-subnetwork-other-region",
        {
            "prepare_engine": "beam",
            "dataset_source": IMAGES,
            "dataflow_subnetwork": "regions/europe-west4/subnetworks/dataflow",
        },
        refused=("dataflow_subnetwork",),
        rule="the Dataflow job runs in the pipeline's region, its workers in a subnetwork of that region",
    ),
    Row(
        "dataflow-max-workers-0",
        {"prepare_engine": "beam", "dataset_source": IMAGES, "dataflow_max_workers": 0},
        refused=("dataflow_max_workers",),
        rule="Dataflow takes 1 to 1000 workers (FlexTemplateRuntimeEnvironment.max_workers); GCPC's "
        "launcher would drop a 0 from the request and Dataflow choose the count",
    ),
    Row(
        "three-at-once",
        {
            "scheduling_strategy": "spot",
            "labels": {"Team": "ml"},
            "chief_accelerator_type": "NVIDIA_TESLA_K80",
        },
        refused=("scheduling_strategy", "labels", "chief_accelerator_type"),
        rule="every bad parameter named in one error",
    ),
)
ACCEPTED = [r for r in ROWS if r.accepted]
REFUSED = [r for r in ROWS if not r.accepted]


def ids(rows: list[Row]) -> list[str]:
    return [r.name for r in rows]


# --- the matrix itself ----------------------------------------------------------------------------


def test_the_matrix_is_made_of_real_parameters() -> None:
    names = [r.name for r in ROWS]
    assert len(set(names)) == len(names), "row names repeat"
    assert len(ACCEPTED) >= 15
    parameters = {q.name: q for q in pipeline.parameters_for("vertex")}
    for row in ROWS:
        for name, value in row.values.items():
            assert name in parameters, f"{row.name}: {name} is no pipeline parameter of the vertex target"
            kind = parameters[name].type
            assert isinstance(value, kind) and (kind is bool or not isinstance(value, bool)), (
                f"{row.name}: {name}={value!r} is not a {kind.__name__}"
            )
        for key in row.carries:
            task, _, path = key.partition(" ")
            assert task and path, f"{row.name}: {key!r} is not '<task> <path>'"


# --- accepted rows: the launchers -----------------------------------------------------------------


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    """The committed template, read once: the one `make run` submits."""
    return harness.load_template(pipeline.COMPILED)


@pytest.fixture(scope="module")
def fake_vertex() -> Iterator[harness.VertexFake]:
    fake = harness.VertexFake().start()
    yield fake
    fake.stop()


@pytest.fixture
def launchers(
    fake_vertex: harness.VertexFake, monkeypatch: pytest.MonkeyPatch
) -> Iterator[harness.VertexFake]:
    with harness.launchers_against(fake_vertex, monkeypatch) as fake:
        yield fake


CONTEXT_URI = "gs://p-proj-pipelines/root/contexts/src-0123456789abcdef0123.tar.gz"


def submitted_values(fake: RestFake, row: Row) -> dict[str, Any]:
    """The parameter values `make run` submits for the row: its flags over the made-up project's
    settings (service account, network, labels, CMEK key), as `launch.submit` merges them."""
    config = settings.load(environ(fake, row), Path("/nonexistent"))
    return submit.pipeline_parameters(dict(row.values), config, CONTEXT_URI, harness.SOURCE_COMMIT)


def root_for(spec: dict[str, Any], fake: RestFake, row: Row) -> dict[str, Any]:
    """The run's parameter values: the compiled defaults under what `make run` submits."""
    from tests.test_pipeline import root_values

    given = submitted_values(fake, row)
    missing = set(given) - set(spec["root"]["inputDefinitions"]["parameters"])
    assert not missing, f"the compiled template has no parameter {sorted(missing)}: run `make compile`"
    return root_values(spec, **given)


def same(actual: Any, expected: Any) -> bool:
    """Equal, reading proto JSON's int64-as-string ("2") as a number."""
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and actual.keys() == expected.keys()
            and all(same(actual[k], v) for k, v in expected.items())
        )
    if isinstance(expected, list):
        return isinstance(actual, list) and len(actual) == len(expected) and all(map(same, actual, expected))
    if isinstance(expected, int) and not isinstance(expected, bool) and isinstance(actual, str):
        return actual.lstrip("-").isdigit() and int(actual) == expected
    return bool(actual == expected)


def numbers(value: Any) -> Any:
    """int64 fields (JSON strings) as numbers, to compare requests with the specs built."""
    if isinstance(value, dict):
        return {k: numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [numbers(v) for v in value]
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value):
        return int(value)
    return value


def label_problems(labels: Mapping[str, str]) -> list[str]:
    """Google Cloud's label rules (at most 64; keys and values of lowercase letters, digits, _
    and -, at most 63 characters; keys start with a letter)."""
    bad = [f"{k}={v}" for k, v in labels.items() if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k)]
    bad += [f"{k}={v}" for k, v in labels.items() if not re.fullmatch(r"[a-z0-9_-]{0,63}", v)]
    return bad + ([f"{len(labels)} labels (at most 64)"] if len(labels) > 64 else [])


def check_custom_job(run: Run, task: str, planned: str) -> None:
    root, request = run.root, run.requests[task]
    assert isinstance(request, aiplatform_v1.CreateCustomJobRequest)
    assert request.parent == f"projects/{harness.PROJECT}/locations/{run.region}"
    job = as_dict(request)["custom_job"]
    spec = job["job_spec"]
    assert job["display_name"] == task
    assert numbers(spec["worker_pool_specs"]) == numbers(run.pools[planned]), task
    assert spec["base_output_directory"] == {"output_uri_prefix": run.job_dir(planned)}
    scheduling = spec["scheduling"]
    strategy = root["scheduling_strategy"] if task == "train-model" else "STANDARD"
    assert scheduling["strategy"] == strategy
    assert ("max_wait_duration" in scheduling) is (strategy == "FLEX_START")
    assert scheduling["timeout"] == root["timeout"]
    restart = root["restart_job_on_worker_restart"] if task == "train-model" else False
    assert scheduling.get("restart_job_on_worker_restart", False) is restart
    for field in ("service_account", "network", "persistent_resource_id"):
        assert spec.get(field, "") == root[field], f"{task}: {field}"
    assert spec.get("tensorboard", "") == (root["tensorboard"] if task == "train-model" else "")
    assert job.get("encryption_spec", {}).get("kms_key_name", "") == root["encryption_spec_key_name"]
    assert job.get("labels", {}) == {**SYSTEM_LABELS, **root["labels"]}
    assert not label_problems(job.get("labels", {})), label_problems(job["labels"])


def check_tuning_job(run: Run) -> None:
    from components import tuning

    root, request = run.root, run.requests["tune-hyperparameters"]
    assert isinstance(request, aiplatform_v1.CreateHyperparameterTuningJobRequest)
    assert request.parent == f"projects/{harness.PROJECT}/locations/{run.region}"
    job = as_dict(request)["hyperparameter_tuning_job"]
    assert job["display_name"] == "tune-hyperparameters"
    for field in ("max_trial_count", "parallel_trial_count", "max_failed_trial_count"):
        assert job.get(field, 0) == root[field], field
    study = job["study_spec"]
    algorithm = root["search_algorithm"]
    assert study.get("algorithm") == (None if algorithm == "ALGORITHM_UNSPECIFIED" else algorithm)
    assert study["metrics"] == [{"metric_id": tuning.METRIC_ID, "goal": "MAXIMIZE"}]
    # The study's space: the `search_space` parameter where the template has one.
    space = root.get("search_space", tuning.VERTEX_SEARCH_SPACE)
    assert [p["parameter_id"] for p in study["parameters"]] == [p["parameter_id"] for p in space]
    selection = {"best": "BEST_MEASUREMENT", "last": "LAST_MEASUREMENT"}[root["export_epoch"]]
    assert study["measurement_selection_type"] == selection
    trial = job["trial_job_spec"]
    assert numbers(trial["worker_pool_specs"]) == numbers(run.pools["tuning"])
    for pool in trial["worker_pool_specs"][:2]:  # the service adds each trial's --<parameter_id>=
        flags = {a.split("=")[0] for a in pool["container_spec"].get("args", [])}
        assert not flags & {f"--{p['parameter_id']}" for p in space}
    assert trial["base_output_directory"] == {"output_uri_prefix": run.job_dir("tuning")}
    for field in ("service_account", "network"):
        assert trial.get(field, "") == root[field], field
    assert job.get("encryption_spec", {}).get("kms_key_name", "") == root["encryption_spec_key_name"]
    # Each trial runs at most the run's timeout, and restarts as the training job does
    # (`tuning.hyperparameter_tuning_job` adds both; GCPC's launcher drops a false, Vertex's default).
    restart = {"restart_job_on_worker_restart": True} if root["restart_job_on_worker_restart"] else {}
    assert trial.get("scheduling") == {"timeout": root["timeout"], **restart}
    # What GCPC 2.22's op cannot send (no such inputs): the run's labels, a scheduling strategy,
    # a TensorBoard. Pinned so that a GCPC that adds them is noticed.
    assert job.get("labels", {}) == SYSTEM_LABELS
    assert "tensorboard" not in trial
    assert "persistent_resource_id" not in trial  # the op has no such input: trials run on demand


def check_upload(run: Run, task: str) -> None:
    request = run.requests[task]
    assert isinstance(request, aiplatform_v1.UploadModelRequest)
    assert request.parent == f"projects/{harness.PROJECT}/locations/{run.region}"
    data = as_dict(request)
    model = data["model"]
    assert model["display_name"] == run.root["model_display_name"]
    settings = {
        name: run.upstream[("upload-settings", name)]
        for name in ("artifact_uri", "predict_route", "health_route")
    }
    assert model["artifact_uri"] == settings["artifact_uri"]
    # The SavedModel the training job published, where the serving image looks for it.
    assert (
        servingimage.saved_model_folder(model["artifact_uri"], settings["predict_route"])
        == (run.upstream[("plan-jobs", "model_uri")])
    )
    routes = {k: v for k, v in settings.items() if k != "artifact_uri" and v}  # "": unset, the image's own
    assert model["container_spec"] == {
        "image_uri": run.upstream[("upload-settings", "serving_image")],
        **routes,
    }
    assert model.get("encryption_spec", {}).get("kms_key_name", "") == run.root["encryption_spec_key_name"]
    assert model["labels"] == {**SYSTEM_LABELS, **run.upstream[("upload-settings", "labels")]}
    assert "description" not in model  # the gate writes the version's own description afterwards
    assert not label_problems(model["labels"]), label_problems(model["labels"])
    assert model["pipeline_job"] == (
        f"projects/{harness.PROJECT}/locations/{run.region}/pipelineJobs/{harness.PIPELINE_JOB_UUID}"
    )
    new_version = bool(run.upstream[("find-champion", "resource_name")])
    assert data.get("parent_model") == (harness.champion_name(run.region) if new_version else None)
    # The gate reads a versioned name (...@VERSION) from the model artifact.
    [artifact] = run.outputs[task]["executor_output"]["artifacts"]["model"]["artifacts"]
    assert re.fullmatch(r"projects/.+/models/\d+@\d+", artifact["metadata"]["resourceName"]), artifact


DATAFLOW_STEPS = ("launch-dataflow-preparation", "wait-dataflow-preparation")


def check_dataflow(run: Run) -> None:
    """prepare_engine=beam: the Flex Template launch GCPC's launcher POSTed (parsed strictly into
    dataflow_v1beta3's LaunchFlexTemplateRequest by the fake), against the plan and the run's
    settings; the spec file the plan wrote, as Dataflow reads it (ContainerSpec); and the wait
    step, which polled the very job the launch made until it was done."""
    from google.cloud import dataflow_v1beta3

    from tests.fakes import strict_json

    root, request = run.root, run.requests["launch-dataflow-preparation"]
    assert isinstance(request, dataflow_v1beta3.LaunchFlexTemplateRequest)
    assert (request.project_id, request.location) == (harness.PROJECT, run.region)
    launch = as_dict(request)["launch_parameter"]
    template = run.upstream[("plan-jobs", "dataflow_template")]
    assert launch["container_spec_gcs_path"] == template
    assert template.startswith(run.job_dir("prepare") + "/")
    parameters = run.upstream[("plan-jobs", "dataflow_parameters")]
    assert launch["parameters"] == parameters
    # The dataset lands where the training and evaluation read it.
    assert parameters["output_dir"] == run.upstream[("plan-jobs", "dataset_uri")]
    assert parameters["engine"] == "beam"
    assert parameters["champion_class_names"] == json.dumps(harness.CLASS_NAMES)
    spec = strict_json(dataflow_v1beta3.ContainerSpec, json.loads(run.local_file(template).read_text()))
    assert spec.image == harness.DATAFLOW_IMAGE
    assert sorted(p.name for p in spec.metadata.parameters) == sorted(parameters)
    env = launch["environment"]
    assert env["sdk_container_image"] == harness.DATAFLOW_IMAGE
    assert int(env["max_workers"]) == root["dataflow_max_workers"]
    assert env["machine_type"] == root["dataflow_machine_type"]
    assert env.get("service_account_email", "") == root["service_account"]
    assert env.get("kms_key_name", "") == root["encryption_spec_key_name"]
    assert env.get("network", "") == run.upstream[("plan-jobs", "dataflow_network")]
    assert env.get("subnetwork", "") == root["dataflow_subnetwork"]
    folder = run.upstream[("plan-jobs", "dataflow_temp_location")]
    assert env["temp_location"] == env["staging_location"] == folder
    assert env.get("additional_user_labels", {}) == {**SYSTEM_LABELS, **root["labels"]}
    assert not label_problems(env.get("additional_user_labels", {}))
    launched = run.outputs["launch-dataflow-preparation"]["gcp_resources"]["resources"]
    [job] = [r["resourceUri"] for r in launched if r["resourceType"] == "DataflowJob"]
    assert job.startswith(
        f"https://dataflow.googleapis.com/v1b3/projects/{harness.PROJECT}/locations/{run.region}/"
    )
    polled = run.requests["wait-dataflow-preparation"]
    assert len(polled) == 3 and {job.rsplit("/", 1)[1]} == set(polled), polled  # QUEUED, RUNNING, DONE
    assert run.outputs["wait-dataflow-preparation"]["gcp_resources"]["resources"] == launched
    assert "prepare-dataset" not in run.requests


def check_run(run: Run) -> None:
    for task, endpoints in run.endpoints.items():
        host = (
            "dataflow.googleapis.com" if task in DATAFLOW_STEPS else f"{run.region}-aiplatform.googleapis.com"
        )
        assert endpoints and set(endpoints) == {host}, (task, endpoints)
    if run.dataflow:
        check_dataflow(run)
    else:
        check_custom_job(run, "prepare-dataset", "prepare")
        prepare = as_dict(run.requests["prepare-dataset"])["custom_job"]["job_spec"]["worker_pool_specs"][0]
        assert (
            f"--champion_class_names={json.dumps(harness.CLASS_NAMES)}" in prepare["container_spec"]["args"]
        )
    check_custom_job(run, "train-model", "training")
    check_custom_job(run, "evaluate-models", "evaluation")
    evaluation = as_dict(run.requests["evaluate-models"])["custom_job"]["job_spec"]["worker_pool_specs"]
    assert [int(pool["replica_count"]) for pool in evaluation] == [1]  # one CPU replica
    assert "accelerator_type" not in evaluation[0]["machine_spec"]
    assert evaluation[0]["container_spec"]["command"] == ["python", "-m", "trainer.evaluate"]
    assert evaluation[0]["container_spec"]["args"] == [
        f"--data_dir={run.upstream[('plan-jobs', 'dataset_uri')]}",
        f"--model_dir={run.upstream[('plan-jobs', 'model_uri')]}",
        f"--champion_dir={run.upstream[('find-champion', 'champion_uri')]}",
    ]
    assert (
        f"--champion_dir={run.upstream[('find-champion', 'champion_uri')]}"
        in evaluation[0]["container_spec"]["args"]
    )
    train_args = as_dict(run.requests["train-model"])["custom_job"]["job_spec"]["worker_pool_specs"][0]
    assert train_args["container_spec"]["args"] == run.pools["training"][0]["container_spec"]["args"]
    if run.tune:
        check_tuning_job(run)
        for name, value in harness.BEST_TRIAL.items():
            assert f"--{name}={value}" in train_args["container_spec"]["args"]
    else:
        assert "tune-hyperparameters" not in run.requests
    check_upload(run, "upload-model")


@pytest.mark.parametrize("row", ACCEPTED, ids=ids(ACCEPTED))
def test_the_launchers_send_what_the_row_asks(
    row: Row, template: dict[str, Any], launchers: harness.VertexFake, tmp_path: Path
) -> None:
    run = harness.plan(template, root_for(template, launchers.rest, row), tmp_path / "gcs")
    if row.values.get("check_gpu_region") is False:
        assert run.warnings["plan-jobs"], "check_gpu_region=false: the region check must warn"
    for task in harness.launched_tasks(run):
        harness.launch(run, task, launchers, tmp_path)
    check_run(run)
    # The same template when the registry has no such model yet: one upload, of a first model.
    first = harness.first_model(run)
    harness.launch(first, "upload-model", launchers, tmp_path / "first")
    check_upload(first, "upload-model")
    run.requests["upload-first-model"] = first.requests["upload-model"]
    wrong = []
    for key, expected in row.carries.items():
        task, _, path = key.partition(" ")
        actual = lookup(as_dict(run.requests[task]), path)
        if not same(actual, expected):
            wrong.append(f"{key}: {actual!r}, expected {expected!r}")
    assert not wrong, "\n".join(wrong)


def test_the_fakes_refuse_what_aiplatform_v1_does_not_declare(fake_vertex: harness.VertexFake) -> None:
    """The strictness the tier relies on: a field unknown to the request type fails the RPC."""
    import grpc
    import requests

    request = aiplatform_v1.CreateCustomJobRequest(parent="projects/p/locations/us-central1")
    unknown = bytes([0xB8, 0x3E, 0x01])  # field 999, varint 1
    channel = grpc.insecure_channel(fake_vertex.grpc.address)
    call = channel.unary_unary(
        f"/{harness.JOBS}/CreateCustomJob", request_serializer=None, response_deserializer=None
    )
    fake_vertex.reset()
    with pytest.raises(grpc.RpcError):
        call(aiplatform_v1.CreateCustomJobRequest.serialize(request) + unknown, timeout=10)
    channel.close()
    assert fake_vertex.refusals() == ["CreateCustomJobRequest: unknown fields CreateCustomJobRequest: #999"]
    fake_vertex.reset()
    answer = requests.post(
        f"http://{fake_vertex.rest.address}/v1/projects/p/locations/us-central1/models:upload",
        json={"model": {"display_name": "m", "serving_container": {}}},
        timeout=10,
    )
    assert answer.status_code == 400 and "serving_container" in answer.text
    assert fake_vertex.refusals() and fake_vertex.requests() == []
    fake_vertex.reset()


# --- the front door -------------------------------------------------------------------------------


def flags(values: Mapping[str, Any]) -> list[str]:
    """The row's values as `make run` / `make schedule` flags."""
    out = []
    for name, value in values.items():
        if isinstance(value, bool):
            text = str(value).lower()
        elif isinstance(value, dict | list):
            text = json.dumps(value)
        else:
            text = str(value)
        out += [f"--{name}", text]
    return out


def environ(fake: RestFake, row: Row) -> dict[str, str]:
    """The made-up project's settings (tests.contract.test_submit.env) in the row's region."""
    region = row.region
    return env(
        fake,
        REGION=region,
        ARTIFACT_REPOSITORY=f"{region}-docker.pkg.dev/p-proj/training",
        TEMPLATE_REPOSITORY=f"https://{region}-kfp.pkg.dev/p-proj/pipelines",
        **row.settings,
    )


def accept_pipeline_jobs(fake: RestFake) -> None:
    """`fake` answers PipelineJob creations in any region (the `vertex` fixture: us-central1), and
    reads of a persistent resource with one that runs the made-up project's default run
    (tests/contract/test_persistent_resource.py `fitting`)."""
    from google.protobuf import json_format

    from tests.contract.test_persistent_resource import fitting

    def create_job(match: re.Match[str], query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        return 200, {**body, "name": f"{match.group(1)}/{query['pipelineJobId'][0]}"}

    def get_resource(match: re.Match[str], _q: Any, _b: Any) -> tuple[int, Any]:
        resource = fitting()
        resource.name = match.group(1)
        return 200, json_format.MessageToDict(aiplatform_v1.PersistentResource.pb(resource))

    fake.route("POST", PIPELINE_JOBS, create_job)
    fake.route(
        "GET", r"/v1/(projects/p-proj/locations/[a-z0-9-]+/persistentResources/[a-z0-9-]+)", get_resource
    )


@pytest.fixture
def front_door(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, list[str]]]:
    """`make run` and `make schedule` as they are, with the SDK on the fakes: anonymous
    credentials over REST (to API_ENDPOINT, the fake Vertex API), a clean checkout, and no
    template upload to a real Artifact Registry (recorded, and refused with a ValueError)."""
    from google.cloud.aiplatform.utils import yaml_utils

    real_init = submit.init_aiplatform
    real_load = yaml_utils._load_yaml_from_local_file
    sent: dict[str, list[str]] = {"template uploads": []}

    def init(config: Any, credentials: Any = None, transport: str | None = None) -> None:
        real_init(config, credentials or AnonymousCredentials(), transport or "rest")

    def upload_template(config: Any, template: Path = pipeline.COMPILED, *args: Any, **kwargs: Any) -> str:
        sent["template uploads"].append(str(template))
        raise ValueError("conformance: make schedule tried to upload the template to Artifact Registry")

    def load(path: str) -> dict[str, Any]:
        # The SDK parses the template with pure-Python YAML (~1 s): once per file and content.
        key = (str(path), Path(path).stat().st_mtime_ns)
        if key not in TEMPLATES_READ:
            TEMPLATES_READ[key] = real_load(path)
        return copy.deepcopy(TEMPLATES_READ[key])

    monkeypatch.setattr(yaml_utils, "_load_yaml_from_local_file", load)
    monkeypatch.setattr(submit, "init_aiplatform", init)
    monkeypatch.setattr(submit, "source_commit", lambda *a, **k: harness.SOURCE_COMMIT)
    monkeypatch.setattr(schedules, "upload_template", upload_template)
    monkeypatch.chdir(tmp_path)  # no env.sh
    yield sent


@pytest.fixture(scope="module")
def pipelines_api() -> Iterator[RestFake]:
    """A fake Vertex REST API for the accepted rows' PipelineJobs (one for the module: they
    only need the creation answered)."""
    fake = RestFake()
    accept_pipeline_jobs(fake)
    yield fake
    fake.stop()


PIPELINE_JOBS = r"/v1/(projects/p-proj/locations/[a-z0-9-]+/pipelineJobs)"
TEMPLATES_READ: dict[tuple[str, int], dict[str, Any]] = {}


def named_parameters(stderr: str) -> set[str]:
    """The parameters that lines of stderr start with (`make run: a, b: why`, `a: why`)."""
    names: set[str] = set()
    for line in stderr.splitlines():
        line = re.sub(r"^make (run|schedule)( CRON=\.\.\.)?: ", "", line.strip()).lstrip("-* ")
        match = re.match(r"^([a-z_][a-z0-9_]*(?:, [a-z_][a-z0-9_]*)*):", line)
        if match:
            names |= set(match.group(1).split(", "))
    return names


@pytest.mark.parametrize("row", REFUSED, ids=ids(REFUSED))
def test_refused_before_any_request(
    row: Row,
    vertex: RestFake,
    gcs: Any,
    front_door: dict[str, list[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    accept_pipeline_jobs(vertex)  # a request to another region is recorded, not a crash
    variables = environ(vertex, row)
    doors = {
        "make run": lambda: cli.main(["run", "--target", "vertex", *flags(row.values)], variables),
        "make schedule": lambda: schedules.schedule_command(
            ["schedule", *flags(row.values)], {**variables, "CRON": "0 6 * * 1"}
        ),
    }
    problems = []
    for door, call in doors.items():
        code = call()
        err = capsys.readouterr().err
        missing = set(row.refused) - named_parameters(err)
        sent = [f"{m} {p}" for m, p, _, _ in vertex.requests]
        sent += [f"gs://{BUCKET}/{b.name}" for b in gcs.list_blobs(BUCKET)]
        sent += [f"template upload {t}" for t in front_door["template uploads"]]
        sent += [f"bucket probe {p}" for p in vertex.probes]  # type: ignore[attr-defined]
        vertex.requests.clear()  # each door is judged on what it sent itself
        vertex.probes.clear()  # type: ignore[attr-defined]
        front_door["template uploads"].clear()
        for blob in gcs.list_blobs(BUCKET):
            blob.delete()
        if code != 2 or missing or sent:
            problems.append(
                f"{door}: exit {code}"
                + (f"; stderr names no line starting with {sorted(missing)}" if missing else "")
                + (f"; sent {sent}" if sent else "")
                + f"\n  stderr: {err.strip()[-600:]!r}"
            )
    assert not problems, f"{row.name} ({row.rule}):\n" + "\n".join(problems)


@pytest.mark.parametrize("row", ACCEPTED, ids=ids(ACCEPTED))
def test_accepted_by_make_run(
    row: Row,
    pipelines_api: RestFake,
    front_door: dict[str, list[str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The rules let every accepted row through, and the PipelineJob carries the very values the
    launchers were run with above."""
    from google.cloud.aiplatform.utils import gcs_utils

    probe = "create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist"
    monkeypatch.setattr(gcs_utils, probe, lambda *a, **k: None)  # as the `vertex` fixture does
    monkeypatch.setattr(submit, "upload_context", lambda *a, **k: CONTEXT_URI)
    pipelines_api.requests.clear()
    code = cli.main(["run", "--target", "vertex", *flags(row.values)], environ(pipelines_api, row))
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    if row.values.get("check_gpu_region") is False:  # the region table's refusal, as a warning
        assert re.search(rf"WARNING: .*not offered in {row.region}", out), out[-2000:]
    [body] = [b for m, p, _, b in pipelines_api.requests if m == "POST" and re.fullmatch(PIPELINE_JOBS, p)]
    sent = body["runtimeConfig"]["parameterValues"]
    expected = submitted_values(pipelines_api, row)
    assert same(sent, expected), f"sent {sent}\nlaunchers ran with {expected}"


# --- the doc --------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    """A value as the doc shows it: as a flag takes it; many labels abbreviated."""
    if isinstance(value, dict) and len(value) > 6:
        names = list(value)
        return f"{{{len(value)} labels: {names[0]}..{names[-1]}}}"
    return flags({"x": value})[1]


def _code(value: Any) -> str:
    return f"`{_text(value)}`"


def matrix_markdown(rows: tuple[Row, ...] = ROWS) -> str:
    """The table of docs/guarantees.md ("The matrix", in its conformance section)."""
    lines = [
        "| Row | Sets | Outcome |",
        "|---|---|---|",
    ]
    for row in rows:
        sets = ", ".join(f"`{k}={_text(v)}`" for k, v in row.values.items()) or "(defaults)"
        if row.region != "us-central1":
            sets += f"; REGION `{row.region}`"
        sets += "".join(f"; {k} `{v or '(unset)'}`" for k, v in row.settings.items())
        if row.accepted and row.values.get("prepare_engine") == "beam":
            launched = (
                "flex_template (launch-dataflow-preparation), wait_gcp_resources (wait-dataflow-preparation)"
            )
            launched += ", custom_job (train-model, evaluate-models)"
        else:
            launched = "custom_job (prepare-dataset, train-model, evaluate-models)"
        if row.accepted:
            if row.values.get("tune"):
                launched += ", hyperparameter_tuning_job (tune-hyperparameters)"
            launched += ", upload_model (upload-model: a new version, and a first model)"
            carried = "; ".join(
                f"{k.split(' ', 1)[0]} `{k.split(' ', 1)[1]}` = " + ("absent" if v is None else _code(v))
                for k, v in row.carries.items()
            )
            outcome = f"accepted; launchers: {launched}. Carries: {carried}"
        else:
            outcome = f"refused, naming {', '.join(f'`{p}`' for p in row.refused)}: {row.rule}"
        lines.append(f"| {row.name} | {sets} | {outcome} |")
    return "\n".join(lines) + "\n"


def test_the_doc_table_is_the_matrix() -> None:
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"{DOC.name} has lost its {BEGIN} ... {END} markers"
    table = text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"
    assert table == matrix_markdown(), (
        "docs/guarantees.md's conformance table differs from ROWS: run "
        "`.venv/bin/python -m tests.conformance.test_conformance` to regenerate it"
    )


def write_doc() -> None:
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    DOC.write_text(f"{head}{BEGIN}\n{matrix_markdown()}{END}{tail}")


if __name__ == "__main__":
    write_doc()
    sys.stdout.write(f"wrote the matrix of {DOC.relative_to(ROOT)}\n")
