"""The persistent resource (`persistent_resource_id`, the PERSISTENT_RESOURCE_ID setting): the
compiled template binds it to every CustomTrainingJobOp and to no tuning job; the rendered job
payloads parse into aiplatform_v1 `CustomJob` carrying it; the offline rules; and `make run` /
`make schedule` reading the resource with the real aiplatform_v1 `PersistentResourceServiceClient`
from a fake Vertex API (REST, and gRPC), refusing an unfit one in one line before anything of the
run is uploaded or created
(docs/architecture.md#a-warm-pool-the-jobs-on-a-vertex-persistent-resource)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform_v1
from google.cloud.aiplatform_v1.services.persistent_resource_service.transports.grpc import (
    PersistentResourceServiceGrpcTransport,
)
from google.protobuf import json_format

import pipeline
from launch import cli, cloud, schedules, settings, submit
from pipeline import options
from pipeline.options import persistent_resource
from tests.contract.test_submit import BUCKET, JOBS, env, vertex  # noqa: F401 (vertex: a fixture)
from tests.fakes import Abort, GrpcFake, RestFake, insecure_client
from tests.test_pipeline import render_payload, root_values

ROOT = Path(__file__).resolve().parents[2]
RESOURCE_ID = "warm-pool"
RESOURCE = f"/v1/projects/p-proj/locations/us-central1/persistentResources/{RESOURCE_ID}"
NETWORK = "projects/123456/global/networks/vpc"  # the NETWORK of tests.contract.test_submit.env
KMS_KEY = "projects/p-proj/locations/us-central1/keyRings/r/cryptoKeys/k"
V100 = aiplatform_v1.AcceleratorType.NVIDIA_TESLA_V100
STATE = aiplatform_v1.PersistentResource.State
CUSTOM_JOBS = ("prepare-dataset", "train-model", "evaluate-models")


# --- the compiled template ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return dict(json.loads(pipeline.COMPILED.read_text()))


def tasks(spec: dict[str, Any], dag: dict[str, Any] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """(display name, task) over every DAG, both branches' copies included."""
    for task in (dag or spec["root"]["dag"])["tasks"].values():
        yield task["taskInfo"]["name"], task
        component = spec["components"][task["componentRef"]["name"]]
        if "dag" in component:
            yield from tasks(spec, component["dag"])


@pytest.mark.parametrize("template", [pipeline.COMPILED, pipeline.COMPILED_NOTIFY], ids=["plain", "notify"])
def test_every_custom_job_and_no_tuning_job_takes_the_parameter(template: Path) -> None:
    from kfp.pipeline_spec import pipeline_spec_pb2

    spec = json.loads(template.read_text())
    json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec(), ignore_unknown_fields=False)
    root = spec["root"]["inputDefinitions"]["parameters"]["persistent_resource_id"]
    assert (root["parameterType"], root["defaultValue"]) == ("STRING", "")
    seen: dict[str, int] = {}
    for name, task in tasks(spec):
        bound = task.get("inputs", {}).get("parameters", {}).get("persistent_resource_id")
        if name in CUSTOM_JOBS:
            # Bound to the pipeline parameter, never left to GCPC's default placeholder (which
            # only a v1beta1 PipelineJob's default runtime fills).
            assert bound is not None, name
            assert (
                bound["componentInputParameter"].removeprefix("pipelinechannel--") == "persistent_resource_id"
            )
            seen[name] = seen.get(name, 0) + 1
        else:
            assert bound is None, f"{name} takes persistent_resource_id"
    # The training and evaluation jobs are in both tuning branches of both preparation branches
    # (a job, or Dataflow: the Dataflow launch takes no persistent resource).
    assert seen == {"prepare-dataset": 1, "train-model": 4, "evaluate-models": 4}
    tuning = next(t for n, t in tasks(spec) if n == "tune-hyperparameters")
    component = spec["components"][tuning["componentRef"]["name"]]
    assert "persistent_resource_id" not in component.get("inputDefinitions", {}).get("parameters", {})


