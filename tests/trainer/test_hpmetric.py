"""The start-up check of the tuning metric file, and the decision EpochRecorder follows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.processes import ROOT, trainer_env
from trainer import hpmetric, task

IS_ROOT = os.geteuid() == 0


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hpmetric, "_warned", set())


@pytest.fixture(params=["file in the folder", "folder to create"])
def unwritable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(metric file path this process cannot write, the existing path that stops it).

    Not root: a folder with mode 0500, as /var/hypertune is for a user that does not own it.
    Root ignores permission bits, so there the path runs through a regular file instead."""
    if IS_ROOT:
        blocker = tmp_path / "not-a-folder"
        blocker.write_text("")
    else:
        blocker = tmp_path / "read-only"
        blocker.mkdir(mode=0o500)
    path = blocker / "output.metrics"
    if request.param == "folder to create":
        path = blocker / "hypertune" / "output.metrics"
    yield path, blocker
    if not IS_ROOT:
        blocker.chmod(0o700)


def env(path: Path | str, trial: str | None = None) -> dict[str, str]:
    out = {hpmetric.METRIC_FILE_ENV: str(path)}
    if trial is not None:
        out[hpmetric.TRIAL_ID_ENV] = trial
    return out


# --- the check --------------------------------------------------------------------------------


def test_the_default_path_is_hypertunes_own() -> None:
    from hypertune import hypertune as lib

    assert hpmetric.metric_file({}) == hpmetric.DEFAULT_METRIC_FILE == lib._DEFAULT_METRIC_PATH


def test_a_writable_path_passes_and_its_folder_is_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "output.metrics"
    assert hpmetric.check_metric_file(env(path)) == str(path)
    assert path.parent.is_dir() and path.read_text() == ""


def test_an_existing_file_is_not_truncated(tmp_path: Path) -> None:
    path = tmp_path / "output.metrics"
    path.write_text('{"trial": "3", "accuracy": "0.5"}\n')
    hpmetric.check_metric_file(env(path))
    assert path.read_text() == '{"trial": "3", "accuracy": "0.5"}\n'


def test_an_unwritable_path_fails_naming_the_path_the_uid_and_the_owner(
    unwritable: tuple[Path, Path],
) -> None:
    path, blocker = unwritable
    with pytest.raises(hpmetric.MetricFileError) as info:
        hpmetric.check_metric_file(env(path))
    message = str(info.value)
    assert str(path) in message
    assert f"uid {os.geteuid()}" in message and f"gid {os.getegid()}" in message
    assert f"{blocker} is owned by {os.stat(blocker).st_uid}" in message, message
    remedies = ["Dockerfile", hpmetric.METRIC_FILE_ENV] + ([] if IS_ROOT else ["run the image as root"])
    assert all(r in message for r in remedies), message
    assert not path.exists()


def test_an_empty_variable_is_refused() -> None:
    with pytest.raises(hpmetric.MetricFileError, match="set but empty"):
        hpmetric.check_metric_file({hpmetric.METRIC_FILE_ENV: ""})


@pytest.mark.parametrize(("value", "trial"), [("0", True), ("17", True), ("", False), (None, False)])
def test_a_trial_is_told_by_its_trial_id(value: str | None, trial: bool) -> None:
    environ = {} if value is None else {hpmetric.TRIAL_ID_ENV: value}
    assert hpmetric.in_trial(environ) is trial


# --- the decision -------------------------------------------------------------------------------


def test_in_a_trial_an_unwritable_file_is_fatal(unwritable: tuple[Path, Path]) -> None:
    path, _ = unwritable
    with pytest.raises(hpmetric.MetricFileError, match=str(path)):
        hpmetric.reporting_file(env(path, trial="4"))
    with pytest.raises(hpmetric.MetricFileError):
        hpmetric.open_reporter(env(path, trial="4"))


