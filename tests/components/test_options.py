"""The rules of `pipeline.options`, one by one: each refusal names the parameter and what is
allowed; everything wrong is named at once; what Vertex accepts passes."""

from __future__ import annotations

from typing import Any

import pytest

import pipeline
from components import plan
from pipeline import options
from pipeline.options import trainer_flags

REGION = "us-central1"


def vertex(**given: Any) -> dict[str, Any]:
    values = {q.name: q.default_for("vertex") for q in pipeline.parameters_for("vertex")}
    values.update(project="p-proj", location=REGION, context_uri="gs://b/c.tgz", artifact_repository="r")
    return {**values, **given}


def refused(values: dict[str, Any], target: str = "vertex") -> options.OptionsError:
    with pytest.raises(options.OptionsError) as err:
        options.check(values, target, REGION if target == "vertex" else "")
    return err.value


def test_the_vertex_defaults_pass() -> None:
    assert options.check(vertex(), "vertex", REGION) == []


def test_a_region_without_cloud_build_needs_a_build_region() -> None:
    cpu = vertex(location="us-east7", chief_accelerator_type="", chief_accelerator_count=0, worker_count=0)
    with pytest.raises(options.OptionsError) as err:
        options.check(cpu, "vertex", "us-east7")
    assert err.value.parameters == {"build_location"}
    assert options.check(cpu | {"build_location": "global"}, "vertex", "us-east7") == []


@pytest.mark.parametrize(
    "account",
    [
        "trainer@p-proj.iam.gserviceaccount.com",
        "123456789-compute@developer.gserviceaccount.com",
        "p-proj@appspot.gserviceaccount.com",  # App Engine's default service account
    ],
)
def test_service_accounts_vertex_takes_pass(account: str) -> None:
    assert (
        options.check(vertex(service_account=account, labels={"équipe": "données"}), "vertex", REGION) == []
    )


H100_8: dict[str, str | int] = {
    "chief_machine_type": "a3-highgpu-8g",
    "chief_accelerator_type": "NVIDIA_H100_80GB",
}
H100_8 |= {"chief_accelerator_count": 8, "worker_machine_type": "a3-highgpu-8g"}
H100_8 |= {"worker_accelerator_type": "NVIDIA_H100_80GB", "worker_accelerator_count": 8}


