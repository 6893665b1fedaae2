"""Evaluates models side by side on one prepared dataset's split, the way they are served:
`python -m trainer.evaluate --data_dir D --model_dir CHALLENGER [--champion_dir CHAMPION]`.

The gate's like-for-like comparison (docs/training.md, "The gate"): both models run on this run's
test split through `serving_default` on the stored images encoded as PNG (lossless), so each
decodes and resizes as served. Writes `evaluation.json` (trainer.contract.EVALUATION_KEYS) into
`--output_dir` (default: $AIP_MODEL_DIR).

Before any image is read, both models must load with the signature and have been trained on the
dataset's class names in the same order. Exit status 2 on a bad flag, 1 when a model or the
data cannot be used, with the reason.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainer.contract import EVALUATION_FILE, METRICS_FILE
from trainer.serve import MAX_INSTANCES


class EvaluationError(Exception):
    """A model or the dataset cannot be evaluated; the message says which and why."""


def summarize(labels: Sequence[int], probabilities: Any, class_names: Sequence[str]) -> dict[str, Any]:
    """Loss, accuracy, confusion matrix, per-class figures and macro F1 of `probabilities`
    ([N, K]) against integer `labels` ([N])."""
    import numpy as np

    from trainer import metrics as metrics_lib

    p, y = np.asarray(probabilities, dtype=np.float64), np.asarray(labels, dtype=np.int64)
    k = len(class_names)
    if p.ndim != 2 or p.shape != (len(y), k):
        raise EvaluationError(f"expected probabilities of shape ({len(y)}, {k}), got {p.shape}")
    predicted = p.argmax(-1)
    matrix = np.zeros((k, k), dtype=int)
    np.add.at(matrix, (y, predicted), 1)
    per_class = metrics_lib.per_class(matrix.tolist(), class_names)
    return {
        "examples": len(y),
        "loss": float(-np.mean(np.log(np.clip(p[np.arange(len(y)), y], 1e-7, 1.0)))) if len(y) else None,
        "accuracy": float(np.mean(predicted == y)) if len(y) else None,
        "macro_f1": metrics_lib.macro_f1(per_class),
        "per_class": per_class,
        "confusion_matrix": {
            "labels": list(class_names),
            "rows": "true class",
            "columns": "predicted class",
            "matrix": matrix.tolist(),
        },
    }


def predict_split(
    predict: Callable[[Any], Any],
    data_dir: str,
    meta: Any,
    split: str,
    *,
    log: Callable[[str], None] | None = None,
    what: str = "",
) -> tuple[Any, Any]:
    """(labels [N], probabilities [N, K]) of `predict` (uint8 image batch -> probabilities) over a
    whole split, in the stored order; `log` is told how far `what` is, about every quarter of the split."""
    import numpy as np

    from trainer import data, datasetinfo
    from trainer._tf import tf

    ds = data.make_dataset(data_dir, meta, split, batch_size=MAX_INSTANCES, training=False)
    labels, probs, done, mark = [], [], 0, 0
    total = meta.splits[split].count
    try:
        for x, y in ds:
            probs.append(np.asarray(predict(x)))
            labels.append(y.numpy())
            done += len(labels[-1])
            if log is not None and (done >= mark or done == total):
                log(f"evaluating {what}: {done}/{total} {split} images")
                mark = done + max(1, total // 4)
    except tf.errors.DataLossError as err:  # a corrupt record: name the split's shards
        raise datasetinfo.explain_read_error(err, data_dir, meta, split) from None
    if not labels:
        return np.zeros((0,), dtype=np.int64), np.zeros((0, meta.num_classes))
    return np.concatenate(labels), np.concatenate(probs)


def served_predictor(model_dir: str) -> Callable[[Any], Any]:
    """uint8 image batch -> probabilities, through the SavedModel's `serving_default` on PNG bytes
    (as Vertex serves it: `trainer.serve`). Raises EvaluationError when it does not load."""
    from trainer import serve
    from trainer._tf import tf

    try:
        served = serve.load(model_dir)
    except serve.ServingError as err:
        raise EvaluationError(str(err)) from None

    @tf.function
    def encode(batch: tf.Tensor) -> tf.Tensor:
        return tf.map_fn(tf.io.encode_png, batch, fn_output_signature=tf.string)

    def predict(batch: Any) -> Any:
        out = served.signature(**{serve.SERVING_INPUT: encode(batch)})
        return out["probabilities"].numpy()

    return predict


def evaluate(
    data_dir: str, models: Mapping[str, str], *, split: str = "test", log: Callable[[str], None] = print
) -> dict[str, Any]:
    """evaluation.json's content for `models` ({role: SavedModel folder}) on `split`."""
    import numpy as np

    from trainer import datasetinfo, pairedstats, storage
    from trainer._tf import tf

    meta = datasetinfo.load_metadata(data_dir)
    if meta.splits[split].count == 0:
        raise EvaluationError(f"{data_dir}: the {split} split has no images")
    recorded, predictors = {}, {}
    for role, model_dir in models.items():
        path = storage.join(model_dir, METRICS_FILE)  # the metrics.json trainer.task published
        if not tf.io.gfile.exists(storage.resolve(path)):
            raise EvaluationError(f"{model_dir} has no {METRICS_FILE}: it was not published by trainer.task")
        recorded[role] = storage.read_json(path)
        names = [str(c) for c in recorded[role].get("class_names", [])]
        if names != list(meta.class_names):
            raise EvaluationError(
                f"the {role} in {model_dir} was trained on the classes {names}, this dataset has "
                f"{list(meta.class_names)}: it cannot be evaluated on it (the same class names in the "
                "same order are needed)"
            )
        predictors[role] = served_predictor(model_dir)
    out: dict[str, Any] = {
        "split": split,
        "data_dir": data_dir,
        "dataset_fingerprint": meta.fingerprint,
        "class_names": list(meta.class_names),
        "method": "serving_default on PNG-encoded stored images (each model decodes and resizes as served)",
        "models": {},
        "comparison": None,
    }
    predicted: dict[str, Any] = {}
    for role, model_dir in models.items():
        started = time.perf_counter()
        log(f"evaluating {role} {model_dir}: {meta.splits[split].count} {split} images, as served")
        labels, probs = predict_split(predictors[role], data_dir, meta, split, log=log, what=role)
        figures = summarize(labels, probs, meta.class_names)
        if predicted and not np.array_equal(labels, predicted["labels"]):
            raise EvaluationError(
                f"the {split} split was read in another order for the {role}: the models cannot be paired"
            )
        predicted["labels"], predicted[role] = labels, np.asarray(probs).argmax(-1)
        figures["model_dir"] = model_dir
        figures["seconds"] = time.perf_counter() - started
        own = recorded[role]
        figures["recorded"] = {
            "accuracy": own.get("test_accuracy"),
            "macro_f1": own.get("macro_f1"),
            "dataset_fingerprint": own.get("dataset_fingerprint"),
        }
        out["models"][role] = figures
        log(
            f"evaluated {role}: accuracy {figures['accuracy']:.4f}, macro F1 {figures['macro_f1']:.4f} "
            f"on this {split} split (recorded on its own: accuracy {_fmt(own.get('test_accuracy'))}, "
            f"macro F1 {_fmt(own.get('macro_f1'))})"
        )
    if "champion" in predicted:
        out["comparison"] = pairedstats.compare(
            predicted["labels"], predicted["challenger"], predicted["champion"], meta.num_classes
        )
        log(f"compared: {pairedstats.describe(out['comparison'])}")
    return out


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.4f}"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("--data_dir", required=True, help="The prepared dataset (trainer.prepare output).")
    p.add_argument("--model_dir", required=True, help="The challenger's SavedModel folder.")
    p.add_argument("--champion_dir", default="", help="The champion's SavedModel folder ('': none).")
    p.add_argument("--split", default="test", choices=("test", "validation"), help="The split evaluated.")
    p.add_argument(
        "--output_dir",
        default=os.environ.get("AIP_MODEL_DIR", ""),
        help="Where evaluation.json is written (default: $AIP_MODEL_DIR).",
    )
    args = p.parse_args(argv)
    if not args.output_dir:
        p.error("--output_dir is required when $AIP_MODEL_DIR is not set")
    models = {"challenger": args.model_dir}
    if args.champion_dir:
        models["champion"] = args.champion_dir
    from trainer import storage
    from trainer._tf import tf

    out = storage.resolve(args.output_dir)
    if not storage.is_remote(out) and os.path.lexists(out) and not os.path.isdir(out):
        p.error(f"--output_dir {args.output_dir} is an existing file, not a folder")  # before any work
    try:
        result = evaluate(args.data_dir, models, split=args.split, log=_log)
        path = storage.join(args.output_dir, EVALUATION_FILE)
        storage.write_json(path, result)
    except (EvaluationError, ValueError, OSError, tf.errors.OpError) as err:  # DataError: a ValueError
        print(f"python -m trainer.evaluate: error: {err}", file=sys.stderr)  # noqa: T201
        return 1
    _log(f"evaluation: wrote {path}")
    return 0


def _log(message: str) -> None:
    print(message, flush=True)  # noqa: T201 - the job's log


if __name__ == "__main__":
    sys.exit(main())
