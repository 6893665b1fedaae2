"""The default screen of `make run`: progress and results, not every replica's line."""

from __future__ import annotations

import io

import pytest

from launch import console, kfp_local

SHOWN = [
    (
        "[train-model chief-0] [chief-0] epoch 2/6 done in 0.8s: loss=0.5 val_accuracy=0.75",
        "    epoch 2/6 done",
    ),
    # Why training ended before --epochs, and which epoch's weights are published.
    (
        "[train-model chief-0] [chief-0] early stopping: no improvement of val_accuracy for 5 epochs since epoch 3",
        "    early stopping: no improvement",
    ),
    ("[train-model chief-0] [chief-0] exporting epoch 3 (best val_accuracy=1.0000)", "    exporting epoch 3"),
    ("[prepare-dataset chief-0] prepare: train 300/300 images (100%) in 0.7s", "    prepare: train 300/300"),
    ("[trial-2 chief-0] [chief-0] epoch 1/2 done in 1.0s: val_accuracy=0.5", "    trial-2: epoch 1/2 done"),
    ("[tune] trial 2 started: --learning_rate=0.001 --dense_units=64.0", "    trial 2 started"),
    ("[tune] trial 2 val_accuracy=0.8100", "    trial 2 val_accuracy=0.8100"),
    (
        "[train-model] chief-0 was killed (signal 9): restarting the whole job (1/3 restarts)",
        "    train-model: chief-0",
    ),
    # The evaluation job's figures of both models on this run's test split.
    (
        "[evaluate-models chief-0] evaluated champion: accuracy 0.9100, macro F1 0.9000 on this test split",
        "    evaluated champion: accuracy 0.9100",
    ),
    ("PROMOTE: test accuracy 0.95 >= 0.90; no champion yet", "    PROMOTE: test accuracy"),
    ("registered cassava-classifier version 3 at /x", "    registered cassava-classifier"),
    # The first local run makes the serving check's environment: say why the step takes a while.
    (
        "making the TensorFlow 2.15 serving environment in /x/.cache/serving-tf-2.15 (...); once",
        "    making the",
    ),
]
HIDDEN = [
    "[train-model worker-0] [worker-0] epoch 2/6 done in 0.8s: loss=0.5",  # the chief speaks for the job
    "[train-model worker-0] [worker-0] exporting epoch 3 (best val_accuracy=1.0000)",
    "[train-model chief-0] I0000 00:00:1795380548.926534   29277 port.cc:153] oneDNN custom operations are on.",
    "[train-model chief-0] WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    '[train-model chief-0] [chief-0] config: {"augment": true}',
    "[train-model chief-0] [chief-0] epoch 3/6 started (9 steps)",
    "[train-model] attempt 1: starting chief-0, worker-0",
    "trainer args: --data_dir=/x --epochs=6",
    "worker pools for /x:",
    "[evaluate-models chief-0] evaluating champion: 25/100 test images",
]


@pytest.mark.parametrize(("line", "start"), SHOWN)
def test_progress_and_results_are_shown(line: str, start: str) -> None:
    shown = console.headline(line)
    assert shown is not None and shown.startswith(start), shown


@pytest.mark.parametrize("line", HIDDEN)
def test_everything_else_goes_only_to_the_log(line: str) -> None:
    assert console.headline(line) is None


def test_quiet_tee_logs_everything_and_shows_the_headlines(tmp_path: object) -> None:
    screen, log = io.StringIO(), io.StringIO()
    tee = kfp_local.StepTee(screen, verbose=False)
    tee.log, tee.step = log, "train-model"
    lines = [*HIDDEN, SHOWN[0][0], "[KFP Executor 20:50:24.1 INFO]: Got executor_input:", "    {", "    }"]
    tee.write("\n".join(lines) + "\n")
    assert log.getvalue() == "\n".join(lines) + "\n"  # the step log has every line
    assert screen.getvalue().splitlines() == ["    epoch 2/6 done in 0.8s: loss=0.5 val_accuracy=0.75"]
    assert "\x1b" not in screen.getvalue()


def test_verbose_tee_shows_every_line_but_kfp_bookkeeping() -> None:
    screen = io.StringIO()
    tee = kfp_local.StepTee(screen, verbose=True)
    tee.step = "train-model"
    tee.write("\n".join(HIDDEN) + "\n")
    assert len(screen.getvalue().splitlines()) == len(HIDDEN)