@pytest.mark.parametrize(
    ("given", "parameters", "fragment"),
    [
        ({"scheduling_strategy": "spot"}, {"scheduling_strategy"}, "did you mean SPOT?"),
        ({"scheduling_strategy": "ON_DEMAND"}, {"scheduling_strategy"}, "STANDARD, SPOT, FLEX_START"),
        ({"scheduling_strategy": "FLEX_START"}, {"scheduling_strategy"}, "L4, A100, H100, H200 or B200"),
        (
            {"scheduling_strategy": "FLEX_START", **H100_8, "worker_machine_type": "a3-highgpu-4g"}
            | {"worker_accelerator_count": 4},
            {"scheduling_strategy", "worker_machine_type"},
            "the same machine configuration in every worker pool",
        ),
        (
            {"scheduling_strategy": "FLEX_START", **H100_8, "timeout": "700000s"},
            {"timeout"},
            "at most 7 days (604800s)",
        ),
        (
            {"scheduling_strategy": "FLEX_START", **H100_8, "reduction_server_count": 1},
            {"reduction_server_count"},
            "set reduction_server_count 0",
        ),
        ({"tune": True, "search_algorithm": "GRID_SEARCH"}, {"search_algorithm"}, "learning_rate, dropout"),
        ({"search_algorithm": "BAYESIAN"}, {"search_algorithm"}, "must be one of"),
        ({"parallel_trial_count": 9}, {"parallel_trial_count"}, "from 1 to max_trial_count (8)"),
        ({"max_failed_trial_count": -1}, {"max_failed_trial_count"}, "0 or more"),
        (
            {"tensorboard": "projects/1/locations/us-central1/tensorboards/2"},
            {"tensorboard", "service_account"},
            "with roles/storage.admin and roles/aiplatform.user (docs/vertex.md#the-iam-roles-a-first-run-needs)",
        ),
        (
            {
                "tensorboard": "projects/1/locations/europe-west4/tensorboards/2",
                "service_account": "trainer@p-proj.iam.gserviceaccount.com",
            },
            {"tensorboard"},
            "in the job's region us-central1",
        ),
        (
            {"tensorboard": "my-board", "service_account": "trainer@p-proj.iam.gserviceaccount.com"},
            {"tensorboard"},
            "tensorboards/<id>",
        ),
        ({"service_account": "someone@gmail.com"}, {"service_account"}, "not a service account"),
        ({"network": "vpc"}, {"network"}, "projects/<project number>/global/networks/<name>"),
        (
            {"encryption_spec_key_name": "projects/p/locations/europe-west4/keyRings/r/cryptoKeys/k"},
            {"encryption_spec_key_name"},
            "needs a CMEK key in the region of its resources, us-central1",
        ),
        ({"labels": {"Team": "ml"}}, {"labels"}, "label key 'Team'"),
        ({"labels": {"ǅx": "ml"}}, {"labels"}, "label key 'ǅx'"),  # titlecase is not lowercase
        ({"labels": {"env": ""}}, {"labels"}, "an empty one would be dropped"),
        ({"labels": {"team": "ML"}}, {"labels"}, "values are 1 to 63 lowercase"),
        ({"labels": {f"k{i}": "v" for i in range(60)}}, {"labels"}, "at most 59"),
        (
            {"labels": {"dataset": "mine"}},
            {"labels"},
            "the run sets pipeline_run, source_commit, gate, dataset",
        ),
        ({"model_root": "s3://b/m"}, {"model_root"}, "a gs://<bucket>/<path> folder"),
        *(
            ({"model_root": root}, {"model_root"}, ". or ..")
            for root in ("gs://bkt/a/../m", "gs://bkt//m", "gs://bkt/./m")
        ),
        ({"timeout": "1h"}, {"timeout"}, "like '86400s'"),
        ({"chief_accelerator_type": "NVIDIA_TESLA_K80"}, {"chief_accelerator_type"}, "end of support"),
        (
            {"worker_accelerator_type": "NVIDIA_TESLA_K80"},
            {"worker_accelerator_type"},
            "compute capability 3.7",
        ),
        ({"boot_disk_size_gb": 10}, {"boot_disk_size_gb"}, "from 100 to 64000"),
        (
            {"boot_disk_type": "pd-balanced"},
            {"boot_disk_type"},
            "hyperdisk-balanced",
        ),  # PersistentDiskSpec's, not DiskSpec's
        ({"prepare_machine_type": "big one"}, {"prepare_machine_type"}, "not a Compute Engine machine type"),
        ({"worker_count": 40}, {"dataset_shards", "worker_count"}, "give at least 41"),
        ({"fine_tune_fraction": -0.5}, {"fine_tune_fraction"}, "-1 (the trainer's default) or from 0 to 1"),
        ({"fine_tune_fraction": 1.5}, {"fine_tune_fraction"}, "trainer.task says"),
        ({"backbone": "vgg16"}, {"backbone"}, "invalid choice: 'vgg16'"),
        (
            {"backbone": "tiny"},
            {"backbone", "weights"},
            "--weights imagenet is not available for --backbone tiny",
        ),
        ({"dropout": 1.0}, {"dropout"}, "[0, 1)"),
        ({"image_size": 16}, {"image_size"}, "between 32 and 1024"),
        ({"dataset_shards": 0}, {"dataset_shards"}, "trainer.prepare says"),
        ({"dataset_source": "gs://bucket/images"}, {"dataset_source"}, "tfds:NAME"),
        ({"dataset_source": "folder:/home/me/images"}, {"dataset_source"}, "folder:gs://<bucket>/<path>"),
        ({"min_score": 1.5}, {"min_score"}, "from 0 to 1"),
        ({"gate_metric": "f1"}, {"gate_metric"}, "accuracy, macro_f1"),
        ({"gate_rule": "better"}, {"gate_rule"}, "not_worse, significantly_better, non_inferior"),
        ({"gate_margin": -0.01}, {"gate_margin"}, "from 0 to 1"),
        ({"serving_accelerator": "tpu"}, {"serving_accelerator"}, "cpu or gpu"),
        ({"model_display_name": " "}, {"model_display_name"}, "required"),
        *(
            (
                {"prepare_engine": "beam", "dataflow_machine_type": m},
                {"dataflow_machine_type"},
                "machine type name",
            )
            for m in ("N1-STANDARD-4", "n1 standard 4", "", 4)
        ),
        (
            {"dataflow_subnetwork": "projects/p/regions/us-central1/subnetworks/s"},
            {"dataflow_subnetwork"},
            "is not regions/REGION/subnetworks/NAME",
        ),
        (
            {"dataflow_subnetwork": "regions/europe-west4/subnetworks/s"},
            {"dataflow_subnetwork"},
            "runs in us-central1",
        ),
        ({"dataflow_max_workers": 1001}, {"dataflow_max_workers"}, "from 1 to 1000"),
        ({"build_machine_type": "e2-highcpu-8"}, {"build_machine_type"}, "E2_HIGHCPU_8"),
        ({"build_service_account": "builder"}, {"build_service_account"}, "serviceAccounts"),
        ({"build_worker_pool": "pool-1"}, {"build_worker_pool"}, "workerPools"),
        (
            {
                "build_worker_pool": "projects/p/locations/us-east1/workerPools/w",
                "build_location": "us-west1",
            },
            {"build_worker_pool", "build_location"},
            "us-east1",
        ),
    ],
)
def test_each_rule_names_its_parameter(given: dict[str, Any], parameters: set[str], fragment: str) -> None:
    err = refused(vertex(**given))
    assert err.parameters >= parameters, str(err)
    named = [str(p) for p in err.problems if set(p.parameters) & parameters]
    assert any(fragment in line for line in named), named


