"""The model's registration: its name, the serving image, the model root. The gate's metric, rule,
minimum and margin are choices and bounds on their rows (pipeline.parameters)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from components import registry, servingimage
from pipeline.rules.common import Problem

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
        name = next(
            (
                n
                for n in ("serving_tf_version", "serving_accelerator")
                if text.startswith((n, n.replace("_", " ")))
            ),
            "serving_image",
        )
        problems.append(Problem((name,), text))
    root = v.get("model_root", "")
    if root and not MODEL_ROOT.match(str(root)):
        problems.append(
            Problem(
                ("model_root",),
                f"must be empty (gs://<the pipeline root's bucket>/models) or a gs://<bucket>/<path> folder, "
                f"got {root!r}",
            )
        )
    return problems
