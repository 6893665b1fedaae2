"""The tuning job's parameters and rules, its declared search space included: `RULES` and
`SEARCH_SPACE_RULES` say each rule and its source (docs/options.md#the-search-space-search_space)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from components import plan, tuning
from pipeline.options.common import Parameter as _p
from pipeline.options.common import Problem, whole
from pipeline.options.trainer_flags import trainer_flag_problems

# What a StudySpec.ParameterSpec holds (the search_space's help and errors say it).
_VALUE_SPECS = (
    "one of double_value_spec or integer_value_spec {min_value, max_value}, discrete_value_spec or "
    "categorical_value_spec {values}"
)
_SCALES = "UNIT_LINEAR_SCALE, UNIT_LOG_SCALE or UNIT_REVERSE_LOG_SCALE"
_ALLOWED = ", ".join(plan.TUNABLE)

# The trial counts' bounds: aiplatform_v1 `HyperparameterTuningJob` (types/hyperparameter_tuning_job.py):
# max_trial_count is "Required" (proto3 sends no 0), and max_failed_trial_count 0 means "Vertex AI
# decides how many Trials must fail"; parallel_trial_count's upper bound is a rule below.
PARAMETERS: tuple[_p, ...] = (
    _p("tune", bool, False, "Run a hyperparameter tuning job first; train with the best trial."),
    _p("max_trial_count", int, 8, "Trials of the tuning job.", 2, bounds=(1, math.inf)),
    _p("parallel_trial_count", int, 2, "Trials run at once.", 1),
    _p(
        "max_failed_trial_count",
        int,
        0,
        "Failed trials that fail the tuning job (0: Vertex decides).",
        bounds=(0, math.inf),
    ),
    _p(
        "search_algorithm",
        str,
        "ALGORITHM_UNSPECIFIED",
        "ALGORITHM_UNSPECIFIED (Bayesian), GRID_SEARCH (every parameter INTEGER, DISCRETE or "
        "CATEGORICAL) or RANDOM_SEARCH.",
        choices=tuning.ALGORITHMS,
    ),
    _p(
        "search_space",
        list,
        tuning.VERTEX_SEARCH_SPACE,
        "The tuning job's parameters: a list of Vertex StudySpec.ParameterSpec (parameter_id; "
        f"{_VALUE_SPECS}; scale_type {_SCALES}), snake_case or camelCase; ids among {_ALLOWED}. make "
        "run takes inline JSON, @FILE or a .json/.yaml/.yml file. Default on Vertex: learning_rate "
        "1e-4..1e-2 log, dense_units 32..1024 log, dropout 0..0.5, per_replica_batch_size 16/32/64; "
        "locally (two short trials): learning_rate 5e-4..5e-3 log and dropout 0..0.3, centred on the "
        "local defaults (docs/options.md).",
        tuning.LOCAL_SEARCH_SPACE,
    ),
)

# This capability's rows of docs/options.md#the-rules (`make docs`): parameters | rule | source.
RULES = """
| `tune`, `search_algorithm` | `ALGORITHM_UNSPECIFIED` (Bayesian), `GRID_SEARCH` or `RANDOM_SEARCH`; `GRID_SEARCH` only when every parameter of the declared `search_space` is INTEGER, CATEGORICAL or DISCRETE (the default spaces have DOUBLE `learning_rate` and `dropout`) | aiplatform_v1 `StudySpec.Algorithm` |
| `parallel_trial_count` | 1 to `max_trial_count` | aiplatform_v1 `HyperparameterTuningJob` |
"""

# docs/options.md#the-search-space-search_space's table (`make docs` writes it): the rule, its source.
SEARCH_SPACE_RULES = """
| a list of at least one spec, each parsing strictly into `StudySpec.ParameterSpec` with one value spec | aiplatform_v1 `types/study.py` |
| no two specs with the same `parameter_id` | "must be unique amongst all ParameterSpecs" (`ParameterSpec.parameter_id`) |
| every id one of the flags above | `components.plan.build_trainer_args` |
| `min_value` < `max_value` | this pipeline (a range of one point tunes nothing) |
| `UNIT_LOG_SCALE` and `UNIT_REVERSE_LOG_SCALE`: `min_value` (or every discrete value) > 0 | "The entire feasible space must be strictly positive" (aiplatform_v1 `ParameterSpec.ScaleType`) |
| discrete `values` increasing, at least 1e-10 apart, at most 1,000 | "in increasing order and at least 1e-10 apart" (aiplatform_v1 `ParameterSpec.DiscreteValueSpec.values`) |
| categorical: no `scale_type`; values distinct | "Leave unset for CATEGORICAL parameters" (`ParameterSpec.scale_type`) |
| no `conditional_parameter_specs` | this pipeline: every tuned flag is declared at the top level |
| every value a trial may get is accepted by the trainer's own parser: both ends of each range, a fractional value inside a DOUBLE range, every listed value, formatted as Vertex formats them | `trainer/config.py`, through `python -m trainer.flagcheck` (`trainer_flag_problems`): `dropout` 0..1.0 is refused because `--dropout` takes [0, 1); `epochs` as a DOUBLE because `--epochs` takes whole numbers |
| `search_algorithm=GRID_SEARCH`: every declared spec INTEGER, DISCRETE or CATEGORICAL | "To use grid search, all parameters must be INTEGER, CATEGORICAL, or DISCRETE." (aiplatform_v1 `StudySpec.Algorithm.GRID_SEARCH`) |
"""


def tuning_problems(v: Mapping[str, Any]) -> list[Problem]:
    problems = []
    most, parallel = v["max_trial_count"], v["parallel_trial_count"]  # most: checked on its row
    if whole(most) and most >= 1 and not (whole(parallel) and 1 <= parallel <= most):
        problems.append(
            Problem(
                ("parallel_trial_count",), f"must be from 1 to max_trial_count ({most}), got {parallel!r}"
            )
        )
    if v["tune"]:
        space_problems, specs = search_space_problems(v)
        problems += space_problems
        continuous = [
            s.parameter_id for s in specs if tuning.value_spec_kind(s) not in tuning.GRID_VALUE_SPECS
        ]
        if v["search_algorithm"] == "GRID_SEARCH" and continuous:
            problems.append(
                Problem(
                    ("search_algorithm", "search_space"),
                    "GRID_SEARCH needs every study parameter INTEGER, CATEGORICAL or DISCRETE "
                    f"(aiplatform_v1 StudySpec.Algorithm); the search_space's {', '.join(continuous)} "
                    "are DOUBLE (double_value_spec). Use ALGORITHM_UNSPECIFIED (Bayesian) or "
                    "RANDOM_SEARCH, or declare them with integer_value_spec or discrete_value_spec",
                )
            )
    return problems


def search_space_problems(v: Mapping[str, Any]) -> tuple[list[Problem], list[Any]]:
    """The declared search space's problems (module docstring), each naming `search_space` and
    the parameter; and its parsed specs (none when it does not parse)."""
    try:
        specs = tuning.parse_search_space(v["search_space"])
    except ValueError as err:
        return [
            Problem(
                ("search_space",),
                f"{str(err).rstrip('.')}. Each parameter is a StudySpec.ParameterSpec: parameter_id, "
                f"{_VALUE_SPECS}, and scale_type ({_SCALES})",
            )
        ], []
    if not specs:
        return [Problem(("search_space",), f"declares no parameter: give at least one of {_ALLOWED}")], []
    problems: list[Problem] = []
    clean = []  # the specs with no problem of their own, whose values go to the trainer's parser
    seen: set[str] = set()
    for n, s in enumerate(specs, 1):
        found = _parameter_spec_problems(n, s, seen)
        problems += [Problem(("search_space",), message) for message in found]
        if not found:
            clean.append(s)
        seen.add(s.parameter_id)
    return problems + _trial_value_problems(v, clean), specs


def _parameter_spec_problems(n: int, s: Any, seen: set[str]) -> list[str]:
    """One parameter spec's own problems (module docstring), each starting with its id."""
    pid, kind = s.parameter_id, tuning.value_spec_kind(s)
    if not pid:
        return [f"parameter {n} has no parameter_id: give one of {_ALLOWED}"]
    out = []
    if pid not in plan.TUNABLE:
        out.append(f"{pid} is not a trainer flag a tuning job may set; allowed: {_ALLOWED}")
    if pid in seen:
        out.append(f"{pid} is declared twice: parameter ids must be unique")
    if not kind:
        return [*out, f"{pid} has no value spec: give {_VALUE_SPECS}"]
    name = f"{pid} ({kind})"
    if s.conditional_parameter_specs:
        out.append(
            f"{name}: conditional_parameter_specs are not supported: declare every flag at the top level"
        )
    scale = type(s).ScaleType
    log = s.scale_type in (scale.UNIT_LOG_SCALE, scale.UNIT_REVERSE_LOG_SCALE)
    scale_name = scale(s.scale_type).name
    if kind in ("double_value_spec", "integer_value_spec"):
        spec = getattr(s, kind)
        low, high = spec.min_value, spec.max_value
        if not low < high:
            out.append(f"{name}: min_value must be below max_value, got {low:g} and {high:g}")
        if log and low <= 0:
            out.append(f"{name}: {scale_name} needs min_value > 0 (the whole range positive), got {low:g}")
    elif kind == "discrete_value_spec":
        values = [float(x) for x in s.discrete_value_spec.values]
        if not values:
            out.append(f"{name}: values is empty: give at least one value")
        elif any(b - a < tuning.DISCRETE_MIN_GAP for a, b in itertools.pairwise(values)):
            out.append(f"{name}: values must be in increasing order and at least 1e-10 apart, got {values}")
        if len(values) > tuning.DISCRETE_MAX_VALUES:
            out.append(f"{name}: at most {tuning.DISCRETE_MAX_VALUES} values, got {len(values)}")
        if log and values and min(values) <= 0:
            out.append(f"{name}: {scale_name} needs every value > 0, got {min(values):g}")
    else:
        values = list(s.categorical_value_spec.values)
        if not values or len(set(values)) != len(values):
            out.append(f"{name}: values must be distinct and at least one, got {values}")
        if s.scale_type:
            out.append(f"{name}: leave scale_type unset for a categorical parameter")
    return out