def test_every_rows_choices_and_bounds_are_checked() -> None:
    """A rule held as data on a parameter's row (pipeline.options: `choices`, `bounds`) refuses
    what is outside it, naming the parameter, and lets the row's own default through."""
    rows = [p for p in pipeline.PARAMETERS if p.choices or p.bounds is not None]
    assert {"gate_metric", "gate_rule", "min_score", "gate_margin", "search_algorithm"} <= {
        p.name for p in rows
    }
    for p in rows:
        if p.choices:
            outside: list[Any] = ["nothing-of-the-kind"]
        else:
            low, high = p.bounds  # type: ignore[misc]
            outside = [low - 1] + ([high + (1 if p.type is int else 0.5)] if high != float("inf") else [])
            outside += [2.5] if p.type is int else []  # not a whole number
        for value in outside:
            assert refused(vertex(**{p.name: value})).parameters == {p.name}, (p.name, value)
        assert not p.choices or p.default in p.choices, p.name
        assert p.bounds is None or p.bounds[0] <= p.default <= p.bounds[1], p.name


@pytest.mark.parametrize(
    "given",
    [
        {"scheduling_strategy": "SPOT"},
        {"scheduling_strategy": "FLEX_START", **H100_8},
        {"scheduling_strategy": "FLEX_START", **H100_8, "worker_count": 0, "timeout": "604800s"},
        {"tune": True, "search_algorithm": "RANDOM_SEARCH"},
        {"search_algorithm": "GRID_SEARCH"},  # tuning off: the algorithm is never used
        {
            "tensorboard": "projects/1/locations/us-central1/tensorboards/2",
            "service_account": "trainer@p-proj.iam.gserviceaccount.com",
        },
        {"encryption_spec_key_name": "projects/p/locations/us-central1/keyRings/r/cryptoKeys/k"},
        {"network": "projects/123/global/networks/vpc", "labels": {"team": "ml", "env": "dev"}},
        {"dataset_source": "folder:gs://bucket/images"},
        {"worker_count": 0, "chief_accelerator_type": "", "chief_accelerator_count": 0},
        {"worker_count": 4, "reduction_server_count": 2},
        {"fine_tune_fraction": 0.25, "backbone": "efficientnet_b0"},
    ],
)
def test_what_vertex_accepts_passes(given: dict[str, Any]) -> None:
    options.check(vertex(**given), "vertex", REGION)