def test_outside_a_trial_it_warns_once_and_the_metric_is_not_reported(
    unwritable: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = unwritable
    assert hpmetric.reporting_file(env(path)) is None
    err = capsys.readouterr().err
    assert str(path) in err and "training goes on" in err, err
    assert hpmetric.open_reporter(env(path)) is None
    assert capsys.readouterr().err == "", "the same warning twice"


def test_a_writable_file_is_reported_to_outside_a_trial_too(tmp_path: Path) -> None:
    path = tmp_path / "output.metrics"
    assert hpmetric.reporting_file(env(path)) == str(path)


def _write_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trial: str | None, reports: list[dict[str, Any]]
) -> tuple[str, str]:
    """(our file, cloudml-hypertune's file) after the same reports at the same clock: the library
    built through its public constructor, reading the process environment."""
    import hypertune

    ours, theirs = tmp_path / "ours" / "output.metrics", tmp_path / "theirs" / "output.metrics"
    reporter = hpmetric.open_reporter(env(ours, trial=trial))
    assert isinstance(reporter, hpmetric.MetricReporter)
    monkeypatch.setenv(hpmetric.METRIC_FILE_ENV, str(theirs))
    if trial is None:
        monkeypatch.delenv(hpmetric.TRIAL_ID_ENV, raising=False)
    else:
        monkeypatch.setenv(hpmetric.TRIAL_ID_ENV, trial)
    stock = hypertune.HyperTune()
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.125)  # the same clock for both
    for report in reports:
        for r in (reporter, stock):
            r.report_hyperparameter_tuning_metric(**report)
    return ours.read_text(), theirs.read_text()


def test_the_reporter_writes_what_hypertune_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reports = [
        {"hyperparameter_metric_tag": "val_accuracy", "metric_value": 0.25 * step, "global_step": step}
        for step in (1, 2)
    ]
    ours, theirs = _write_both(tmp_path, monkeypatch, "7", reports)
    assert ours == theirs
    assert [{k: v for k, v in json.loads(x).items() if k != "timestamp"} for x in ours.splitlines()][-1] == {
        "trial": "7",
        "val_accuracy": "0.5",
        "global_step": "2",
        "checkpoint_path": "",
    }


@pytest.mark.parametrize(
    "report",
    [
        {"hyperparameter_metric_tag": "val_accuracy", "metric_value": 0.1, "global_step": 3},
        {"hyperparameter_metric_tag": "", "metric_value": 1, "global_step": None},  # the default tag
        {"hyperparameter_metric_tag": "loss", "metric_value": "0.5", "global_step": 0},
        {
            "hyperparameter_metric_tag": "loss",
            "metric_value": 2.5,
            "global_step": 4.9,
            "checkpoint_path": "gs://b/c",
        },
        {"hyperparameter_metric_tag": "loss", "metric_value": float("nan")},
    ],
)
@pytest.mark.parametrize("trial", ["12", None])
def test_the_reporters_file_is_hypertunes_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, report: dict[str, Any], trial: str | None
) -> None:
    ours, theirs = _write_both(tmp_path, monkeypatch, trial, [report])
    assert ours == theirs


def test_the_reporter_keeps_as_many_entries_as_hypertune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports = [
        {"hyperparameter_metric_tag": "val_accuracy", "metric_value": i / 7, "global_step": i}
        for i in range(1, 106)
    ]
    ours, theirs = _write_both(tmp_path, monkeypatch, "3", reports)
    assert ours == theirs
    assert len(ours.splitlines()) == hpmetric.KEPT_ENTRIES
    assert json.loads(ours.splitlines()[0])["global_step"] == "6"


