"""The typed spec/args/evaluation components, through their Python functions."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from kfp import dsl

from components import evaluation, plan, prepare, stepimage, worker_pools
from tests.model_flags import MODEL_FLAG_VALUES

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


def test_the_defaults_give_one_chief_and_workers_with_gpus() -> None:
    specs = worker_pools.build_worker_pool_specs(
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
        region="us-central1",
    )
    chief, workers = specs
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
    # Workers that copy the chief's GPU machine are GPU workers.
    copying = {"worker_machine_type": "", "worker_accelerator_type": "", "worker_accelerator_count": 0}
    assert (
        pools(worker_count=2, reduction_server_count=1, **copying)[1]["machine_spec"]["accelerator_count"]
        == 1
    )


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
    args = prepare.build_prepare_args(source="synthetic", image_size=64, shards=8, synthetic_per_class=30)
    assert args[:4] == ["--source=synthetic", "--image_size=64", "--shards=8", "--seed=42"]
    assert "--synthetic_per_class=30" in args and args[-1] == "--overwrite"
    assert not any(a.startswith("--output_dir") for a in args)  # AIP_MODEL_DIR is the output
    assert "--synthetic_per_class=60" not in prepare.build_prepare_args(source="tfds:cassava", image_size=300)
    assert not any(a.startswith("--champion_class_names") for a in args)  # no champion: no check
    with pytest.raises(ValueError, match="source must be tfds:NAME, folder:PATH or synthetic"):
        prepare.build_prepare_args(source="cassava", image_size=300)


def test_prepare_args_carry_the_champions_classes_as_json() -> None:
    """A class name may hold commas, quotes or spaces: the flag is a JSON list."""
    names = ["a, b", 'say "hi"', "healthy"]
    args = prepare.build_prepare_args(source="tfds:cassava", image_size=64, champion_class_names=names)
    (flag,) = [a for a in args if a.startswith("--champion_class_names=")]
    assert json.loads(flag.split("=", 1)[1]) == names


def write_dataset(folder: Path) -> None:
    folder.mkdir(parents=True)
    meta = {
        "class_names": ["cbb", "cbsd", "cgm", "cmd", "healthy"],
        "image_size": 64,
        "fingerprint": "sha256:abc",
        "splits": {"train": {"count": 300}, "validation": {"count": 100}, "test": {"count": 100}},
    }
    (folder / "metadata.json").write_text(json.dumps(meta))


def test_the_dataset_record_reads_the_jobs_metadata(tmp_path: Path) -> None:
    write_dataset(tmp_path / "job" / "model")
    record = prepare.dataset_record("gs://b/job/model", str(tmp_path / "job" / "model"))
    assert record["image_size"] == 64 and record["test_examples"] == 100 and record["train_examples"] == 300
    assert record["class_names"] == ["cbb", "cbsd", "cgm", "cmd", "healthy"]
    with pytest.raises(RuntimeError, match=r"left no readable dataset in gs://b/empty/model"):
        prepare.dataset_record("gs://b/empty/model", str(tmp_path / "empty"))


FLAGS: dict[str, Any] = MODEL_FLAG_VALUES


def trainer_args(**overrides: Any) -> tuple[list[str], dict[str, Any]]:
    leave_out = overrides.pop("leave_out", ())
    args, values = plan.build_trainer_args(
        "gs://b/data", 64.0, {**FLAGS, **overrides}, plan.TUNABLE, leave_out=leave_out
    )
    return args, values


def test_trainer_args_leave_out_tuned_flags() -> None:
    plain, values = trainer_args()
    assert plain == [
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
    assert values == {
        "learning_rate": 0.003,
        "per_replica_batch_size": 16,
        "dense_units": 64,
        "dropout": 0.2,
        "epochs": 3,
    }
    trial, _ = trainer_args(leave_out=["learning_rate", "dropout"], fine_tune_fraction=0.5, seed=7)
    assert not any(a.startswith(("--learning_rate", "--dropout")) for a in trial)
    assert "--seed=7" in trial
    assert "--fine_tune_fraction=0.5" in trial


def test_the_best_trial_is_written_into_the_planned_training_flags() -> None:
    """`apply_hyperparameters`: the best trial's values replace the planned ones in every trainer
    pool, whole numbers as whole numbers (a trial's `256.0` reaches the trainer as 256); the
    Reduction Server pool, which has no args, is left alone."""
    args, _ = trainer_args()
    planned = pools(args=args, reduction_server_count=1)
    tuned, values = plan.apply_hyperparameters(
        planned,
        {"learning_rate": 0.0007, "dense_units": 256.0, "per_replica_batch_size": 32},
        plan.TUNABLE,
    )
    for pool in tuned[:2]:
        got = pool["container_spec"]["args"]
        assert "--learning_rate=0.0007" in got and "--dense_units=256" in got
        assert "--per_replica_batch_size=32" in got and "--dropout=0.2" in got
        assert len(got) == len(args)
    assert tuned[2] == planned[2]
    assert "--dense_units=64" in planned[0]["container_spec"]["args"]  # the plan is not changed
    assert values["dense_units"] == 256 and isinstance(values["dense_units"], int)
    assert values["dropout"] == 0.2 and values["epochs"] == 3


def test_best_trial_values_that_are_unknown_fractional_or_not_carried_are_refused() -> None:
    args, _ = trainer_args()
    planned = pools(args=args)
    with pytest.raises(ValueError, match=r"unknown hyperparameter 'momentum'"):
        plan.apply_hyperparameters(planned, {"momentum": 0.9}, plan.TUNABLE)
    with pytest.raises(ValueError, match="dense_units must be a whole number"):
        plan.apply_hyperparameters(planned, {"dense_units": 12.5}, plan.TUNABLE)
    without, _ = trainer_args(leave_out=["dropout"])
    with pytest.raises(ValueError, match=r"carry no \['dropout'\]"):
        plan.apply_hyperparameters(pools(args=without), {"dropout": 0.1}, plan.TUNABLE)


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


def test_the_gate_records_the_model_and_dataset_and_requires_a_saved_model(tmp_path: Path) -> None:
    """The gate makes the training job's folder the Model artifact and the preparation job's the
    Dataset artifact, with their figures, and refuses a folder with no SavedModel."""
    model, dataset = dsl.Model(uri=str(tmp_path / "x")), dsl.Dataset(uri=str(tmp_path / "y"))
    gate(tmp_path, "accuracy", {"accuracy": 0.93, "macro_f1": 0.9}, None, model=model, dataset=dataset)
    assert model.uri == str(tmp_path / "model") and model.metadata["num_workers"] == 2
    assert model.metadata["test_accuracy"] == 0.93 and model.metadata["framework"] == "tensorflow"
    assert dataset.uri == str(tmp_path / "dataset") and dataset.metadata["test_examples"] == 100
    assert dataset.metadata["class_names"] == ["cbb", "cbsd", "cgm", "cmd", "healthy"]
    (tmp_path / "model" / "saved_model.pb").unlink()
    with pytest.raises(RuntimeError, match="published no SavedModel"):
        gate(tmp_path, "accuracy", {"accuracy": 0.93, "macro_f1": 0.9}, None)


def write_evaluation(
    base: Path,
    challenger: dict[str, float],
    champion: dict[str, float] | None,
    comparison: dict[str, Any] | None = None,
) -> str:
    """The evaluation job's output (`<base>/model/evaluation.json`, as trainer.evaluate writes it)."""

    def entry(figures: dict[str, float], recorded: dict[str, Any]) -> dict[str, Any]:
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
        trained_on = "sha256:" + "ef" * 32  # another dataset than this run's (ab...)
        models["champion"] = entry(
            champion, {"accuracy": 0.99, "macro_f1": 0.98, "dataset_fingerprint": trained_on}
        )
    (base / "model").mkdir(parents=True, exist_ok=True)
    document = {
        "split": "test",
        "dataset_fingerprint": "sha256:" + "ab" * 32,
        "models": models,
        "comparison": comparison,
    }
    (base / "model" / "evaluation.json").write_text(json.dumps(document))
    return str(base)


def gate(tmp_path: Path, metric: str, new: dict[str, float], old: dict[str, float] | None, **kw: Any) -> Any:
    if not (tmp_path / "model").exists():
        write_model(tmp_path / "model")
    if not (tmp_path / "dataset").exists():
        write_dataset(tmp_path / "dataset")
    metrics = dsl.Metrics(uri=str(tmp_path / "m"))
    confusion = dsl.ClassificationMetrics(uri=str(tmp_path / "c"))
    out = evaluation.evaluate_model.python_func(
        dataset_uri=str(tmp_path / "dataset"),
        model_uri=str(tmp_path / "model"),
        dataset=kw.get("dataset", dsl.Dataset(uri=str(tmp_path / "d"))),
        model=kw.get("model", dsl.Model(uri=str(tmp_path / "x"))),
        evaluation_dir=write_evaluation(tmp_path / "evaluation", new, old, kw.get("comparison")),
        gate_metric=metric,
        min_score=kw.get("min_score", 0.8),
        gate_rule=kw.get("gate_rule", "not_worse"),
        gate_margin=kw.get("gate_margin", 0.0),
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
            "champion projects/p/locations/l/models/7@3 (trained on other data (sha256:efefefefefef)): "
            f"accuracy {old['accuracy']:.4f}" in out.description
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
    """Belt and braces (the preparation refused a source of another task): a one-class model
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
    assert evaluation.build_evaluation_args("/d", "/m", champion_uri) == expected


def locked() -> dict[str, str]:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    return {p["name"]: p["version"] for p in lock["package"]}


def test_component_pins_follow_uv_lock() -> None:
    locked_gcpc = locked()["google-cloud-pipeline-components"]
    assert locked_gcpc == stepimage.GCPC_VERSION, (
        f"GCPC {stepimage.GCPC_VERSION} differs from uv.lock's {locked_gcpc}"
    )
    assert stepimage.BASE_IMAGE.endswith(f":{stepimage.GCPC_VERSION}")


def test_the_plan_takes_exactly_the_parameters_the_dag_hands_it() -> None:
    """One list of the planning step's parameters (`dag.PLAN_PARAMETERS`: the model flags, the
    hardware's, the preparation's), each a pipeline parameter; the rest of its inputs come from
    the build and find-champion steps."""
    import inspect

    from components import plan
    from pipeline import PARAMETERS, dag

    taken = set(inspect.signature(plan.plan_jobs.python_func).parameters)
    from_steps = {"image_uri", "training_image_uri", "cpu_image_uri", "champion_class_names", "champion_uri"}
    from_steps |= {"region"}
    from_steps |= {"model_root", "pipeline_run"}  # model_root is the Vertex target's alone
    from_steps |= {"dataflow_image_uri"}
    artifacts = {"prepare_job", "tuning_job", "training_job", "evaluation_job"}
    assert taken - from_steps - artifacts == set(dag.PLAN_PARAMETERS)
    assert set(plan.MODEL_FLAGS) <= set(dag.PLAN_PARAMETERS) <= {p.name for p in PARAMETERS}


def test_the_plan_builds_every_job_in_this_runs_folders(tmp_path: Path) -> None:
    """The four jobs from one step: each in its own folder of this run, the dataset's and the
    model's URIs known before their jobs run, the champion's classes handed to the preparation
    and its SavedModel to the evaluation."""
    from components import plan
    from pipeline import dag, parameters_for

    values = {q.name: q.default_for("vertex") for q in parameters_for("vertex")}
    jobs = {
        name: dsl.Artifact(uri=f"gs://b/root/run/plan-jobs/{name}")
        for name in ("prepare_job", "tuning_job", "training_job", "evaluation_job")
    }
    out = plan.plan_jobs.python_func(
        image_uri="img@sha256:" + "0" * 64,
        training_image_uri="rs@sha256:" + "1" * 64,
        cpu_image_uri="cpu@sha256:" + "2" * 64,
        champion_class_names=["a", "b"],
        champion_uri="gs://b/champion/model",
        model_root="",
        pipeline_run="run-20261125",
        region="us-central1",
        dataflow_image_uri="",
        **{name: values[name] for name in dag.PLAN_PARAMETERS},
        **jobs,
    )
    assert out.dataset_uri == "gs://b/root/run/plan-jobs/prepare_job/model"
    # The model outside the run's folders (which a lifecycle rule may delete): <bucket>/models,
    # in TensorFlow Serving's version folder.
    assert out.model_uri == "gs://b/models/cassava-classifier/run-20261125/1"
    prep = out.prepare_pools[0]["container_spec"]
    assert prep["command"] == prepare.PREPARE_COMMAND and '--champion_class_names=["a", "b"]' in prep["args"]
    train = out.training_pools[0]["container_spec"]
    assert train["image_uri"].startswith("rs@") and f"--data_dir={out.dataset_uri}" in train["args"]
    assert train["args"][-1] == f"--model_dir={out.model_uri}"
    assert not any(a.startswith("--model_dir") for a in out.tuning_pools[0]["container_spec"]["args"])
    assert out.tuning_pools[0]["container_spec"]["image_uri"].startswith("img@")
    assert len(out.tuning_pools) <= 2  # never a Reduction Server pool for the trials
    # The CPU jobs run the cpu image (no CUDA wheels), the GPU jobs the trainer's.
    assert (
        prep["image_uri"]
        == out.evaluation_pools[0]["container_spec"]["image_uri"]
        == "cpu@sha256:" + "2" * 64
    )
    assert out.evaluation_pools[0]["container_spec"]["args"] == [
        f"--data_dir={out.dataset_uri}",
        f"--model_dir={out.model_uri}",
        "--champion_dir=gs://b/champion/model",
    ]
    assert out.measurement_selection_type == "BEST_MEASUREMENT"
    assert set(out.hyperparameters) == set(plan.TUNABLE)
    assert {out.prepare_dir, out.tuning_dir, out.training_dir, out.evaluation_dir} == {
        a.uri for a in jobs.values()
    }


@pytest.mark.parametrize(
    ("root", "folder", "name", "expected"),
    [
        ("", "gs://b/root/123/run-1/plan-jobs/training_job", "cassava", "gs://b/models/cassava/run-1/1"),
        ("gs://kept/models/", "gs://b/root/x", "a b/c", "gs://kept/models/a%20b%2Fc/run-1/1"),
        (
            "",
            "/work/local_runs/r/plan-jobs/training_job",
            "cassava",
            "/work/local_runs/r/plan-jobs/training_job/model/1",
        ),
    ],
)
def test_the_model_is_kept_outside_the_runs_folders_on_vertex(
    root: str, folder: str, name: str, expected: str
) -> None:
    """A display name cannot leave its folder (`registry_folder`), and the local target, whose
    registry copies the model, keeps it in the job's folder; either, in TensorFlow Serving's
    version folder `1`."""
    from components import plan

    assert plan.stable_model_uri(root, folder, name, "run-1") == expected


def paired(labels: list[int], challenger: list[int], champion: list[int]) -> dict[str, Any]:
    """evaluation.json's `comparison`, computed by the trainer's own code on these predictions."""
    from trainer import pairedstats

    return pairedstats.compare(labels, challenger, champion, 2)


# 100 test images; the champion gets 90 right. One image apart, or twenty.
LABELS = [i % 2 for i in range(100)]
CHAMPION = [1 - y if i < 10 else y for i, y in enumerate(LABELS)]
ONE_BETTER = [1 - y if 1 <= i < 10 else y for i, y in enumerate(LABELS)]  # 91 right
MUCH_BETTER = LABELS  # 100 right: the champion's 10 mistakes fixed, none made
ONE_WORSE = [1 - y if i < 11 else y for i, y in enumerate(LABELS)]  # 89 right


@pytest.mark.parametrize(
    ("rule", "challenger", "promote", "said"),
    [
        ("not_worse", ONE_BETTER, True, ">= the champion's 0.9000"),
        ("not_worse", ONE_WORSE, False, "is below the champion's 0.9000"),
        ("significantly_better", ONE_BETTER, False, "not significantly better"),
        ("significantly_better", MUCH_BETTER, True, "exact McNemar p=0.00195, 10 vs 0 images on 100): significantly better"),
        ("non_inferior", ONE_WORSE, True, "within the margin -0.0500"),
        ("non_inferior", [1 - y if i < 20 else y for i, y in enumerate(LABELS)], False, "beyond the margin -0.0500"),
    ],
)  # fmt: skip
def test_the_gate_rule_judges_the_paired_comparison(
    tmp_path: Path, rule: str, challenger: list[int], promote: bool, said: str
) -> None:
    """One image apart on 100 means nothing: `significantly_better` holds it back, `non_inferior`
    lets a slightly worse retrain through within its margin, `not_worse` (the default) compares
    the two figures alone. The reason says which, with the interval and McNemar's p."""
    accuracy = sum(a == y for a, y in zip(challenger, LABELS, strict=True)) / 100
    out, _, _ = gate(
        tmp_path,
        "accuracy",
        {"accuracy": accuracy, "macro_f1": accuracy},
        {"accuracy": 0.9, "macro_f1": 0.9},
        min_score=0.5,
        gate_rule=rule,
        gate_margin=0.05,
        comparison=paired(LABELS, challenger, CHAMPION),
    )
    assert out.promote is promote and said in out.reason, out.reason
    if rule != "not_worse":
        assert f"(gate_rule={rule})" in out.reason and "95% CI" in out.reason
    assert out.comparison["mcnemar"]["b"] + out.comparison["mcnemar"]["c"] >= 1
    assert out.reason in out.description


def test_a_rule_that_needs_the_comparison_refuses_to_decide_without_it(tmp_path: Path) -> None:
    with pytest.raises(
        RuntimeError, match=r"gate_rule=non_inferior needs evaluation\.json's paired comparison"
    ):
        gate(
            tmp_path,
            "accuracy",
            {"accuracy": 0.9, "macro_f1": 0.9},
            {"accuracy": 0.9, "macro_f1": 0.9},
            gate_rule="non_inferior",
        )


def test_the_gate_says_whether_the_champion_was_trained_on_the_same_data(tmp_path: Path) -> None:
    """The dataset fingerprint the champion's training recorded against this run's: the same
    data, other data, or none recorded (an older model)."""
    base = tmp_path / "evaluation" / "model" / "evaluation.json"
    for trained_on, said in (
        ("sha256:" + "ab" * 32, "(trained on this same dataset)"),
        (None, "(trained on data it recorded no fingerprint of)"),
    ):
        out, _, _ = gate(
            tmp_path, "accuracy", {"accuracy": 0.9, "macro_f1": 0.9}, {"accuracy": 0.9, "macro_f1": 0.9}
        )
        document = json.loads(base.read_text())
        document["models"]["champion"]["recorded"]["dataset_fingerprint"] = trained_on
        base.write_text(json.dumps(document))
        out = evaluation.evaluate_model.python_func(
            dataset_uri=str(tmp_path / "dataset"),
            model_uri=str(tmp_path / "model"),
            dataset=dsl.Dataset(uri=str(tmp_path / "d")),
            model=dsl.Model(uri=str(tmp_path / "x")),
            evaluation_dir=str(tmp_path / "evaluation"),
            gate_metric="accuracy",
            min_score=0.5,
            champion_class_names=["a", "b"],
            champion_version="projects/p/locations/l/models/7@3",
            metrics=dsl.Metrics(uri=str(tmp_path / "m")),
            confusion=dsl.ClassificationMetrics(uri=str(tmp_path / "c")),
        )
        assert said in out.description, out.description
