"""The gate's and the registry's parameters and rules: the model's name, the serving image, the
model root. The gate's metric, rule, minimum and margin are choices and bounds on their rows."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from components import evaluation, registry, servingimage
from pipeline.options.common import Parameter as _p
from pipeline.options.common import Problem, dot_folders

PARAMETERS: tuple[_p, ...] = (
    _p(
        "model_root",
        str,
        "",
        "gs:// folder the registered models are kept in, outside the runs' folders (each run's model in "
        "<model_root>/<model>/<run>/; '': gs://<the pipeline root's bucket>/models).",
        targets=("vertex",),
    ),
    _p(
        "gate_metric",
        str,
        "accuracy",
        "What the gate compares on this run's test split: accuracy, or macro_f1 (the mean per-class "
        "F1, which an imbalanced test split cannot flatter).",
        choices=evaluation.GATE_METRICS,
    ),
    _p(
        "min_score",
        float,
        0.5,
        "Lowest gate_metric on this run's test split a model needs to become the champion.",
        0.9,
        bounds=(0, 1),
    ),
    _p(
        "gate_rule",
        str,
        "not_worse",
        "How the new model must compare with the champion on this run's test split: not_worse "
        "(at least its gate_metric), significantly_better (the paired 95% interval above 0, and "
        "McNemar p < 0.05 on accuracy) or non_inferior (the interval's lower end above -gate_margin).",
        choices=evaluation.GATE_RULES,
    ),
    _p(
        "gate_margin",
        float,
        0.01,
        "The margin of gate_rule=non_inferior, in gate_metric units (0 to 1).",
        bounds=(0, 1),
    ),
    _p(
        "model_display_name", str, "cassava-classifier", "The registry model that gets a new version per run."
    ),
    _p(
        "serving_image",
        str,
        "auto",
        "auto (Vertex's prebuilt TensorFlow image of serving_tf_version while it is available for "
        "more than 30 more days on the run's date, else the custom image; docs/serving.md), prebuilt, "
        "custom (TensorFlow Serving, built from Dockerfile.serving beside the trainer's image) "
        "or an image URI.",
    ),
    _p(
        "serving_tf_version",
        str,
        servingimage.DEFAULT_SERVING_TF_VERSION,
        f"TF version of the prebuilt serving image: {', '.join(servingimage.PREBUILT_TF_SERVING_VERSIONS)}.",
    ),
    _p(
        "serving_accelerator",
        str,
        "cpu",
        "cpu or gpu: which variant of the prebuilt or the custom serving image.",
    ),
)

# This capability's rows of docs/options.md#the-rules (`make docs`): parameters | rule | source.
RULES = """
| `model_display_name`, `serving_image`, `serving_tf_version`, `serving_accelerator` | Vertex's display-name rule; a serving image that exists (docs/guarantees.md#the-local-target-is-as-strict-as-vertex) | `components/registry.py`, `components/servingimage.py` |
| `model_root` (Vertex) | `''` (`gs://<the pipeline root's bucket>/models`) or a `gs://<bucket>/<path>` folder, no empty, `.` or `..` folder in its path (the /gcs/ mount would read another place) | docs/training.md, "What may be deleted" |
"""


# A Cloud Storage folder (bucket names: 3 to 63 characters of lowercase letters, digits, - _ .).
MODEL_ROOT = re.compile(r"^gs://[a-z0-9][a-z0-9._-]{1,61}[a-z0-9](/[^\s#?*\[\]]*)?$")


def registry_problems(v: Mapping[str, Any], region: str, warnings: list[str]) -> list[Problem]:
    problems = []
    try:
        registry.check_model_display_name(v["model_display_name"])
    except ValueError as err:
        problems.append(Problem(("model_display_name",), str(err).removeprefix("model_display_name ")))
    try:
        # As the upload step will judge it today: a prebuilt image past its end of availability
        # is refused, one within 90 days of it warned about (make run and make schedule).
        warnings += servingimage.check_serving_parameters(
            str(v["serving_image"]), str(v["serving_tf_version"]), str(v["serving_accelerator"]), region
        )
    except ValueError as err:
        text = str(err)
        name = "serving_image"
        for known in ("serving_tf_version", "serving_accelerator"):  # the message names its parameter
            if text.startswith((known, known.replace("_", " "))):
                name = known
        problems.append(Problem((name,), text))
    root = str(v.get("model_root", ""))
    if root and (dot_folders(root) or not MODEL_ROOT.match(root)):
        allowed = (
            "must be empty (gs://<the pipeline root's bucket>/models) or a gs://<bucket>/<path> folder "
            "with no empty, . or .. folder in its path"
        )
        problems.append(Problem(("model_root",), f"{allowed}, got {root!r}"))
    return problems
