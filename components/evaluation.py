"""Step 6, evaluation and the promotion gate: a like-for-like champion/challenger comparison.

    evaluation job (`python -m trainer.evaluate`, one CPU replica on the trainer image, its flags
        from `build_evaluation_args` in the planning step) -> evaluate_model (the gate)

The champion's recorded figures may come from other data, so the evaluation job runs both models
through their serving signature on *this* run's test split (`evaluation.json`); `evaluate_model`
logs the challenger's metrics (the confusion matrix as `dsl.ClassificationMetrics`, drawn by the
Vertex console) and applies the gate (`gate_decision`; docs/training.md#the-gate-gate_metric-min_score),
whose decision and figures make the version's `description` (Vertex) or `version.json` (local).
"""

from typing import NamedTuple

from kfp import dsl

from components import stepimage
from components.prepare import dataset_record
from components.registry import (
    evaluation_record,
    label_value,
    record_on_version,
    task_mismatch,
)
from components.stepimage import fuse_path


def evaluate_command() -> list:
    return ["python", "-m", "trainer.evaluate"]


GATE_METRICS = ("accuracy", "macro_f1")
"""What the gate may compare: test accuracy, or the macro F1 (the mean per-class F1, which a model
always answering the largest class of imbalanced data keeps low)."""

# The keys of the trainer's metrics.json and evaluation.json `evaluate_model` reads (checked
# against trainer/contract.py: components run without the trainer).
METRICS_READ = (
    "val_accuracy",
    "val_loss",
    "images_per_second",
    "epochs_completed",
    "class_names",
    "test_accuracy",
    "num_workers",
)
EVALUATION_READ = (
    "split",
    "dataset_fingerprint",
    "models",
    "examples",
    "loss",
    "accuracy",
    "macro_f1",
    "per_class",
    "confusion_matrix",
    "recorded",
    "comparison",
)
GATE_RULES = ("not_worse", "significantly_better", "non_inferior")
"""How the gate judges the challenger against the champion on this run's test split
(docs/training.md#noise-the-paired-comparison-and-gate_rule; `paired_verdict`)."""


def paired_verdict(gate_metric: str, rule: str, margin: float, comparison: dict) -> tuple:
    """(passes, what the paired comparison says) for `rule` (GATE_RULES, not `not_worse`) on
    evaluation.json's `comparison`: `significantly_better`, the 95% interval of the difference
    above 0 and, on accuracy, the exact McNemar p < 0.05; `non_inferior`, its low end above
    -`margin`."""
    figure = comparison[gate_metric]
    low, high = (float(x) for x in figure["ci95"])
    difference = float(figure["difference"])
    mcnemar = comparison["mcnemar"]
    said = f"difference {difference:+.4f} (95% CI {low:+.4f} to {high:+.4f}"
    if gate_metric == "accuracy":
        said += f"; exact McNemar p={float(mcnemar['p_value']):.3g}, {mcnemar['b']} vs {mcnemar['c']} images"
    said += f" on {comparison['examples']})"
    if rule == "significantly_better":
        passes = low > 0 and (gate_metric != "accuracy" or float(mcnemar["p_value"]) < 0.05)
        return passes, said + (": significantly better" if passes else ": not significantly better")
    passes = low > -margin
    verdict = "within" if passes else "beyond"
    return passes, said + f": the lower end is {verdict} the margin -{margin:.4f}"