def custom_job(spec: dict[str, Any], display: str, resource_id: str) -> aiplatform_v1.CustomJob:
    """The task's CustomJob payload, rendered as Vertex renders it, parsed strictly."""
    from tests.test_pipeline import default_pools

    pools = default_pools(spec)
    root = root_values(spec, project="p", location="us-central1", persistent_resource_id=resource_id)
    upstream = {
        ("plan-jobs", f"{job}_{kind}"): value
        for job in ("prepare", "training", "evaluation")
        for kind, value in (("pools", pools), ("dir", f"gs://b/root/run/{job}"))
    }
    upstream[("best-trial", "worker_pool_specs")] = pools
    payload = render_payload(spec, display, upstream, root)
    raw = aiplatform_v1.CustomJob.pb(aiplatform_v1.CustomJob())
    json_format.ParseDict(payload, raw, ignore_unknown_fields=False)
    return aiplatform_v1.CustomJob.wrap(raw)


@pytest.mark.parametrize("display", CUSTOM_JOBS)
def test_the_job_payload_carries_the_resource_and_parses_as_a_custom_job(
    spec: dict[str, Any], display: str
) -> None:
    assert custom_job(spec, display, RESOURCE_ID).job_spec.persistent_resource_id == RESOURCE_ID
    assert custom_job(spec, display, "").job_spec.persistent_resource_id == ""  # on demand


# --- the offline rules -------------------------------------------------------------------------


def vertex_values(**given: Any) -> dict[str, Any]:
    values = {q.name: q.default_for("vertex") for q in pipeline.parameters_for("vertex")}
    values.update(project="p-proj", location="us-central1", notification_emails=None)
    return {**values, **given}


@pytest.mark.parametrize("resource_id", ["warm-pool", "a", "a" * 63, "pool-2"])
def test_an_id_of_googles_form_passes(resource_id: str) -> None:
    options.check(vertex_values(persistent_resource_id=resource_id), "vertex", "us-central1")
    assert persistent_resource.persistent_resource_id_problem(resource_id) == ""


@pytest.mark.parametrize(
    ("resource_id", "said"),
    [
        ("Warm-Pool", "got 'Warm-Pool'"),
        ("2pool", "starting with a letter"),
        ("pool-", "not ending with a hyphen"),
        ("a" * 64, "1 to 63"),
        ("warm_pool", "lowercase letters, digits and hyphens"),
        (
            "projects/p-proj/locations/us-central1/persistentResources/warm-pool",
            "give the ID alone ('warm-pool')",
        ),
    ],
)
def test_a_bad_id_is_refused_naming_the_parameter(resource_id: str, said: str) -> None:
    with pytest.raises(options.OptionsError) as info:
        options.check(vertex_values(persistent_resource_id=resource_id), "vertex", "us-central1")
    assert info.value.parameters == {"persistent_resource_id"}
    assert said in str(info.value) and "CreatePersistentResourceRequest.persistent_resource_id" in str(
        info.value
    )


@pytest.mark.parametrize("strategy", ["SPOT", "FLEX_START"])
def test_spot_and_flex_start_are_refused_on_a_resource(strategy: str) -> None:
    values = vertex_values(
        persistent_resource_id=RESOURCE_ID,
        scheduling_strategy=strategy,
        chief_accelerator_type="NVIDIA_L4",
        worker_accelerator_type="NVIDIA_L4",
        chief_machine_type="g2-standard-8",
        worker_machine_type="g2-standard-8",
    )
    with pytest.raises(options.OptionsError) as info:
        options.check(values, "vertex", "us-central1")
    [line] = [line for line in str(info.value).splitlines() if line.startswith("persistent_resource_id")]
    assert line.startswith("persistent_resource_id, scheduling_strategy: ") and "STANDARD" in line


def test_tuning_with_a_resource_warns_that_the_trials_start_machines() -> None:
    warnings = options.check(
        vertex_values(persistent_resource_id=RESOURCE_ID, tune=True), "vertex", "us-central1"
    )
    assert any("trials run on machines started for them" in w for w in warnings), warnings
    assert not any(
        "persistent" in w for w in options.check(vertex_values(tune=True), "vertex", "us-central1")
    )


def test_the_parameter_is_vertex_only() -> None:
    assert "persistent_resource_id" not in {q.name for q in pipeline.parameters_for("local")}


# --- the setting -------------------------------------------------------------------------------


