"""The typed spec/args/evaluation components, through their Python functions."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from kfp import dsl

from components import evaluation, prepare, runtime, training, worker_pools

ROOT = Path(__file__).resolve().parents[2]
V100 = "NVIDIA_TESLA_V100"


def pools(**overrides: Any) -> list[dict[str, Any]]:
    args: dict[str, Any] = {
        "image_uri": "img@sha256:" + "0" * 64,
        "command": ["python", "-m", "trainer.task"],
        "args": ["--epochs=2"],
        "chief_machine_type": "n1-standard-8",
        "chief_accelerator_type": V100,
        "chief_accelerator_count": 1,
        "worker_count": 1,
        "worker_machine_type": "n1-standard-8",
        "worker_accelerator_type": V100,
        "worker_accelerator_count": 1,
    }
    return worker_pools.build_worker_pool_specs(**{**args, **overrides})


def test_the_defaults_give_one_chief_and_workers_with_gpus(tmp_path: Path) -> None:
    job_dir = dsl.Artifact(uri=str(tmp_path / "job") + "/")
    out = worker_pools.worker_pool_specs.python_func(
        image_uri="img",
        command=["python", "-m", "trainer.task"],
        args=["--epochs=2"],
        chief_machine_type="n1-standard-8",
        chief_accelerator_type=V100,
        chief_accelerator_count=1,
        worker_count=3,
        worker_machine_type="n1-standard-8",
        worker_accelerator_type=V100,
        worker_accelerator_count=1,
        job_dir=job_dir,
        region="us-central1",
    )
    chief, workers = out.worker_pool_specs
    assert chief["replica_count"] == 1 and workers["replica_count"] == 3
    for pool in (chief, workers):
        assert pool["machine_spec"] == {
            "machine_type": "n1-standard-8",
            "accelerator_type": V100,
            "accelerator_count": 1,
        }
        assert pool["container_spec"] == {
            "image_uri": "img",
            "command": ["python", "-m", "trainer.task"],
            "args": ["--epochs=2"],
            "env": [
                {"name": "TRAINER_POOL_MACHINE_TYPE", "value": "n1-standard-8"},
                {"name": "TRAINER_POOL_ACCELERATOR_TYPE", "value": V100},
                {"name": "TRAINER_POOL_ACCELERATOR_COUNT", "value": "1"},
            ],
        }
        assert pool["disk_spec"] == {"boot_disk_type": "pd-ssd", "boot_disk_size_gb": 100}
    assert out.base_output_directory == str(tmp_path / "job")


def test_no_workers_is_one_pool_and_cpu_pools_carry_no_accelerator() -> None:
    [chief] = pools(worker_count=0, chief_accelerator_type="", chief_accelerator_count=0)
    assert chief["machine_spec"] == {"machine_type": "n1-standard-8"}


def test_empty_worker_settings_copy_the_chiefs() -> None:
    _, workers = pools(worker_machine_type="", worker_accelerator_type="", worker_accelerator_count=0)
    assert workers["machine_spec"] == {
        "machine_type": "n1-standard-8",
        "accelerator_type": V100,
        "accelerator_count": 1,
    }


def test_reduction_server_is_pool_two() -> None:
    specs = pools(worker_count=2, reduction_server_count=2)
    assert len(specs) == 3
    assert specs[2]["replica_count"] == 2
    assert specs[2]["container_spec"]["image_uri"].endswith("/reductionserver:latest")
    with pytest.raises(ValueError, match="Reduction Server pool needs GPU workers"):
        pools(worker_count=0, reduction_server_count=1)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            {"chief_accelerator_count": 3},
            r"chief pool: n1-standard-8 takes 1 or 2 or 4 or 8 x NVIDIA_TESLA_V100, not 3",
        ),
        (
            {"worker_accelerator_type": "NVIDIA_L4"},
            r"worker pool: NVIDIA_L4 cannot be attached to n1-standard-8",
        ),
        (
            {"worker_accelerator_count": 0},
            r"worker pool: accelerator type NVIDIA_TESLA_V100 needs an accelerator count",
        ),
        ({"region": "europe-west2"}, r"chief pool: NVIDIA_TESLA_V100 is not offered in europe-west2"),
        ({"worker_count": -1}, "worker_count: must be a whole number from 0 to 512"),
        ({"boot_disk_type": "ssd"}, "boot_disk_type: 'ssd' is not one of pd-ssd"),
        ({"boot_disk_size_gb": 10}, "boot_disk_size_gb: must be from 100 to 64000"),
        ({"image_uri": ""}, "image_uri: required"),
        ({"command": []}, "command: must be a non-empty list"),
    ],
)
def test_bad_settings_are_named(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        pools(**overrides)


def test_prepare_args() -> None:
    args = prepare.prepare_args.python_func(
        source="synthetic", image_size=64, shards=8, synthetic_per_class=30
    )
    assert args[:4] == ["--source=synthetic", "--image_size=64", "--shards=8", "--seed=42"]
    assert "--synthetic_per_class=30" in args and args[-1] == "--overwrite"
    assert not any(a.startswith("--output_dir") for a in args)  # AIP_MODEL_DIR is the output
    assert "--synthetic_per_class=60" not in prepare.prepare_args.python_func(
        source="tfds:cassava", image_size=300
    )
    with pytest.raises(ValueError, match="source must be tfds:NAME, folder:PATH or synthetic"):
        prepare.prepare_args.python_func(source="cassava", image_size=300)


def write_dataset(folder: Path) -> None:
    folder.mkdir(parents=True)
    meta = {
        "class_names": ["cbb", "cbsd", "cgm", "cmd", "healthy"],
        "image_size": 64,
        "fingerprint": "sha256:abc",
        "splits": {"train": {"count": 300}, "validation": {"count": 100}, "test": {"count": 100}},
    }
    (folder / "metadata.json").write_text(json.dumps(meta))


def test_register_dataset_points_at_the_job_output(tmp_path: Path) -> None:
    write_dataset(tmp_path / "job" / "model")
    dataset = dsl.Dataset(uri=str(tmp_path / "elsewhere"))
    out = prepare.register_dataset.python_func(base_output_directory=str(tmp_path / "job"), dataset=dataset)
    assert dataset.uri == str(tmp_path / "job" / "model")
    assert (out.num_classes, out.train_examples) == (5, 300)
    assert dataset.metadata["image_size"] == 64 and dataset.metadata["test_examples"] == 100
    # What check-same-task compares with the champion's, before any training.
    assert dataset.metadata["class_names"] == ["cbb", "cbsd", "cgm", "cmd", "healthy"]
    with pytest.raises(RuntimeError, match=r"left no readable dataset in .*empty/model"):
        prepare.register_dataset.python_func(base_output_directory=str(tmp_path / "empty"), dataset=dataset)


def trainer_args(**overrides: Any) -> Any:
    dataset = dsl.Dataset(uri="gs://b/data", metadata={"image_size": 64.0})
    args: dict[str, Any] = {
        "dataset": dataset,
        "backbone": "tiny",
        "weights": "none",
        "epochs": 3,
        "learning_rate": 0.003,
        "per_replica_batch_size": 16,
        "dense_units": 64,
        "dropout": 0.2,
        "mixed_precision": False,
        "xla": False,
    }
    return training.trainer_args.python_func(**{**args, **overrides})


def test_trainer_args_apply_the_best_trial_and_leave_out_tuned_flags() -> None:
    plain = trainer_args()
    assert plain.args == [
        "--data_dir=gs://b/data",
        "--backbone=tiny",
        "--weights=none",
        "--image_size=64",
        "--mixed_precision=false",
        "--xla=false",
        "--seed=42",  # the pipeline's seed reaches training, not only the split carving
        "--augment=auto",
        "--lr_schedule=cosine",
        "--warmup_epochs=1.0",
        "--lr_reference_batch_size=0",
        "--label_smoothing=0.0",
        "--class_weights=none",
        "--export_epoch=best",
        "--early_stopping_patience=0",
        "--learning_rate=0.003",
        "--per_replica_batch_size=16",
        "--dense_units=64",
        "--dropout=0.2",
        "--epochs=3",
    ]
    tuned = trainer_args(
        hyperparameters={"learning_rate": 0.0007, "dense_units": 256.0, "per_replica_batch_size": 32}
    )
    assert "--learning_rate=0.0007" in tuned.args and "--dense_units=256" in tuned.args
    assert "--per_replica_batch_size=32" in tuned.args
    assert tuned.hyperparameters["dense_units"] == 256 and isinstance(
        tuned.hyperparameters["dense_units"], int
    )
    trial = trainer_args(leave_out=["learning_rate", "dropout"], fine_tune_fraction=0.5, seed=7)
    assert not any(a.startswith(("--learning_rate", "--dropout")) for a in trial.args)
    assert "--seed=7" in trial.args
    assert "--fine_tune_fraction=0.5" in trial.args


def test_trainer_args_reject_unknown_or_fractional_hyperparameters() -> None:
    with pytest.raises(ValueError, match=r"unknown hyperparameters \['momentum'\]"):
        trainer_args(hyperparameters={"momentum": 0.9})
    with pytest.raises(ValueError, match="dense_units must be a whole number"):
        trainer_args(hyperparameters={"dense_units": 12.5})


def write_model(folder: Path, accuracy: float = 0.93, class_names: tuple[str, ...] = ("a", "b")) -> None:
    folder.mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(b"pb")
    metrics = {
        "test_accuracy": accuracy,
        "test_loss": 0.2,
        "val_accuracy": 0.91,
        "val_loss": 0.25,
        "images_per_second": 150.0,
        "epochs_completed": 3,
        "num_workers": 2,
        "confusion_matrix": {"labels": ["a", "b"], "matrix": [[9, 1], [0, 10]]},
        "class_names": list(class_names),
    }
    (folder / "metrics.json").write_text(json.dumps(metrics))


def test_model_from_job_requires_a_saved_model(tmp_path: Path) -> None:
    write_model(tmp_path / "job" / "model")
    model = dsl.Model(uri=str(tmp_path / "x"))
    out = training.model_from_job.python_func(base_output_directory=str(tmp_path / "job"), model=model)
    assert model.uri == out.model_uri == str(tmp_path / "job" / "model")
    assert out.test_accuracy == 0.93 and model.metadata["num_workers"] == 2
    (tmp_path / "bad" / "model").mkdir(parents=True)
    with pytest.raises(RuntimeError, match="published no SavedModel"):
        training.model_from_job.python_func(base_output_directory=str(tmp_path / "bad"), model=model)


def write_evaluation(base: Path, challenger: dict[str, float], champion: dict[str, float] | None) -> str:
    """The evaluation job's output (`<base>/model/evaluation.json`, as trainer.evaluate writes it)."""

    def entry(figures: dict[str, float], recorded: dict[str, float]) -> dict[str, Any]:
        return {
            "examples": 20,
            "loss": 0.3,
            **figures,
            "per_class": {"a": {"precision": 0.9, "recall": 1.0, "f1": 0.947, "support": 10}},
            "confusion_matrix": {"labels": ["a", "b"], "matrix": [[10, 0], [2, 8]]},
            "recorded": recorded,
        }

    models = {"challenger": entry(challenger, {})}
    if champion is not None:
        models["champion"] = entry(champion, {"accuracy": 0.99, "macro_f1": 0.98})
    (base / "model").mkdir(parents=True)
    document = {"split": "test", "dataset_fingerprint": "sha256:" + "ab" * 32, "models": models}
    (base / "model" / "evaluation.json").write_text(json.dumps(document))
    return str(base)


