from __future__ import annotations

import subprocess
import sys

import pytest

from tests.processes import ROOT, trainer_env
from trainer.config import parse_args

BASE = ["--data_dir=/data", "--model_dir=/out/model"]


def test_defaults_follow_the_codelab_and_vertex_environment() -> None:
    env = {
        "AIP_MODEL_DIR": "gs://b/job/model/",
        "AIP_CHECKPOINT_DIR": "gs://b/job/checkpoints/",
        "AIP_TENSORBOARD_LOG_DIR": "gs://b/job/logs/",
    }
    config = parse_args(["--data_dir=gs://b/data"], env)
    assert (config.model_dir, config.checkpoint_dir, config.tensorboard_dir) == (
        "gs://b/job/model",
        "gs://b/job/checkpoints",
        "gs://b/job/logs",
    )
    assert (config.backbone, config.weights, config.per_replica_batch_size, config.epochs) == (
        "resnet50",
        "imagenet",
        64,
        2,
    )
    assert config.hp_metric == "val_accuracy"
    assert config.fine_tune_fraction == 0.0  # pretrained: the head only
    assert (config.export_epoch, config.early_stopping_patience) == ("best", 0)  # the best, no early stop


def test_flags_override_the_environment_and_folders_default_beside_the_model() -> None:
    config = parse_args([*BASE], {"AIP_MODEL_DIR": "gs://elsewhere"})
    assert config.model_dir == "/out/model"
    assert config.checkpoint_dir == "/out/model_checkpoints"
    assert config.tensorboard_dir == "/out/model_logs"


def test_a_path_loses_its_trailing_slashes_but_the_root_stays_the_root() -> None:
    config = parse_args(["--data_dir=//", "--model_dir=gs://b/out//"], {})
    assert (config.data_dir, config.model_dir) == ("/", "gs://b/out")


def test_tuning_style_flags_are_accepted() -> None:
    config = parse_args(
        [*BASE, "--learning_rate=0.01", "--dense_units=128", "--mixed_precision=True", "--xla=0"], {}
    )
    assert (config.learning_rate, config.dense_units, config.mixed_precision, config.xla) == (
        0.01,
        128,
        True,
        False,
    )


def test_integer_flags_take_whole_numbers_as_vertex_tuning_formats_them() -> None:
    """Vertex hands INTEGER and DISCRETE trial values over as doubles (`32.0`)."""
    config = parse_args(
        [
            *BASE,
            "--per_replica_batch_size=16.0",
            "--epochs=1.0",
            "--dense_units=6.4e1",
            "--early_stopping_patience=2.0",
        ],
        {},
    )
    values = (
        config.per_replica_batch_size,
        config.epochs,
        config.dense_units,
        config.early_stopping_patience,
    )
    assert values == (16, 1, 64, 2)
    assert all(type(v) is int for v in values)


def test_random_backbones_are_trained_whole_unless_told_otherwise() -> None:
    assert parse_args([*BASE, "--backbone=tiny", "--weights=none"], {}).fine_tune_fraction == 1.0
    explicit = parse_args([*BASE, "--weights=none", "--fine_tune_fraction=0.25"], {})
    assert explicit.fine_tune_fraction == 0.25


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--epochs=0"], "--epochs: must be an integer between 1 and"),
        (["--epochs=two"], "--epochs: expected an integer"),
        (["--per_replica_batch_size=16.5"], "--per_replica_batch_size: expected a whole number, got '16.5'"),
        (["--dense_units=inf"], "--dense_units: expected a whole number"),
        (["--per_replica_batch_size=-4"], "--per_replica_batch_size: must be an integer between 1"),
        (["--learning_rate=0"], "--learning_rate: must be a number in (0, 1]"),
        (["--learning_rate=nan"], "--learning_rate: must be a number in (0, 1]"),
        (["--image_size=16"], "--image_size: must be an integer between 32 and 1024"),
        (["--backbone=vgg16"], "--backbone: invalid choice: 'vgg16' (choose from 'resnet50'"),
        (["--dropout=1"], "--dropout: must be a number in [0, 1)"),
        (["--fine_tune_fraction=1.5"], "--fine_tune_fraction: must be a number in [0, 1]"),
        (["--mixed_precision=maybe"], "--mixed_precision: must be true or false"),
        (["--hp_metric=auc"], "--hp_metric: invalid choice: 'auc' (choose from 'val_accuracy'"),
        (["--export_epoch=first"], "--export_epoch: invalid choice: 'first' (choose from 'best', 'last')"),
        (["--early_stopping_patience=-1"], "--early_stopping_patience: must be an integer >= 0, got -1"),
        (["--early_stopping_patience=1.5"], "--early_stopping_patience: expected a whole number, got '1.5'"),
        (["--backbone=tiny"], "--weights imagenet is not available for --backbone tiny"),
        (["--checkpoint_dir=/out/model/ckpt"], "--checkpoint_dir must not be --model_dir or inside it"),
    ],
)
def test_bad_flags_are_argparse_errors_naming_the_flag_and_what_is_allowed(
    flags: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args([*BASE, *flags], {})
    assert exit_info.value.code == 2
    assert expected in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "environ"),
    [
        (["--model_dir=/out/model", "--checkpoint_dir=/out/ckpt[1]"], {}),
        (["--model_dir=/out/model"], {"AIP_CHECKPOINT_DIR": "gs://b/job*/checkpoints"}),
        (["--model_dir=/out/run?/model"], {}),  # the default, beside the model
    ],
)
def test_a_checkpoint_folder_that_tensorflow_would_read_as_a_pattern_is_refused(
    flags: list[str], environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--data_dir=/data", *flags], environ)
    assert exit_info.value.code == 2
    assert "--checkpoint_dir" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--model_dir=out/model", "--checkpoint_dir=./out/model/ckpt"], "--checkpoint_dir"),
        (["--model_dir=/x/out/model", "--tensorboard_dir=/x/out//model/logs"], "--tensorboard_dir"),
        (["--model_dir=gs://b/m", "--checkpoint_dir=/gcs/b/m/ckpt"], "--checkpoint_dir"),
        (["--model_dir=/x/./m", "--checkpoint_dir=/x/m/../m/ckpt"], "--checkpoint_dir"),
        (["--model_dir=/data/.."], "--data_dir"),  # publishing the model would replace the dataset
        (["--model_dir=gs://"], "--model_dir"),
    ],
)
def test_folders_the_model_would_replace_are_refused_however_they_are_spelt(
    flags: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--data_dir=/data", *flags], {})
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err


def test_model_dir_is_required_without_aip_model_dir(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--data_dir=/data"], {})
    assert "--model_dir is required when AIP_MODEL_DIR is not set" in capsys.readouterr().err


def test_a_bad_flag_fails_before_tensorflow_is_imported() -> None:
    code = (
        "import sys\n"
        "from trainer import task\n"
        "try:\n"
        "    task.main(['--data_dir=/d', '--model_dir=/m', '--epochs=0'])\n"
        "except SystemExit as e:\n"
        "    print(e.code, 'tensorflow' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=trainer_env(), capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["2", "False"]
    assert "--epochs" in out.stderr
