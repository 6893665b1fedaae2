"""The declared search space (`search_space`): how `make run` reads it (inline JSON, @FILE, a
.json/.yaml file, snake_case or camelCase), the rules that refuse it before any request (each
naming `search_space` and the parameter), the defaults of each target, and the way a declared
space reaches the Vertex tuning payload, the trials' command line and the local tuner."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from google.cloud import aiplatform_v1
from google.protobuf import json_format
from kfp import compiler

import pipeline
from components import plan, tuning
from launch import flags
from pipeline import options
from tests.model_flags import MODEL_FLAG_VALUES
from tests.test_pipeline import default_pools, render_payload, root_values, task_inputs, walk

REGION = "us-central1"
# A declared space in the REST (camelCase) form, all INTEGER/DISCRETE (so GRID_SEARCH may use it).
DECLARED = [
    {
        "parameterId": "epochs",
        "integerValueSpec": {"minValue": 2, "maxValue": 4},
        "scaleType": "UNIT_LINEAR_SCALE",
    },
    {
        "parameterId": "dense_units",
        "discreteValueSpec": {"values": [32, 64, 128]},
        "scaleType": "UNIT_LOG_SCALE",
    },
]
CANONICAL = [
    {
        "parameter_id": "epochs",
        "integer_value_spec": {"min_value": "2", "max_value": "4"},
        "scale_type": "UNIT_LINEAR_SCALE",
    },
    {
        "parameter_id": "dense_units",
        "discrete_value_spec": {"values": [32.0, 64.0, 128.0]},
        "scale_type": "UNIT_LOG_SCALE",
    },
]


def values_for(target: str, **given: Any) -> dict[str, Any]:
    values = {q.name: q.default_for(target) for q in pipeline.parameters_for(target)}
    if target == "vertex":
        values.update(project="p-proj", location=REGION, context_uri="gs://b/c.tgz", artifact_repository="r")
    return {**values, **given}


def check(target: str = "vertex", **given: Any) -> list[str]:
    return options.check(values_for(target, **given), target, REGION if target == "vertex" else "")


def refused(target: str = "vertex", **given: Any) -> options.OptionsError:
    with pytest.raises(options.OptionsError) as err:
        check(target, **given)
    return err.value


def from_flag(text: str) -> Any:
    """The value `make run ARGS="--search_space TEXT"` hands the pipeline."""
    ns = flags.build_parser(pipeline.parameters_for("vertex")).parse_args(["--search_space", text])
    return ns.search_space


# --- reading it ---------------------------------------------------------------------------------


def test_both_json_forms_parse_to_the_same_specs_and_the_canonical_form() -> None:
    assert tuning.canonical_search_space(DECLARED) == CANONICAL
    assert tuning.canonical_search_space(CANONICAL) == CANONICAL
    assert [
        aiplatform_v1.StudySpec.ParameterSpec.to_dict(p) for p in tuning.parse_search_space(DECLARED)
    ] == [aiplatform_v1.StudySpec.ParameterSpec.to_dict(p) for p in tuning.parse_search_space(CANONICAL)]
    # The canonical form is what Vertex's launcher builds the request from (a dict into the
    # proto-plus type, which knows only the snake_case names) and what the local tuner parses.
    for entry in CANONICAL:
        aiplatform_v1.StudySpec.ParameterSpec(entry)
    with pytest.raises(ValueError, match="Unknown field"):
        aiplatform_v1.StudySpec.ParameterSpec(DECLARED[0])


def test_the_defaults_are_in_the_canonical_form_and_vertex_is_the_old_study() -> None:
    for space in (tuning.VERTEX_SEARCH_SPACE, tuning.LOCAL_SEARCH_SPACE):
        assert tuning.canonical_search_space(space) == space
    # GCPC's serializer over aiplatform's hpt specs (the study this pipeline always had), as GCPC
    # documents the op's input; the local tuner parses that form too.
    from google.cloud.aiplatform import hyperparameter_tuning as hpt
    from google_cloud_pipeline_components.v1.hyperparameter_tuning_job import serialize_parameters

    from local import tuner

    gcpc = serialize_parameters(
        {
            "learning_rate": hpt.DoubleParameterSpec(min=1e-4, max=1e-2, scale="log"),
            "dense_units": hpt.IntegerParameterSpec(min=32, max=1024, scale="log"),
            "dropout": hpt.DoubleParameterSpec(min=0.0, max=0.5, scale="linear"),
            "per_replica_batch_size": hpt.DiscreteParameterSpec(values=[16, 32, 64], scale="linear"),
        }
    )
    assert tuning.canonical_search_space(gcpc) == tuning.VERTEX_SEARCH_SPACE
    assert tuner.parse_study(tuning.study_metrics(), gcpc) == tuner.parse_study(
        tuning.study_metrics(), tuning.VERTEX_SEARCH_SPACE
    )


def test_unknown_fields_are_refused_naming_the_parameter() -> None:
    with pytest.raises(ValueError, match=r"parameter 1 \(dropout\): .*no field named \"bogus\""):
        tuning.parse_search_space([{"parameter_id": "dropout", "bogus": 1}])
    with pytest.raises(ValueError, match="should not have multiple"):
        tuning.parse_search_space(
            [
                {
                    "parameter_id": "dropout",
                    "double_value_spec": {"min_value": 0, "max_value": 0.3},
                    "discrete_value_spec": {"values": [0.1]},
                }
            ]
        )


def test_make_run_takes_inline_json_a_file_or_at_file(tmp_path: Path) -> None:
    assert from_flag(json.dumps(DECLARED)) == CANONICAL
    as_json = tmp_path / "space.json"
    as_json.write_text(json.dumps(DECLARED))
    assert from_flag(str(as_json)) == CANONICAL
    assert from_flag(f"@{as_json}") == CANONICAL
    as_yaml = tmp_path / "space.yaml"
    as_yaml.write_text(
        "- parameterId: learning_rate\n"
        "  doubleValueSpec: {minValue: 1e-4, maxValue: 1e-2}\n"  # YAML 1.1 reads 1e-4 as text
        "  scaleType: UNIT_LOG_SCALE\n"
        "- parameter_id: per_replica_batch_size\n"
        "  discrete_value_spec:\n"
        "    values: [16, 32]\n"
    )
    assert from_flag(str(as_yaml)) == [
        {
            "parameter_id": "learning_rate",
            "double_value_spec": {"min_value": 1e-4, "max_value": 1e-2},
            "scale_type": "UNIT_LOG_SCALE",
        },
        {"parameter_id": "per_replica_batch_size", "discrete_value_spec": {"values": [16.0, 32.0]}},
    ]
    assert from_flag(f"@{as_yaml}") == from_flag(str(as_yaml))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("missing.yaml", "no such file: missing.yaml"),
        ("@missing.json", "no such file: missing.json"),
        ("[{", "expected inline JSON, @FILE or a .json/.yaml/.yml file"),
        ('{"parameter_id": "dropout"}', "expected a list of parameter specs"),
    ],
)
def test_make_run_refuses_what_is_no_list(
    text: str,
    fragment: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        from_flag(text)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --search_space" in err and fragment in err, err


def test_a_space_that_does_not_parse_reaches_the_check_as_given() -> None:
    given = [{"parameter_id": "dropout", "double_value_spec": {"min_value": 0, "max_value": 0.3}, "bogus": 1}]
    assert from_flag(json.dumps(given)) == given
    err = refused(tune=True, search_space=given)
    assert err.parameters == {"search_space"}
    assert 'no field named "bogus"' in str(err) and "parameter_id, one of double_value_spec" in str(err)


# --- the rules ----------------------------------------------------------------------------------


def spec(pid: str, kind: str = "double_value_spec", scale: str = "", **value_spec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"parameter_id": pid, kind: value_spec}
    if scale:
        out["scale_type"] = scale
    return out


LR = spec("learning_rate", min_value=1e-3, max_value=1e-2, scale="UNIT_LOG_SCALE")


@pytest.mark.parametrize(
    ("space", "fragments"),
    [
        (
            [LR, spec("momentum", min_value=0.5, max_value=0.99)],
            [
                "momentum is not a trainer flag a tuning job may set",
                "allowed: learning_rate, per_replica_batch_size",
            ],
        ),
        (
            [spec("dropout", min_value=0.3, max_value=0.3)],
            ["dropout (double_value_spec): min_value must be below max_value, got 0.3 and 0.3"],
        ),
        (
            [spec("dense_units", "integer_value_spec", min_value=256, max_value=64)],
            ["dense_units (integer_value_spec): min_value must be below max_value"],
        ),
        (
            [spec("learning_rate", min_value=0, max_value=1e-2, scale="UNIT_LOG_SCALE")],
            ["learning_rate (double_value_spec): UNIT_LOG_SCALE needs min_value > 0", "got 0"],
        ),
        (
            [spec("dropout", min_value=0, max_value=0.3, scale="UNIT_REVERSE_LOG_SCALE")],
            ["UNIT_REVERSE_LOG_SCALE needs min_value > 0"],
        ),
        (
            # The trainer's own rule (--dropout in [0, 1)), not a copy of it.
            [spec("dropout", min_value=0.2, max_value=1.0)],
            ["a trial may get --dropout=1.0, which the trainer refuses", "must be a number in [0, 1)"],
        ),
        (
            [spec("per_replica_batch_size", "discrete_value_spec", values=[0, 16, 32])],
            ["--per_replica_batch_size=0.0, which the trainer refuses", "between 1 and 65536"],
        ),
        (
            # A DOUBLE range hands trials fractional values; the trainer takes whole epochs only.
            [spec("epochs", min_value=2, max_value=6)],
            ["epochs (double_value_spec)", "expected a whole number", "use integer_value_spec"],
        ),
        (
            [spec("epochs", "categorical_value_spec", values=["2", "many"])],
            ["--epochs=many, which the trainer refuses"],
        ),
        ([LR, {**LR}], ["learning_rate is declared twice: parameter ids must be unique"]),
        ([], ["declares no parameter: give at least one of learning_rate"]),
        ([{"double_value_spec": {"min_value": 0, "max_value": 1}}], ["parameter 1 has no parameter_id"]),
        ([{"parameter_id": "dropout"}], ["dropout has no value spec"]),
        (
            [spec("epochs", "discrete_value_spec", values=[4, 2])],
            ["values must be in increasing order and at least 1e-10 apart, got [4.0, 2.0]"],
        ),
        (
            [spec("epochs", "categorical_value_spec", scale="UNIT_LINEAR_SCALE", values=["2", "3"])],
            ["leave scale_type unset for a categorical parameter"],
        ),
        ({"parameters": [LR]}, ["must be a list of parameter specs"]),
    ],
)
def test_a_bad_search_space_file_is_refused_naming_the_parameter(
    space: Any, fragments: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "space.json"
    path.write_text(json.dumps(space))
    value = from_flag(f"@{path}") if isinstance(space, list) else space
    err = refused(tune=True, search_space=value)
    assert err.parameters == {"search_space"}, str(err)
    text = str(err)
    for fragment in fragments:
        assert fragment in text, text
    assert all(line.startswith("search_space: ") for line in text.splitlines())


def test_every_problem_of_the_space_is_named_at_once() -> None:
    space = [
        spec("momentum", min_value=0.5, max_value=0.9),
        spec("dropout", min_value=0.2, max_value=1.0),
        spec("learning_rate", min_value=0, max_value=0.1, scale="UNIT_LOG_SCALE"),
    ]
    lines = str(refused(tune=True, search_space=space)).splitlines()
    assert len(lines) == 3 and all(
        any(pid in line for line in lines) for pid in ("momentum", "dropout", "learning_rate")
    ), lines


def test_the_space_is_checked_only_when_tuning() -> None:
    """With `tune` false the space is never used (no tuning branch runs)."""
    check(tune=False, search_space=[spec("momentum", min_value=0.5, max_value=0.9)])


@pytest.mark.parametrize("target", ["vertex", "local"])
def test_each_targets_default_space_passes(target: str) -> None:
    assert check(target, tune=True) == []


def test_every_tunable_id_and_every_kind_of_spec_passes() -> None:
    space = [
        spec("learning_rate", min_value=1e-4, max_value=0.1, scale="UNIT_REVERSE_LOG_SCALE"),
        spec("dropout", min_value=0.0, max_value=0.5),
        spec("dense_units", "integer_value_spec", min_value=0, max_value=512),
        spec("per_replica_batch_size", "discrete_value_spec", scale="UNIT_LOG_SCALE", values=[8, 16, 32]),
        spec("epochs", "categorical_value_spec", values=["2", "3"]),
    ]
    assert sorted(s["parameter_id"] for s in space) == sorted(plan.TUNABLE)
    assert check(tune=True, search_space=space) == []


def test_grid_search_needs_an_all_discrete_space() -> None:
    assert check(tune=True, search_algorithm="GRID_SEARCH", search_space=CANONICAL) == []
    assert check(tune=True, search_algorithm="GRID_SEARCH", search_space=DECLARED) == []
    err = refused(tune=True, search_algorithm="GRID_SEARCH")  # the Vertex default has DOUBLEs
    assert err.parameters == {"search_algorithm", "search_space"}
    assert "the search_space's learning_rate, dropout are DOUBLE" in str(err)
    err = refused(tune=True, search_algorithm="GRID_SEARCH", search_space=[*CANONICAL, LR])
    assert "the search_space's learning_rate are DOUBLE" in str(err)


# --- the defaults of each target ----------------------------------------------------------------


def test_the_local_space_is_centred_on_the_local_defaults() -> None:
    """docs/options.md#the-search-space-search_space: two trials on the tiny backbone must not land
    far from the local defaults, which already reach the gate; a change of one without the other
    fails here."""
    local = {q.name: q.default_for("local") for q in pipeline.PARAMETERS}
    by_id = {s.parameter_id: s for s in tuning.parse_search_space(tuning.LOCAL_SEARCH_SPACE)}
    assert set(by_id) <= set(plan.TUNABLE) and len(by_id) <= local["max_trial_count"]
    lr = by_id["learning_rate"].double_value_spec
    middle = math.sqrt(lr.min_value * lr.max_value)  # the middle of a log scale
    assert middle / 1.5 <= local["learning_rate"] <= middle * 1.5, (local["learning_rate"], middle)
    dropout = by_id["dropout"].double_value_spec
    assert dropout.min_value <= local["dropout"] <= dropout.max_value
    assert tuning.LOCAL_SEARCH_SPACE != tuning.VERTEX_SEARCH_SPACE


@pytest.fixture(scope="module")
def vertex_spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return json.loads(pipeline.compile_pipeline(tmp_path_factory.mktemp("c") / "pipeline.json").read_text())


@pytest.fixture(scope="module")
def local_compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("c") / "local.json"
    compiler.Compiler().compile(pipeline.create_pipeline("local"), str(out))
    return json.loads(out.read_text())


def test_the_compiled_template_defaults_to_the_vertex_space(vertex_spec: dict[str, Any]) -> None:
    params = vertex_spec["root"]["inputDefinitions"]["parameters"]
    assert params["search_space"]["parameterType"] == "LIST"
    assert params["search_space"]["defaultValue"] == tuning.VERTEX_SEARCH_SPACE
    committed = json.loads(pipeline.COMPILED.read_text())["root"]["inputDefinitions"]["parameters"]
    assert committed["search_space"]["defaultValue"] == tuning.VERTEX_SEARCH_SPACE


def test_the_local_target_defaults_to_the_local_space(
    local_compiled: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    params = local_compiled["root"]["inputDefinitions"]["parameters"]
    assert params["search_space"]["defaultValue"] == tuning.LOCAL_SEARCH_SPACE
    # What `_local_tuning` hands the local tuning step: the run's search_space parameter.
    got: dict[str, Any] = {}
    original = pipeline.backends.local_steps.local_tuning_job

    def spy(**kwargs: Any) -> Any:
        got.update(kwargs)
        return original(**kwargs)

    monkeypatch.setattr(pipeline.backends.local_steps, "local_tuning_job", spy)
    compiler.Compiler().compile(pipeline.create_pipeline("local"), str(tmp_path / "local.json"))
    assert getattr(got["study_spec_parameters"], "name", None) == "search_space"
    tasks = walk(local_compiled)
    for task, key in (("tune-hyperparameters", "study_spec_parameters"), ("plan-jobs", "search_space")):
        inputs = tasks[task]["task"]["inputs"]["parameters"]
        assert inputs[key]["componentInputParameter"].removeprefix("pipelinechannel--") == "search_space", (
            task
        )


# --- a declared space reaches the jobs ------------------------------------------------------------


def test_a_declared_space_reaches_the_vertex_tuning_payload_and_the_trials_args(
    vertex_spec: dict[str, Any],
) -> None:
    declared = from_flag(json.dumps(DECLARED))
    root = root_values(vertex_spec, project="p", location="europe-west4", search_space=declared)
    upstream = {
        ("plan-jobs", "tuning_pools"): default_pools(vertex_spec),
        ("plan-jobs", "tuning_dir"): "gs://b/root/run/tune",
        ("plan-jobs", "measurement_selection_type"): "BEST_MEASUREMENT",
    }
    payload = render_payload(vertex_spec, "tune-hyperparameters", upstream, root)
    job = json_format.ParseDict(
        payload,
        aiplatform_v1.HyperparameterTuningJob.pb(aiplatform_v1.HyperparameterTuningJob()),
        ignore_unknown_fields=False,
    )
    # The launcher builds the request from the same dict (proto-plus: snake_case names only).
    for entry in payload["study_spec"]["parameters"]:
        aiplatform_v1.StudySpec.ParameterSpec(entry)
    epochs, units = job.study_spec.parameters
    assert (
        epochs.parameter_id,
        epochs.integer_value_spec.min_value,
        epochs.integer_value_spec.max_value,
    ) == (
        "epochs",
        2,
        4,
    )
    assert (units.parameter_id, list(units.discrete_value_spec.values)) == ("dense_units", [32, 64, 128])
    assert units.scale_type == aiplatform_v1.StudySpec.ParameterSpec.ScaleType.UNIT_LOG_SCALE
    # The tuning job's own args leave the declared flags out (each trial appends them) and keep
    # the pipeline's values of the others.
    from_steps: dict[tuple[str, str], Any] = {
        ("find-champion", "class_names"): [],
        ("find-champion", "champion_uri"): "",
    }
    from_steps |= {
        ("build-trainer-image", k): "img" for k in ("image_uri", "training_image_uri", "cpu_image_uri")
    }
    from_steps[("build-trainer-image", "dataflow_image_uri")] = ""
    inputs = task_inputs(vertex_spec, "plan-jobs", from_steps, root)
    flags = {name: inputs[name] for name in plan.MODEL_FLAGS}
    args, _ = plan.build_trainer_args(
        "gs://b/data", 300, flags, plan.TUNABLE, search_space=inputs["search_space"]
    )
    named = {a.split("=", 1)[0][2:] for a in args}
    assert not named & {"epochs", "dense_units"}
    assert {"learning_rate", "dropout", "per_replica_batch_size"} <= named


# --- trainer_args takes every id the space may declare ---------------------------------------------


def trainer_args(search_space: list[Any] | None = None) -> list[str]:
    args, _ = plan.build_trainer_args(
        "/data", 64.0, MODEL_FLAG_VALUES, plan.TUNABLE, search_space=search_space
    )
    return args


BEST = {"learning_rate": (0.0005, "0.0005"), "dropout": (0.3, "0.3"), "dense_units": (128.0, "128")}
BEST |= {"per_replica_batch_size": (32.0, "32"), "epochs": (5.0, "5")}  # numbers come back as doubles


@pytest.mark.parametrize("pid", plan.TUNABLE)
def test_trainer_args_leaves_out_and_overrides_every_tunable_flag(pid: str) -> None:
    """Every id a space may declare is a flag the planned jobs carry: left out of the trials'
    flags (each trial appends its own), and written over by the best trial's value."""
    assert [a for a in trainer_args() if a.startswith(f"--{pid}=")]
    tuned = trainer_args(search_space=[{"parameterId": pid}])
    assert not [a for a in tuned if a.startswith(f"--{pid}=")]
    value, text = BEST[pid]
    pools = [{"container_spec": {"args": trainer_args()}}]
    best, _ = plan.apply_hyperparameters(pools, {pid: value}, plan.TUNABLE)
    assert f"--{pid}={text}" in best[0]["container_spec"]["args"]


def test_trainer_args_refuses_a_space_beyond_the_tunable_flags() -> None:
    with pytest.raises(ValueError, match=r"search_space declares \['momentum'\]"):
        trainer_args(search_space=[{"parameter_id": "momentum"}])
    with pytest.raises(ValueError) as err:
        plan.apply_hyperparameters([], {"momentum": 0.9}, plan.TUNABLE)
    assert str(sorted(plan.TUNABLE)) in str(err.value)  # the same set as the plan's