def gate(tmp_path: Path, metric: str, new: dict[str, float], old: dict[str, float] | None, **kw: Any) -> Any:
    if not (tmp_path / "model").exists():
        write_model(tmp_path / "model")
    metrics = dsl.Metrics(uri=str(tmp_path / "m"))
    confusion = dsl.ClassificationMetrics(uri=str(tmp_path / "c"))
    out = evaluation.evaluate_model.python_func(
        model=dsl.Model(uri=str(tmp_path / "model")),
        evaluation_dir=write_evaluation(tmp_path / "evaluation", new, old),
        gate_metric=metric,
        min_score=kw.get("min_score", 0.8),
        champion_class_names=kw.get("champion_class_names", ["a", "b"] if old else []),
        champion_version="projects/p/locations/l/models/7@3" if old else "",
        metrics=metrics,
        confusion=confusion,
    )
    return out, metrics, confusion


@pytest.mark.parametrize(
    ("metric", "new", "old", "promote", "reason"),
    [
        ("accuracy", {"accuracy": 0.93, "macro_f1": 0.85}, None, True, "test accuracy 0.9300 >= min_score 0.8000; no champion yet"),
        ("accuracy", {"accuracy": 0.93, "macro_f1": 0.85}, {"accuracy": 0.90, "macro_f1": 0.95}, True, ">= the champion's 0.9000 on this test split (it recorded 0.9900 on its own test split)"),
        ("accuracy", {"accuracy": 0.93, "macro_f1": 0.85}, {"accuracy": 0.93, "macro_f1": 0.95}, True, ">= the champion's 0.9300"),
        ("accuracy", {"accuracy": 0.93, "macro_f1": 0.85}, {"accuracy": 0.95, "macro_f1": 0.80}, False, "test accuracy 0.9300 is below the champion's 0.9500 on this test split"),
        # The same figures judged on macro F1 turn both decisions around.
        ("macro_f1", {"accuracy": 0.93, "macro_f1": 0.85}, {"accuracy": 0.90, "macro_f1": 0.95}, False, "test macro F1 0.8500 is below the champion's 0.9500 on this test split (it recorded 0.9800"),
        ("macro_f1", {"accuracy": 0.93, "macro_f1": 0.85}, {"accuracy": 0.95, "macro_f1": 0.80}, True, "test macro F1 0.8500 >= the champion's 0.8000"),
        ("accuracy", {"accuracy": 0.70, "macro_f1": 0.85}, None, False, "test accuracy 0.7000 is below min_score 0.8000"),
        ("macro_f1", {"accuracy": 0.93, "macro_f1": 0.75}, None, False, "test macro F1 0.7500 is below min_score 0.8000"),
    ],
)  # fmt: skip
def test_the_gate_compares_like_for_like_figures_on_the_gate_metric(
    tmp_path: Path,
    metric: str,
    new: dict[str, float],
    old: dict[str, float] | None,
    promote: bool,
    reason: str,
) -> None:
    """The gate reads the figures of both models on this run's test split (evaluation.json),
    never the champion's own recorded figure (0.99 / 0.98 here, which would hold every model)."""
    out, metrics, confusion = gate(tmp_path, metric, new, old)
    assert out.promote is promote and reason in out.reason, out.reason
    assert out.score == new[metric] and out.champion_score == (old[metric] if old else -1.0)
    assert (
        metrics.metadata["test_accuracy"] == new["accuracy"]
        and metrics.metadata["test_macro_f1"] == new["macro_f1"]
    )
    assert metrics.metadata["epochs_completed"] == 3
    if old:
        assert metrics.metadata[f"champion_test_{metric}"] == old[metric]
        assert (
            f"champion projects/p/locations/l/models/7@3: accuracy {old['accuracy']:.4f}" in out.description
        )
    assert out.description.startswith(
        ("Promoted" if promote else "Held") + f" on {metric} over this run's test split (20 images"
    )
    assert out.reason in out.description
    matrix = confusion.metadata["confusionMatrix"]  # the challenger's, on this run's test split
    assert [c["displayName"] for c in matrix["annotationSpecs"]] == ["a", "b"]
    assert [r["row"] for r in matrix["rows"]] == [[10, 0], [2, 8]]