def test_the_setting_fills_the_parameter_and_a_flag_wins(vertex: RestFake) -> None:  # noqa: F811
    config = settings.load(env(vertex, PERSISTENT_RESOURCE_ID=RESOURCE_ID), Path("/nonexistent"))
    assert config.persistent_resource_id == RESOURCE_ID
    values = submit.pipeline_parameters({}, config, "gs://b/c.tar.gz", "")
    assert values["persistent_resource_id"] == RESOURCE_ID
    given = submit.pipeline_parameters({"persistent_resource_id": "other"}, config, "gs://b/c.tar.gz", "")
    assert given["persistent_resource_id"] == "other"
    unset = settings.load(env(vertex), Path("/nonexistent"))
    assert "persistent_resource_id" not in submit.pipeline_parameters({}, unset, "gs://b/c.tar.gz", "")


def test_a_bad_setting_is_named_before_any_request(vertex: RestFake) -> None:  # noqa: F811
    with pytest.raises(settings.SettingsError) as info:
        settings.load(env(vertex, PERSISTENT_RESOURCE_ID="Warm_Pool"), Path("/nonexistent"))
    assert info.value.settings == ["PERSISTENT_RESOURCE_ID"]
    assert vertex.requests == []


# --- the resource, read when the run is submitted ------------------------------------------------


def fitting() -> aiplatform_v1.PersistentResource:
    """A resource that runs the default run of the made-up project (tests.contract.test_submit.env:
    its network and service account, no CMEK key): a pool of the chief's and worker's machines
    (2 replicas) and one of prepare_machine_type's (the preparation and evaluation jobs)."""
    return aiplatform_v1.PersistentResource(
        name=f"projects/123456/locations/us-central1/persistentResources/{RESOURCE_ID}",
        state=aiplatform_v1.PersistentResource.State.RUNNING,
        network=NETWORK,
        resource_pools=[
            aiplatform_v1.ResourcePool(
                id="gpus",
                machine_spec=aiplatform_v1.MachineSpec(
                    machine_type="n1-standard-8", accelerator_type=V100, accelerator_count=1
                ),
                replica_count=2,
                disk_spec=aiplatform_v1.DiskSpec(boot_disk_type="pd-ssd", boot_disk_size_gb=100),
            ),
            aiplatform_v1.ResourcePool(
                id="cpus",
                machine_spec=aiplatform_v1.MachineSpec(machine_type="n1-standard-8"),
                replica_count=1,
            ),
        ],
        resource_runtime_spec=aiplatform_v1.ResourceRuntimeSpec(
            service_account_spec=aiplatform_v1.ServiceAccountSpec(enable_custom_service_account=True)
        ),
    )


def as_json(resource: aiplatform_v1.PersistentResource) -> dict[str, Any]:
    """The resource as Vertex's REST API answers it (camelCase, enums by name)."""
    return dict(json_format.MessageToDict(aiplatform_v1.PersistentResource.pb(resource)))


def serve(fake: RestFake, resource: aiplatform_v1.PersistentResource | None) -> None:
    """`fake` answers GetPersistentResource with `resource`, or 404 (None)."""

    def get(_m: Any, _q: Any, _b: Any) -> tuple[int, Any]:
        if resource is None:
            return 404, {"error": {"code": 404, "message": "not found", "status": "NOT_FOUND"}}
        return 200, as_json(resource)

    fake.route("GET", RESOURCE, get)


def run(fake: RestFake, extra: dict[str, str] | None = None, **given: Any) -> int:
    config = settings.load(
        env(fake, PERSISTENT_RESOURCE_ID=RESOURCE_ID, **(extra or {})), Path("/nonexistent")
    )
    return submit.submit(config, given, credentials=AnonymousCredentials(), transport="rest")