def test_the_reporter_does_not_need_the_process_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unlike `HyperTune()`, it writes where the checked `environ` says, with its trial id."""
    monkeypatch.setenv(hpmetric.METRIC_FILE_ENV, str(tmp_path / "elsewhere" / "output.metrics"))
    monkeypatch.setenv(hpmetric.TRIAL_ID_ENV, "99")
    path = tmp_path / "checked.metrics"
    reporter = hpmetric.open_reporter(env(path, trial="5"))
    assert reporter is not None
    reporter.report_hyperparameter_tuning_metric("val_accuracy", 0.5, 1)
    assert json.loads(path.read_text())["trial"] == "5"
    assert not (tmp_path / "elsewhere").exists()


# --- trainer.task -------------------------------------------------------------------------------


def test_a_trial_that_cannot_write_its_metric_stops_at_once_before_tensorflow(
    unwritable: tuple[Path, Path],
) -> None:
    path, _ = unwritable
    started = time.monotonic()
    out = subprocess.run(
        # -X importtime lists every module imported, on stderr.
        [sys.executable, "-X", "importtime", "-m", "trainer.task", "--data_dir=/d", "--model_dir=/m"],
        cwd=ROOT,
        env=trainer_env(env(path, trial="3")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert out.returncode == 2, out.stderr[-3000:]
    message = [line for line in out.stderr.splitlines() if not line.startswith("import time:")]
    assert message and message[0].startswith("python -m trainer.task: error: cannot write"), message
    assert str(path) in message[0] and f"uid {os.geteuid()}" in message[0]
    imported = {
        line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")
    }
    assert {"trainer.config", "trainer.distribute", "trainer.hpmetric"} <= imported  # (task is __main__)
    assert not {m for m in imported if m.split(".")[0] in ("tensorflow", "tf_keras", "keras")}
    assert elapsed < 15, f"{elapsed:.1f}s"  # well under a second unloaded; slack for busy CI


def _main(monkeypatch: pytest.MonkeyPatch, environ: dict[str, str]) -> tuple[int, list[Any]]:
    """task.main with this environment and `run` replaced: (exit status, run's calls)."""
    for key in [k for k in os.environ if k.startswith(("CLOUD_ML", "TF_CONFIG", "AIP_"))]:
        monkeypatch.delenv(key)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    calls: list[Any] = []
    monkeypatch.setattr(task, "run", lambda config, **kw: calls.append(kw))
    return task.main(["--data_dir=/d", "--model_dir=/m"]), calls


def test_outside_a_trial_training_goes_on(
    unwritable: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = unwritable
    code, calls = _main(monkeypatch, env(path))
    assert (code, len(calls)) == (0, 1)
    assert "warning: cannot write" in capsys.readouterr().err


def test_a_trial_stops_before_training(
    unwritable: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = unwritable
    code, calls = _main(monkeypatch, env(path, trial="1"))
    assert (code, calls) == (2, [])
    assert str(path) in capsys.readouterr().err


def test_workers_do_not_report_so_they_do_not_check(
    unwritable: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = unwritable
    tf_config = {
        "cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
        "task": {"type": "worker", "index": 0},
    }
    code, calls = _main(monkeypatch, {**env(path, trial="1"), "TF_CONFIG": json.dumps(tf_config)})
    assert (code, len(calls)) == (0, 1)


# --- EpochRecorder (no training: its epoch-end hook is called directly) -----------------------------


def test_epoch_recorder_outside_a_trial_records_history_without_reporting(
    unwritable: tuple[Path, Path], tmp_path: Path
) -> None:
    from trainer.callbacks import EpochRecorder

    path, _ = unwritable
    recorder = EpochRecorder(str(tmp_path / "history.json"), "val_accuracy", env(path))
    recorder.on_epoch_end(0, {"val_accuracy": 0.5, "loss": 1.0})
    assert json.loads((tmp_path / "history.json").read_text()) == {"1": {"val_accuracy": 0.5, "loss": 1.0}}
    assert not path.exists()


def test_epoch_recorder_in_a_trial_refuses_an_unwritable_file_before_training(
    unwritable: tuple[Path, Path], tmp_path: Path
) -> None:
    from trainer.callbacks import EpochRecorder

    path, _ = unwritable
    with pytest.raises(hpmetric.MetricFileError):
        EpochRecorder(str(tmp_path / "history.json"), "val_accuracy", env(path, trial="2"))


def test_epoch_recorder_in_a_trial_reports_to_the_checked_file(tmp_path: Path) -> None:
    from trainer.callbacks import EpochRecorder

    path = tmp_path / "hypertune" / "output.metrics"
    recorder = EpochRecorder(str(tmp_path / "history.json"), "val_accuracy", env(path, trial="2"))
    recorder.on_epoch_end(0, {"val_accuracy": 0.75})
    [line] = [json.loads(x) for x in path.read_text().splitlines()]
    assert (line["trial"], line["val_accuracy"], line["global_step"]) == ("2", "0.75", "1")