def test_flex_start_judges_the_pools_as_they_are_built() -> None:
    """A worker machine type given without GPU settings builds a worker pool without GPUs
    (`build_worker_pool_specs` copies the chief's GPU only when worker_machine_type is empty):
    FLEX_START refuses that pool for having no GPU and shows it as built, not with the chief's GPU."""
    a100 = {"chief_machine_type": "a2-highgpu-1g", "chief_accelerator_type": "NVIDIA_TESLA_A100"}
    cpu_workers = {"worker_machine_type": "n1-standard-8", "worker_accelerator_type": ""}
    given = {"scheduling_strategy": "FLEX_START", **a100, **cpu_workers, "worker_accelerator_count": 0}
    err = refused(vertex(**given))
    assert {"scheduling_strategy", "worker_accelerator_type", "worker_machine_type"} == err.parameters
    lines = [str(p) for p in err.problems]
    assert any("the worker pool has no GPU" in line for line in lines), lines
    assert any(line.endswith("the workers n1-standard-8") for line in lines), lines
    empty = {"worker_machine_type": "", "worker_accelerator_type": "", "worker_accelerator_count": 0}
    options.check(vertex(**(given | empty)), "vertex", REGION)  # empty: the chief's pool, GPUs too


def test_flex_start_still_names_the_worker_pools_problems_beside_a_hardware_refusal() -> None:
    """A worker pool the builder refuses (3 x T4 on n1-standard-8) is still judged for FLEX_START,
    as given: every bad parameter is named at once."""
    a100 = {"chief_machine_type": "a2-highgpu-1g", "chief_accelerator_type": "NVIDIA_TESLA_A100"}
    t4 = {"worker_machine_type": "n1-standard-8", "worker_accelerator_type": "NVIDIA_TESLA_T4"}
    err = refused(vertex(scheduling_strategy="FLEX_START", **a100, **t4, worker_accelerator_count=3))
    assert {"scheduling_strategy", "worker_accelerator_type", "worker_machine_type"} <= err.parameters


def test_flex_start_judges_no_worker_pool_for_a_refused_worker_count() -> None:
    """A negative worker_count builds no pool (hardware_problems names the count): FLEX_START
    names the chief's pool alone, not a worker pool copied from it."""
    t4 = {"chief_machine_type": "n1-standard-8", "chief_accelerator_type": "NVIDIA_TESLA_T4"}
    err = refused(vertex(scheduling_strategy="FLEX_START", **t4, worker_count=-1))
    assert {"scheduling_strategy", "chief_accelerator_type", "worker_count"} <= err.parameters
    assert "worker_accelerator_type" not in err.parameters


def test_a_dataflow_run_on_a_network_without_a_subnetwork_is_warned() -> None:
    """Dataflow takes a network given alone as an auto-mode network of the job's project."""
    beam = {"prepare_engine": "beam", "dataset_source": "folder:gs://bucket/images"}
    network = {"network": "projects/123/global/networks/vpc"}
    [warning] = options.check(vertex(**beam, **network), "vertex", REGION)
    assert warning.startswith("prepare_engine=beam with a network and no dataflow_subnetwork")
    shared = "https://www.googleapis.com/compute/v1/projects/host-proj/regions/us-central1/subnetworks/s"
    assert options.check(vertex(**beam, **network, dataflow_subnetwork=shared), "vertex", REGION) == []
    assert options.check(vertex(**network), "vertex", REGION) == []  # the job engine: no Dataflow


def test_every_problem_is_named_at_once_one_per_line() -> None:
    err = refused(
        vertex(
            scheduling_strategy="spot", epochs=0, labels={"A": "b"}, chief_accelerator_type="NVIDIA_TESLA_K80"
        )
    )
    assert err.parameters >= {"scheduling_strategy", "epochs", "labels", "chief_accelerator_type"}
    lines = str(err).splitlines()
    assert len(lines) == len(err.problems)
    assert all(line.split(":")[0] for line in lines)