def test_a_run_on_a_fitting_resource_reads_it_then_sends_the_id(
    vertex: RestFake,  # noqa: F811
    gcs: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    serve(vertex, fitting())
    assert run(vertex) == 0
    sent = [(m, p) for m, p, _, _ in vertex.requests]
    assert sent[0] == ("GET", RESOURCE), "the resource is read first"
    [body] = vertex.bodies("POST", JOBS)
    assert body["runtimeConfig"]["parameterValues"]["persistent_resource_id"] == RESOURCE_ID
    out = capsys.readouterr().out
    assert (
        f"persistent resource projects/123456/locations/us-central1/persistentResources/{RESOURCE_ID}: RUNNING"
        in out
    )


def test_without_a_resource_nothing_is_read(vertex: RestFake, gcs: Any) -> None:  # noqa: F811
    config = settings.load(env(vertex), Path("/nonexistent"))
    assert submit.submit(config, {}, credentials=AnonymousCredentials(), transport="rest") == 0
    assert not [p for m, p, _, _ in vertex.requests if "persistentResources" in p]


def _pool(resource: aiplatform_v1.PersistentResource, pool_id: str) -> aiplatform_v1.ResourcePool:
    return next(p for p in resource.resource_pools if p.id == pool_id)


def _set(**fields: Any) -> Callable[[aiplatform_v1.PersistentResource], None]:
    def change(resource: aiplatform_v1.PersistentResource) -> None:
        for name, value in fields.items():
            setattr(resource, name, value)

    return change


def _no_cpu_pool(resource: aiplatform_v1.PersistentResource) -> None:
    del resource.resource_pools[1]


def _one_gpu_replica(resource: aiplatform_v1.PersistentResource) -> None:
    _pool(resource, "gpus").replica_count = 1


def _other_gpu(resource: aiplatform_v1.PersistentResource) -> None:
    _pool(resource, "gpus").machine_spec.accelerator_type = aiplatform_v1.AcceleratorType(
        aiplatform_v1.AcceleratorType.NVIDIA_TESLA_T4
    )


def _standard_disk(resource: aiplatform_v1.PersistentResource) -> None:
    _pool(resource, "gpus").disk_spec.boot_disk_type = "pd-standard"


def _no_custom_account(resource: aiplatform_v1.PersistentResource) -> None:
    resource.resource_runtime_spec.service_account_spec.enable_custom_service_account = False


def _error(resource: aiplatform_v1.PersistentResource) -> None:
    resource.state = STATE(STATE.ERROR)
    resource.error.message = "quota exceeded for NVIDIA_TESLA_V100"


UNFIT: list[tuple[str, Callable[[aiplatform_v1.PersistentResource], None], str]] = [
    ("provisioning", _set(state=aiplatform_v1.PersistentResource.State.PROVISIONING), "still being created"),
    ("error", _error, "it is in ERROR (quota exceeded for NVIDIA_TESLA_V100)"),
    ("stopping", _set(state=aiplatform_v1.PersistentResource.State.STOPPING), "being deleted (STOPPING)"),
    ("other-network", _set(network="projects/123456/global/networks/other"), "its network is projects/123456/global/networks/other and the run's network (NETWORK) is projects/123456/global/networks/vpc"),
    ("no-network", _set(network=""), "its network is none (not peered)"),
    ("cmek", _set(encryption_spec=aiplatform_v1.EncryptionSpec(kms_key_name=KMS_KEY)), f"its CMEK key is {KMS_KEY} and the run's encryption_spec_key_name (KMS_KEY) is none"),
    ("no-cpu-pool", _no_cpu_pool, "it has no pool of n1-standard-8 (pd-ssd boot disk), which prepare-dataset and evaluate-models need 1 at once"),
    ("too-few", _one_gpu_replica, "its pool gpus of n1-standard-8 + 1 x NVIDIA_TESLA_V100 (pd-ssd boot disk) holds 1, and train-model needs 2 at once"),
    ("other-gpu", _other_gpu, "it has no pool of n1-standard-8 + 1 x NVIDIA_TESLA_V100 (pd-ssd boot disk), which train-model needs 2 at once (its pools: gpus: n1-standard-8 + 1 x NVIDIA_TESLA_T4"),
    ("other-disk", _standard_disk, "it has no pool of n1-standard-8 + 1 x NVIDIA_TESLA_V100 (pd-ssd boot disk)"),
    ("service-agent", _no_custom_account, "runs as the Vertex AI Custom Code Service Agent, not as the run's service_account pipelines@p-proj.iam.gserviceaccount.com"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "said"), [u[1:] for u in UNFIT], ids=[u[0] for u in UNFIT])
def test_an_unfit_resource_is_refused_in_one_line_before_the_run(
    vertex: RestFake,  # noqa: F811
    gcs: Any,
    change: Callable[[aiplatform_v1.PersistentResource], None],
    said: str,
) -> None:
    resource = fitting()
    change(resource)
    serve(vertex, resource)
    with pytest.raises(submit.PersistentResourceRefused) as info:
        run(vertex)
    line = str(info.value)  # what `make run` prints after "make run: "
    assert "\n" not in line
    assert line.startswith(f"persistent_resource_id: the persistent resource {resource.name} cannot run")
    assert said in line
    assert "leave persistent_resource_id empty" in line
    assert [(m, p) for m, p, _, _ in vertex.requests] == [("GET", RESOURCE)], "only the resource was read"
    assert list(gcs.list_blobs(BUCKET)) == [], "no build context was uploaded"


def test_the_run_must_match_a_resource_that_enforces_a_service_account(vertex: RestFake, gcs: Any) -> None:  # noqa: F811
    serve(vertex, fitting())
    with pytest.raises(submit.PersistentResourceRefused, match=r"set service_account \(SERVICE_ACCOUNT\)"):
        run(vertex, {"SERVICE_ACCOUNT": ""})


def test_the_runs_cmek_key_must_be_the_resources(vertex: RestFake, gcs: Any) -> None:  # noqa: F811
    resource = fitting()
    serve(vertex, resource)
    with pytest.raises(
        submit.PersistentResourceRefused,
        match=rf"its CMEK key is none and the run's encryption_spec_key_name \(KMS_KEY\) is {KMS_KEY}",
    ):
        run(vertex, {"KMS_KEY": KMS_KEY})
    resource.encryption_spec.kms_key_name = KMS_KEY
    vertex.routes[:] = [r for r in vertex.routes if r[1] != RESOURCE]
    serve(vertex, resource)
    assert run(vertex, {"KMS_KEY": KMS_KEY}) == 0


def test_autoscaling_counts_its_most_replicas_and_busy_ones_warn(
    vertex: RestFake,  # noqa: F811
    gcs: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    resource = fitting()
    gpus = _pool(resource, "gpus")
    gpus.replica_count = 1
    gpus.autoscaling_spec = aiplatform_v1.ResourcePool.AutoscalingSpec(
        min_replica_count=1, max_replica_count=3
    )
    gpus.used_replica_count = 2
    serve(vertex, resource)
    assert run(vertex) == 0
    out = capsys.readouterr().out
    assert re.search(
        r"WARNING: persistent_resource_id: 2 of the 3 machines of its pool gpus .* train-model waits for 2",
        out,
    ), out


def test_a_reduction_server_pool_needs_its_own_pool(vertex: RestFake, gcs: Any) -> None:  # noqa: F811
    serve(vertex, fitting())
    with pytest.raises(
        submit.PersistentResourceRefused,
        match=r"no pool of n1-highcpu-16 \(pd-ssd boot disk\), which train-model needs 1 at once",
    ):
        run(vertex, reduction_server_count=1)


def test_a_resource_of_another_project_or_region_is_not_found(vertex: RestFake, gcs: Any) -> None:  # noqa: F811
    serve(vertex, None)
    with pytest.raises(submit.PersistentResourceRefused) as info:
        run(vertex)
    line = str(info.value)
    assert "\n" not in line
    assert line.startswith(
        f"persistent_resource_id: there is no persistent resource '{RESOURCE_ID}' in project p-proj, region us-central1"
    )
    assert vertex.bodies("POST", JOBS) == [] and list(gcs.list_blobs(BUCKET)) == []


def test_make_run_exits_2_with_the_line_and_no_traceback(
    vertex: RestFake,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    resource = fitting()
    resource.state = STATE(STATE.UPDATING)
    serve(vertex, resource)
    real_init = submit.init_aiplatform
    monkeypatch.setattr(
        submit,
        "init_aiplatform",
        lambda config, credentials=None, transport=None: real_init(config, AnonymousCredentials(), "rest"),
    )
    monkeypatch.chdir(tmp_path)  # no env.sh
    code = cli.main(["run", "--target", "vertex"], env(vertex, PERSISTENT_RESOURCE_ID=RESOURCE_ID))
    err = capsys.readouterr().err
    assert code == 2, err
    [line] = err.strip().splitlines()
    assert line.startswith("make run: persistent_resource_id: the persistent resource ")
    assert "it is UPDATING, not usable until it is RUNNING again" in line and "Traceback" not in err


def test_make_schedule_reads_it_before_any_upload(
    vertex: RestFake,  # noqa: F811
    gcs: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    serve(vertex, None)
    monkeypatch.setattr(submit, "source_commit", lambda root=ROOT: "a" * 40)
    config = settings.load(env(vertex, PERSISTENT_RESOURCE_ID=RESOURCE_ID), Path("/nonexistent"))
    with pytest.raises(submit.PersistentResourceRefused, match="there is no persistent resource"):
        schedules.create_schedule(
            config, {}, cron="0 6 * * 1", credentials=AnonymousCredentials(), transport="rest"
        )
    assert [(m, p) for m, p, _, _ in vertex.requests] == [("GET", RESOURCE)]
    assert list(gcs.list_blobs(BUCKET)) == []


# --- the same read over gRPC ---------------------------------------------------------------------


@pytest.fixture
def grpc_vertex() -> Iterator[tuple[GrpcFake, dict[str, Any]]]:
    """PersistentResourceService over gRPC: `state["resource"]` answers, None is NOT_FOUND, an
    Abort is raised as it is."""
    fake = GrpcFake()
    state: dict[str, Any] = {"resource": fitting()}

    def get(request: aiplatform_v1.GetPersistentResourceRequest) -> aiplatform_v1.PersistentResource:
        answer = state["resource"]
        if isinstance(answer, Abort):
            raise answer
        if answer is None:
            raise Abort(grpc.StatusCode.NOT_FOUND, f"{request.name} not found")
        return answer

    fake.add(
        "google.cloud.aiplatform.v1.PersistentResourceService",
        "GetPersistentResource",
        aiplatform_v1.GetPersistentResourceRequest,
        get,
    )
    fake.start()
    yield fake, state
    fake.stop()


def check_over_grpc(fake: GrpcFake) -> list[str]:
    config = settings.Settings(
        project="p-proj",
        region="us-central1",
        pipeline_root=f"gs://{BUCKET}/root",
        artifact_repository="us-central1-docker.pkg.dev/p-proj/training",
        service_account="pipelines@p-proj.iam.gserviceaccount.com",
        network=NETWORK,
        persistent_resource_id=RESOURCE_ID,
    )
    client = insecure_client(
        aiplatform_v1.PersistentResourceServiceClient, PersistentResourceServiceGrpcTransport, fake.address
    )()
    compiled = json.loads(pipeline.COMPILED.read_text())
    values = submit.run_values(submit.pipeline_parameters({}, config, "gs://b/c.tar.gz", ""), compiled)
    return submit.check_persistent_resource(config, values, client=client)


@pytest.fixture
def reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gRPC fake needs no HTTP probe of the region's endpoint (no network here)."""
    monkeypatch.setattr(cloud, "reach", lambda service, seconds=0, out=None: None)


def test_the_grpc_client_reads_the_resource_by_its_name(
    grpc_vertex: tuple[GrpcFake, dict[str, Any]], reachable: None
) -> None:
    fake, _ = grpc_vertex
    assert check_over_grpc(fake) == []
    [request] = fake.calls("GetPersistentResource")
    assert request.name == f"projects/p-proj/locations/us-central1/persistentResources/{RESOURCE_ID}"


def test_a_refused_read_names_the_role(grpc_vertex: tuple[GrpcFake, dict[str, Any]], reachable: None) -> None:
    fake, state = grpc_vertex
    state["resource"] = Abort(
        grpc.StatusCode.PERMISSION_DENIED,
        "Permission 'aiplatform.persistentResources.get' denied on resource",
    )
    with pytest.raises(submit.GoogleRefused, match=r"needs roles/aiplatform\.user in project p-proj"):
        check_over_grpc(fake)
    state["resource"] = None
    with pytest.raises(submit.PersistentResourceRefused, match="there is no persistent resource 'warm-pool'"):
        check_over_grpc(fake)
