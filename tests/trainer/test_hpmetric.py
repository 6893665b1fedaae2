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


def test_the_default_path_is_hypertunes_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hypertune import hypertune as lib

    assert hpmetric.DEFAULT_METRIC_FILE == lib._DEFAULT_METRIC_PATH
    monkeypatch.setattr(hpmetric, "DEFAULT_METRIC_FILE", str(tmp_path / "output.metrics"))
    assert hpmetric.reporting_file({}) == str(tmp_path / "output.metrics")


def test_a_writable_path_passes_and_its_folder_is_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "output.metrics"
    assert hpmetric.reporting_file(env(path, trial="1")) == str(path)
    assert path.parent.is_dir() and path.read_text() == ""


def test_an_existing_file_is_not_truncated(tmp_path: Path) -> None:
    path = tmp_path / "output.metrics"
    path.write_text('{"trial": "3", "accuracy": "0.5"}\n')
    hpmetric.reporting_file(env(path, trial="3"))
    assert path.read_text() == '{"trial": "3", "accuracy": "0.5"}\n'


@pytest.mark.parametrize("trial", ["0", "4"])
def test_in_a_trial_an_unwritable_file_is_fatal_naming_the_path_and_the_uid(
    unwritable: tuple[Path, Path], trial: str
) -> None:
    path, _ = unwritable
    with pytest.raises(hpmetric.MetricFileError) as info:
        hpmetric.reporting_file(env(path, trial=trial))
    assert str(path) in str(info.value) and f"uid {os.geteuid()}" in str(info.value)
    assert hpmetric.METRIC_FILE_ENV in str(info.value)
    assert not path.exists()


@pytest.mark.parametrize("value", ["", "output.metrics"])
def test_an_empty_variable_or_a_path_with_no_folder_is_refused_in_a_trial(value: str) -> None:
    """HyperTune() makes the file's folder with os.makedirs, which fails on a path with none."""
    with pytest.raises(hpmetric.MetricFileError, match=hpmetric.METRIC_FILE_ENV):
        hpmetric.reporting_file({hpmetric.METRIC_FILE_ENV: value, hpmetric.TRIAL_ID_ENV: "1"})


@pytest.mark.parametrize("trial", [None, ""])
def test_outside_a_trial_it_warns_once_and_the_metric_is_not_reported(
    unwritable: tuple[Path, Path], capsys: pytest.CaptureFixture[str], trial: str | None
) -> None:
    path, _ = unwritable
    assert hpmetric.reporting_file(env(path, trial=trial)) is None
    err = capsys.readouterr().err
    assert str(path) in err and err.startswith("warning: "), err
    assert hpmetric.reporting_file(env(path, trial=trial)) is None
    assert capsys.readouterr().err == "", "the same warning twice"


def test_a_writable_file_is_reported_to_outside_a_trial_too(tmp_path: Path) -> None:
    path = tmp_path / "output.metrics"
    assert hpmetric.reporting_file(env(path)) == str(path)


# --- trainer.task -------------------------------------------------------------------------------


@pytest.mark.serial  # timed: beside one other serial test at most (make test)
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


def _recorder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, environ: dict[str, str]) -> Any:
    """An EpochRecorder built under `environ` (HyperTune reads the process environment)."""
    from trainer.callbacks import EpochRecorder

    monkeypatch.delenv(hpmetric.TRIAL_ID_ENV, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    return EpochRecorder(str(tmp_path / "history.json"), "val_accuracy")


def test_epoch_recorder_outside_a_trial_records_history_without_reporting(
    unwritable: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = unwritable
    recorder = _recorder(monkeypatch, tmp_path, env(path))
    recorder.on_epoch_end(0, {"val_accuracy": 0.5, "loss": 1.0})
    assert json.loads((tmp_path / "history.json").read_text()) == {"1": {"val_accuracy": 0.5, "loss": 1.0}}
    assert not path.exists()


def test_epoch_recorder_in_a_trial_refuses_an_unwritable_file_before_training(
    unwritable: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = unwritable
    with pytest.raises(hpmetric.MetricFileError):
        _recorder(monkeypatch, tmp_path, env(path, trial="2"))


def test_epoch_recorder_in_a_trial_reports_to_the_checked_file_in_hypertunes_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "hypertune" / "output.metrics"
    recorder = _recorder(monkeypatch, tmp_path, env(path, trial="2"))
    for epoch in range(3):
        recorder.on_epoch_end(epoch, {"val_accuracy": 0.25 * (epoch + 1)})
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(x["trial"], x["val_accuracy"], x["global_step"]) for x in lines] == [
        ("2", "0.25", "1"),
        ("2", "0.5", "2"),
        ("2", "0.75", "3"),
    ]