def _trial_value_problems(v: Mapping[str, Any], specs: list[Any]) -> list[Problem]:
    """The trainer's own parser on every value a trial may be handed (`tuning.trial_values`), as
    Vertex formats them (`--dense_units=32.0`): one `trainer_flag_problems` call per round, each
    round putting one candidate of every parameter into the run's values."""
    if not specs:
        return []
    candidates = {s.parameter_id: tuning.trial_values(s) for s in specs}
    kinds = {s.parameter_id: tuning.value_spec_kind(s) for s in specs}
    found: dict[tuple[str, str], str] = {}
    for k in range(max(len(c) for c in candidates.values())):
        trial = {pid: c[min(k, len(c) - 1)] for pid, c in candidates.items()}
        for p in trainer_flag_problems({**v, **trial}):
            for pid in (n for n in p.parameters if n in trial):
                found.setdefault((pid, str(trial[pid])), p.message)
    fractional = (
        " (a double_value_spec hands trials fractional values: use integer_value_spec or discrete_value_spec)"
    )
    return [
        Problem(
            ("search_space",),
            f"{pid} ({kinds[pid]}): a trial may get --{pid}={value}, which the trainer refuses: {message}"
            + (fractional if kinds[pid] == "double_value_spec" and "whole number" in message else ""),
        )
        for (pid, value), message in found.items()
    ]