def test_the_region_override_turns_the_refusal_into_a_warning() -> None:
    given = H100_8 | {"worker_count": 1}
    with pytest.raises(options.OptionsError, match="set check_gpu_region=false"):
        options.check(vertex(**given), "vertex", "southamerica-east1")
    warnings = options.check(vertex(**given, check_gpu_region=False), "vertex", "southamerica-east1")
    assert len(warnings) == 1 and "not offered in southamerica-east1" in warnings[0]


def test_the_checked_flags_are_built_by_the_steps_own_functions(capsys: pytest.CaptureFixture[str]) -> None:
    """The pre-flight hands the trainer's parsers the command lines `trainer_args` and
    `prepare_args` themselves build (no second spelling of the flags), quietly: the step's own
    `print` of its args stays out of `make run`'s screen."""
    values = vertex(fine_tune_fraction=0.5, dataset_source="synthetic")
    checked = trainer_flags.trainer_commands(values)
    assert capsys.readouterr().out == ""
    task = checked["trainer.task"]
    assert "--fine_tune_fraction=0.5" in task and "--image_size=300" in task
    assert not any(a.startswith("--data_dir=") for a in task)  # flagcheck stands in for the folder
    assert {a.split("=")[0] for a in task} == {"--image_size", *(f"--{f}" for f in plan.MODEL_FLAGS)}
    assert f"--synthetic_per_class={values['synthetic_per_class']}" in checked["trainer.prepare"]
    assert "--shards=32" in checked["trainer.prepare"] and "--overwrite" in checked["trainer.prepare"]
    # A source the step itself refuses is still handed over, for the preparation's parser to name.
    assert "--source=nope" in trainer_flags.trainer_commands(vertex(dataset_source="nope"))["trainer.prepare"]


@pytest.mark.process
@pytest.mark.trainer_check_process
def test_the_trainer_checks_answer_as_processes_what_the_suite_answers_in_process(tmp_path: Any) -> None:
    """`make run` starts `python -m trainer.flagcheck` and `trainer.preparation.sourcecheck` (the pipeline's
    layers never import the trainer); elsewhere the suite answers in-process (tests/conftest.py):
    both answers are the same, and a module that fails is named."""
    from tests.conftest import trainer_check_in_process

    flags = {"trainer.task": ["--epochs=0"], "trainer.prepare": ["--shards=0"]}
    by_process = trainer_flags.trainer_check("trainer.flagcheck", flags)
    assert by_process == trainer_check_in_process("trainer.flagcheck", flags)
    assert {p["program"] for p in by_process} == {"trainer.task", "trainer.prepare"}
    source = {"source": f"folder:{tmp_path}"}
    assert trainer_flags.trainer_check("trainer.preparation.sourcecheck", source) == trainer_check_in_process(
        "trainer.preparation.sourcecheck", source
    )
    with pytest.raises(RuntimeError, match=r"trainer\.flagcheck"):
        trainer_flags.trainer_check("trainer.flagcheck", {"trainer.unknown": []})


def test_the_rules_table_names_only_parameters_that_exist() -> None:
    """docs/options.md's rules table is `options.RULES`: each row's first cell names parameters
    (and the settings that fill them) in backticks (`name` or `name=VALUE`): a renamed or removed
    one fails here."""
    import re

    from launch import settings

    names = {p.name for p in pipeline.PARAMETERS} | set(settings.SETTINGS)  # and the env.sh settings
    rows = options.RULES.splitlines()
    assert all(row.startswith("| ") and row.count(" | ") == 2 and row.endswith(" |") for row in rows), rows
    named = [m.split("=")[0] for row in rows for m in re.findall(r"`([^`]+)`", row.split(" | ")[0])]
    # The hardware row names families of parameters by their prefix (`chief_*`).
    unknown = [
        n
        for n in named
        if n not in names and not (n.endswith("*") and any(p.startswith(n[:-1]) for p in names))
    ]
    assert named and not unknown, unknown