def gate_decision(
    gate_metric: str,
    min_score: float,
    score: float,
    champion_score: float,
    champion_recorded: float,
    other_task: str,
    rule: str = "not_worse",
    margin: float = 0.0,
    comparison: dict | None = None,
) -> tuple:
    """(promote, reason): the challenger passes when it was trained for the champion's task
    (`other_task`: `task_mismatch`'s verdict), `score` is at least `min_score` and, by `rule`, it
    is not worse than `champion_score` on the same split (< 0: no champion, the floor alone).
    `champion_recorded`: the champion's figure on its own split (< 0: unknown)."""
    if gate_metric not in ("accuracy", "macro_f1"):
        raise ValueError(f"gate_metric must be accuracy or macro_f1, got {gate_metric!r}")
    if not 0.0 <= min_score <= 1.0:
        raise ValueError(f"min_score must be from 0 to 1, got {min_score}")
    if rule not in ("not_worse", "significantly_better", "non_inferior"):
        raise ValueError(f"gate_rule must be not_worse, significantly_better or non_inferior, got {rule!r}")
    if not 0.0 <= margin <= 1.0:
        raise ValueError(f"gate_margin must be from 0 to 1, got {margin}")
    name = "test accuracy" if gate_metric == "accuracy" else "test macro F1"
    own = f" (it recorded {champion_recorded:.4f} on its own test split)" if champion_recorded >= 0 else ""
    if other_task:
        return False, f"not comparable with the champion: {other_task}"
    if score < min_score:
        return False, f"{name} {score:.4f} is below min_score {min_score:.4f}"
    if champion_score < 0:
        return True, f"{name} {score:.4f} >= min_score {min_score:.4f}; no champion yet"
    if rule != "not_worse":
        if comparison is None:
            raise RuntimeError(f"gate_rule={rule} needs evaluation.json's paired comparison: it has none")
        passes, said = paired_verdict(gate_metric, rule, margin, comparison)
        versus = f"{name} {score:.4f} against the champion's {champion_score:.4f} on this test split{own}"
        return passes, f"{versus}: {said} (gate_rule={rule})"
    passes = score >= champion_score
    how = ">=" if passes else "is below"
    return passes, f"{name} {score:.4f} {how} the champion's {champion_score:.4f} on this test split{own}"


def build_evaluation_args(data_dir: str, model_dir: str, champion_uri: str) -> list:
    """The `trainer.evaluate` flags: this run's dataset, the new model and the champion's
    SavedModel folder, if any (evaluation.json goes to AIP_MODEL_DIR)."""
    args = [f"--data_dir={data_dir}", f"--model_dir={model_dir}"]
    if champion_uri:
        args.append(f"--champion_dir={champion_uri}")
    return args