def test_the_gate_refuses_a_champion_the_evaluation_job_left_out(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"evaluation\.json has no figures for it"):
        gate(tmp_path, "accuracy", {"accuracy": 0.9, "macro_f1": 0.9}, None, champion_class_names=["a", "b"])


@pytest.mark.parametrize(
    "classes", [("healthy",), ("b", "a"), ("a", "b", "c")], ids=["one-class", "reordered", "more"]
)
def test_the_gate_refuses_a_model_of_another_task(tmp_path: Path, classes: tuple[str, ...]) -> None:
    """Belt and braces (check-same-task refused the run before training): a one-class model
    scoring 1.0 never replaces the champion of another task, whatever its accuracy."""
    write_model(tmp_path / "model", 1.0, class_names=classes)
    out, _, _ = gate(
        tmp_path,
        "accuracy",
        {"accuracy": 1.0, "macro_f1": 1.0},
        {"accuracy": 0.9, "macro_f1": 0.9},
        min_score=0.5,
    )
    assert out.promote is False and out.score == 1.0
    assert out.reason.startswith("not comparable with the champion: ")
    assert str(list(classes)) in out.reason and "['a', 'b']" in out.reason


@pytest.mark.parametrize(
    ("champion_uri", "expected"),
    [("", ["--data_dir=/d", "--model_dir=/m"]), ("gs://b/v3/model", ["--data_dir=/d", "--model_dir=/m", "--champion_dir=gs://b/v3/model"])],
)  # fmt: skip
def test_evaluation_args_add_the_champion_only_when_there_is_one(
    champion_uri: str, expected: list[str]
) -> None:
    args = evaluation.evaluation_args.python_func(
        dataset=dsl.Dataset(uri="/d"), model=dsl.Model(uri="/m"), champion_uri=champion_uri
    )
    assert args == expected


def locked() -> dict[str, str]:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    return {p["name"]: p["version"] for p in lock["package"]}


def test_component_pins_follow_uv_lock() -> None:
    versions = locked()
    assert [pin.split("==")[0] for pin in runtime.PINNED] == ["google-cloud-pipeline-components"]
    for pin in runtime.PINNED:
        name, version = pin.split("==")
        assert versions[name] == version, f"{pin} differs from uv.lock's {versions[name]}"


def test_model_flags_are_the_pipeline_parameters_trainer_args_takes() -> None:
    """One list of the model flags (the pipeline hands them, the option rules check them)."""
    import inspect

    from pipeline import PARAMETERS

    taken = set(inspect.signature(training.trainer_args.python_func).parameters)
    assert taken - {"dataset", "hyperparameters", "leave_out", "search_space"} == set(training.MODEL_FLAGS)
    assert set(training.MODEL_FLAGS) <= {p.name for p in PARAMETERS}
