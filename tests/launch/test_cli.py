"""`make run`'s front end: target choice, flags from the parameter table, the screen filter and
the report's pictures."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path
from typing import Any

import pytest

import pipeline
from launch import cli, kfp_local, report


def test_project_comes_from_the_environment_then_env_sh(tmp_path: Path) -> None:
    env_sh = tmp_path / "env.sh"
    assert cli.configured_project({}, env_sh) == ""
    env_sh.write_text("# settings\nexport REGION=us-central1\nexport PROJECT_ID='my-proj'  # the project\n")
    assert cli.configured_project({}, env_sh) == "my-proj"
    assert cli.configured_project({"PROJECT_ID": "other"}, env_sh) == "other"
    env_sh.write_text("PROJECT_ID=\n")
    assert cli.configured_project({}, env_sh) == ""


def test_every_parameter_is_a_flag_with_its_type() -> None:
    params = pipeline.parameters_for("local")
    ns = cli.build_parser(params).parse_args(
        ["--epochs", "5", "--tune", "true", "--labels", '{"team": "ml"}', "--learning_rate", "0.01"]
    )
    args = cli.local_arguments(ns, params)
    assert (args["epochs"], args["tune"], args["labels"], args["learning_rate"]) == (
        5,
        True,
        {"team": "ml"},
        0.01,
    )
    assert args["backbone"] == "tiny" and args["dataset_source"] == "synthetic"  # local defaults
    assert {q.name for q in params} == set(args)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tune", "maybe"], "expected true or false"),
        (["--labels", "[1]"], "expected a JSON dict"),
        (["--worker_count", "two"], "invalid int value"),
    ],
)
def test_bad_flag_values_are_named(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser(pipeline.parameters_for("local")).parse_args(flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("overrides", "parameter", "message"),
    [
        ({"worker_count": 20}, "worker_count", "more processes than a local run should start"),
        (
            {"dataset_source": "imagenet"},
            "dataset_source",
            "must be tfds:NAME (e.g. tfds:cassava), folder:PATH",
        ),
        ({"dataset_source": "folder:/no/such/dir"}, "dataset_source", "no such folder"),
        ({"search_algorithm": "BAYES"}, "search_algorithm", "must be one of ALGORITHM_UNSPECIFIED"),
        ({"parallel_trial_count": 5}, "parallel_trial_count", "must be from 1 to max_trial_count"),
        ({"timeout": "10m"}, "timeout", "must be a duration in seconds"),
        ({"chief_machine_type": "big"}, "chief_machine_type", "is not a Compute Engine machine type name"),
        ({"epochs": 0}, "epochs", "--epochs: must be an integer between 1 and 10000, got 0"),
        (
            {"chief_accelerator_type": "NVIDIA_TESLA_T4", "chief_accelerator_count": 1},
            "chief_accelerator_count",
            (
                "GPU check failed: workerpool0 (chief) asked for 1 x NVIDIA_TESLA_T4 on n1-standard-8, "
                "but this machine (/proc/driver/nvidia/gpus) sees 0 GPUs"
            ),
        ),
        (  # the worker pool copies the chief's machine, with GPUs of its own
            {"worker_count": 1, "worker_machine_type": ""}
            | {"worker_accelerator_type": "NVIDIA_TESLA_T4", "worker_accelerator_count": 2},
            "worker_accelerator_count",
            "workerpool1 (worker) asked for 2 x NVIDIA_TESLA_T4",
        ),
        # What Vertex would refuse (or could not deploy) is refused locally too, before any step.
        ({"serving_tf_version": "2.21"}, "serving_tf_version", "'2.21' has no prebuilt Vertex AI TensorFlow"),
        ({"serving_tf_version": "2.14"}, "serving_tf_version", "2.14 has no local serving environment"),
        (
            {"serving_image": "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-14:latest"},
            "serving_image",
            "2.14 has no local serving environment",
        ),
        (
            {"serving_image": "not an image"},
            "serving_image",
            "must be auto, prebuilt, custom or an image URI",
        ),
        ({"model_display_name": "x" * 129}, "model_display_name", "Vertex allows at most 128"),
        ({"model_display_name": ""}, "model_display_name", "required"),
        ({"scheduling_strategy": "spot"}, "scheduling_strategy", "did you mean SPOT?"),
        ({"labels": {"Team": "ml"}}, "labels", "label key 'Team' is not valid"),
    ],
)
def test_local_settings_are_checked_before_any_step(
    overrides: dict[str, object], parameter: str, message: str
) -> None:
    from pipeline import options

    # Judged on tests/conftest.py's fixed day: serving_image=auto means the prebuilt image.
    args = {q.name: q.default_for("local") for q in pipeline.parameters_for("local")}
    with pytest.raises(options.OptionsError) as err:
        options.check({**args, **overrides}, "local")
    assert err.value.parameters >= {parameter}, str(err.value)
    lines = [str(p) for p in err.value.problems if parameter in p.parameters]
    assert any(message in line for line in lines), lines


def test_every_bad_local_setting_is_named_at_once() -> None:
    from pipeline import options

    args = {q.name: q.default_for("local") for q in pipeline.parameters_for("local")}
    bad = {"epochs": 0, "timeout": "soon", "labels": {"A": "b"}, "worker_count": 9}
    with pytest.raises(options.OptionsError) as err:
        options.check({**args, **bad}, "local")
    assert err.value.parameters >= set(bad)
    assert len(str(err.value).splitlines()) == len(err.value.problems)


def test_local_defaults_pass_validation() -> None:
    from pipeline import options

    options.check({q.name: q.default_for("local") for q in pipeline.parameters_for("local")}, "local")


def test_screen_shows_step_output_not_kfp_bookkeeping() -> None:
    screen = io.StringIO()
    tee = kfp_local.StepTee(screen)
    tee.step = "train-model"
    tee.write(
        "06:07:20.702 - INFO - Executing task 'x'\n"
        "    [KFP Executor 2026-11-21 06:07:20,761 INFO]: Got executor_input:\n"
        "    {\n"
        '        "inputs": {}\n'
        "    }\n"
        "    [train-model chief-0] epoch 1/4 started (9 steps)\n"
        "    done in 3.0s\n"
        "06:07:20.770 - INFO - Task 'x' outputs:\n"
        "    attempts: 1\n"
        "--------------------------------------------------------------------------------\n"
    )
    assert screen.getvalue().splitlines() == [
        "[train-model chief-0] epoch 1/4 started (9 steps)",
        "  train-model: done in 3.0s",
    ]


def test_report_draws_curves_and_the_confusion_matrix(tmp_path: Path) -> None:
    summary = {
        "pipeline": "p",
        "run_id": "r1",
        "target": "local",
        "status": "SUCCEEDED",
        "wall_seconds": 12.0,
        "steps": [{"name": "train-model", "status": "SUCCESS", "seconds": 3.0}],
        "model": {"name": "m", "version": "1", "path": "/x", "champion": True},
    }
    metrics = {
        "test_accuracy": 0.95,
        "history": {
            "loss": [1.0, 0.5],
            "val_loss": [1.1, 0.6],
            "accuracy": [0.5, 0.9],
            "val_accuracy": [0.4, 0.9],
        },
        "confusion_matrix": {"labels": ["a", "b"], "matrix": [[5, 1], [0, 6]]},
    }
    trials: list[dict[str, Any]] = [
        {
            "id": "1",
            "state": "SUCCEEDED",
            "parameters": [{"parameterId": "lr", "value": 0.1}],
            "finalMeasurement": {"metrics": [{"metricId": "val_accuracy", "value": 0.8}]},
        },
        {"id": "2", "state": "INFEASIBLE", "parameters": [{"parameterId": "lr", "value": 0.5}]},
    ]
    page = report.write_report(tmp_path / "report.html", summary, metrics, trials).read_text()
    images = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert len(images) == 3
    for data in images:
        assert base64.b64decode(data).startswith(b"\x89PNG")
    assert "0.95" in page and "INFEASIBLE" in page and "lr=0.5" in page
    no_metrics = report.write_report(
        tmp_path / "failed.html", {**summary, "status": "FAILED", "model": None}, None, None
    ).read_text()
    assert "data:image/png" not in no_metrics and "FAILED" in no_metrics


def test_report_marks_the_exported_epoch_and_shows_the_gates_two_figures(tmp_path: Path) -> None:
    history = {"accuracy": [0.5, 0.9, 0.8], "val_accuracy": [0.4, 0.9, 0.7]}
    assert report.curves_png(history, 2) != report.curves_png(history)  # the exported epoch's line
    summary: dict[str, Any] = {
        "run_id": "r",
        "pipeline": "p",
        "status": "SUCCEEDED",
        "target": "local",
        "wall_seconds": 1.0,
        "steps": [],
        "gate": {
            "promote": False,
            "reason": "below",
            "metric": "macro_f1",
            "score": 0.81,
            "champion_score": 0.875,
        },
    }
    metrics = {"test_accuracy": 0.9, "best_epoch": 2, "stopped_early": True, "history": history}
    page = report.write_report(tmp_path / "r.html", summary, metrics, None).read_text()
    assert "<td>macro_f1</td><td>0.8100</td><td>0.8750</td><td>hold</td><td>below</td>" in page
    assert "<td>best_epoch</td><td>2</td>" in page and "<td>stopped_early</td><td>True</td>" in page
    first = report.write_report(
        tmp_path / "f.html", {**summary, "gate": {**summary["gate"], "champion_score": -1.0}}, metrics, None
    )
    assert "<td>none</td><td>hold</td>" in first.read_text()