@dsl.component(
    base_image=stepimage.BASE_IMAGE,
    install_kfp_package=False,
    additional_funcs=[
        fuse_path,
        task_mismatch,
        paired_verdict,
        gate_decision,
        dataset_record,
        label_value,
        evaluation_record,
        record_on_version,
    ],
)
def evaluate_model(
    dataset_uri: str,
    model_uri: str,
    evaluation_dir: str,
    gate_metric: str,
    min_score: float,
    champion_class_names: list,
    champion_version: str,
    metrics: dsl.Output[dsl.Metrics],
    confusion: dsl.Output[dsl.ClassificationMetrics],
    dataset: dsl.Output[dsl.Dataset],
    model: dsl.Output[dsl.Model],
    gate_rule: str = "not_worse",
    gate_margin: float = 0.0,
    uploaded: dsl.Input[dsl.Artifact] = None,
    location: str = "",
) -> NamedTuple(
    "Outputs",
    promote=bool,
    champion=bool,
    score=float,
    champion_score=float,
    reason=str,
    description=str,
    comparison=dict,
    evaluation_import=str,
):
    """The gate: records this run's Dataset and Model artifacts, logs the new model's metrics and
    returns `gate_decision`'s verdict, both scores on this test split (champion_score -1: none)
    and the version's description. `uploaded` (Vertex: ModelUploadOp's VertexModel) gets them and
    the alias by `record_on_version`; `champion` says whether it holds the alias now. Without it
    (local: the upload step follows, same rule) `champion` is the decision."""
    import collections
    import json
    import os

    dataset.uri = dataset_uri
    dataset.metadata.update(dataset_record(dataset_uri, fuse_path(dataset_uri)))
    folder = fuse_path(model_uri)
    if not os.path.exists(os.path.join(folder, "saved_model.pb")):
        raise RuntimeError(f"the training job published no SavedModel in {model_uri}")
    with open(os.path.join(folder, "metrics.json")) as f:
        m = json.load(f)
    model.uri = model_uri
    model.metadata["framework"] = "tensorflow"
    model.metadata.update(
        {k: m[k] for k in ("test_accuracy", "val_accuracy", "epochs_completed", "num_workers")}
    )
    with open(os.path.join(fuse_path(evaluation_dir.rstrip("/")), "model", "evaluation.json")) as f:
        evaluated = json.load(f)
    models = evaluated["models"]
    new = models["challenger"]
    old = models.get("champion")
    if champion_class_names and old is None:
        raise RuntimeError(
            f"champion {champion_version} exists but evaluation.json has no figures for it: "
            "the evaluation job did not evaluate it"
        )
    split, comparison = evaluated["split"], evaluated.get("comparison")
    logged = {f"{split}_{key}": new.get(key) for key in ("accuracy", "loss", "macro_f1")}
    logged.update({key: m.get(key) for key in ("val_accuracy", "val_loss", "images_per_second")})
    for key, value in logged.items():
        if value is not None:
            metrics.log_metric(key, float(value))
    metrics.log_metric("epochs_completed", int(m["epochs_completed"]))
    for name, c in (new.get("per_class") or {}).items():
        print(
            f"  {name:<24} precision {c['precision']:.3f}  recall {c['recall']:.3f}  "
            f"f1 {c['f1']:.3f}  support {c['support']}"
        )
    cm = new["confusion_matrix"]
    confusion.log_confusion_matrix(list(cm["labels"]), [[int(c) for c in row] for row in cm["matrix"]])

    score = float(new[gate_metric])
    champion_score = float(old[gate_metric]) if old is not None else -1.0
    recorded = old["recorded"].get(gate_metric) if old is not None else None
    if old is not None:
        metrics.log_metric(f"champion_{split}_{gate_metric}", champion_score)
    promote, reason = gate_decision(
        gate_metric,
        min_score,
        score,
        champion_score,
        -1.0 if recorded is None else float(recorded),
        task_mismatch(m["class_names"], champion_class_names),
        gate_rule,
        gate_margin,
        comparison,
    )
    print(("PROMOTE: " if promote else "HOLD: ") + reason)
    figures = f"accuracy {float(new['accuracy']):.4f}, macro F1 {float(new['macro_f1']):.4f}"
    description = (
        f"{'Promoted' if promote else 'Held'} on {gate_metric} over this run's {split} split "
        f"({new['examples']} images, dataset {evaluated['dataset_fingerprint'][:19]}): {figures}"
    )
    if old is not None:
        # Whether the champion was trained on this very dataset: the fingerprint its training
        # recorded (its metrics.json, through evaluation.json's `recorded`) against this run's.
        trained_on = old["recorded"].get("dataset_fingerprint")
        if trained_on == evaluated["dataset_fingerprint"]:
            data = "trained on this same dataset"
        elif trained_on:
            data = f"trained on other data ({str(trained_on)[:19]})"
        else:
            data = "trained on data it recorded no fingerprint of"
        print(f"the champion was {data}")
        description += (
            f"; champion {champion_version} ({data}): accuracy {float(old['accuracy']):.4f}, macro F1 "
            f"{float(old['macro_f1']):.4f} on the same split"
        )
    description += f". {reason}"
    champion, imported = promote, ""
    if uploaded is not None:
        champion, moved, imported = record_on_version(
            location,
            uploaded.metadata["resourceName"],
            description,
            {
                "gate": "promoted" if promote else "held",
                "dataset": label_value(evaluated["dataset_fingerprint"][7:23]),
            },
            promote,
            champion_version,
            evaluation=evaluation_record(evaluated, description),
        )
        print(moved)
        if promote and not champion:
            reason = moved
    Outputs = collections.namedtuple(
        "Outputs", "promote champion score champion_score reason description comparison evaluation_import"
    )
    return Outputs(promote, champion, score, champion_score, reason, description, comparison or {}, imported)
