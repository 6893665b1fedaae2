"""Every pipeline parameter and its rules, one module per capability: each module's `PARAMETERS`
(its rows: name, type, compiled (Vertex) default, local default, targets, help, and the rule on
the value alone, `choices` or `bounds`) and its rules between parameters, for both targets.
`PARAMETERS` here is all of them: the compiled spec's parameters (`pipeline.dag`), the flags of
`make run` and `make schedule` (`launch.flags`) and the doc tables come from it.

`check(values, target, region="")` applies them all before any request or local work (`launch.cli`,
`launch.submit`), reports every bad parameter at once (`OptionsError`) and returns warnings. The
steps on Vertex apply the same rules where they can (`worker_pools` calls `hardware.validate_machine`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pipeline.options import (
    data,
    gate,
    jobs,
    local,
    notification,
    persistent_resource,
    run,
    trainer_flags,
    tuning,
)
from pipeline.options.common import REQUIRED, TARGETS, OptionsError, Parameter, Problem, whole

__all__ = [
    "PARAMETERS",
    "REQUIRED",
    "TARGETS",
    "OptionsError",
    "check",
    "parameters_for",
]

PARAMETERS: tuple[Parameter, ...] = (
    *run.PARAMETERS,
    *data.PARAMETERS,
    *trainer_flags.PARAMETERS,
    *jobs.PARAMETERS,
    *persistent_resource.PARAMETERS,
    *tuning.PARAMETERS,
    *gate.PARAMETERS,
    *local.PARAMETERS,
    *notification.PARAMETERS,
)

# Every rule that is not on a row, as docs/options.md's table shows it (`make docs`): markdown
# table rows, each capability's beside the code that applies them.
RULES = "".join(m.RULES.lstrip("\n") for m in (jobs, persistent_resource, tuning, data, trainer_flags, gate))


def parameters_for(target: str) -> tuple[Parameter, ...]:
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    return tuple(p for p in PARAMETERS if target in p.targets)


def _number_problems(values: Mapping[str, Any]) -> list[Problem]:
    """NaN or infinity in any number: every rule below compares numbers, and NaN passes them all
    (`nan < 0` and `nan > 1` are both false), so it would reach the trainer and poison training."""
    return [
        Problem((name,), f"must be a finite number, got {value!r}")
        for name, value in values.items()
        if isinstance(value, float) and not math.isfinite(value)
    ]


def _row_problems(values: Mapping[str, Any]) -> list[Problem]:
    """The rules a parameter's own row holds: `choices` and `bounds`."""
    problems = []
    for p in PARAMETERS:
        if p.name not in values:
            continue
        value = values[p.name]
        if p.choices and value not in p.choices:
            close = next((f"; did you mean {c}?" for c in p.choices if c.lower() == str(value).lower()), "")
            problems.append(
                Problem((p.name,), f"must be one of {', '.join(p.choices)}, got {value!r}{close}")
            )
        number = whole(value) or (p.type is not int and isinstance(value, float))
        if p.bounds is not None and not (number and p.bounds[0] <= value <= p.bounds[1]):
            low, high = p.bounds
            allowed = f"from {low:g} to {high:g}" if math.isfinite(high) else f"{low:g} or more"
            kind = "a whole number" if p.type is int else "a number"
            problems.append(Problem((p.name,), f"must be {kind} {allowed}, got {value!r}"))
    return problems


def check(values: Mapping[str, Any], target: str, region: str = "") -> list[str]:
    """Applies every rule to a run's parameter values (the target's defaults with the user's
    values over them); `region` is the Vertex region. Raises OptionsError; returns warnings."""
    parameters_for(target)  # an unknown target: ValueError
    warnings: list[str] = []
    problems = _number_problems(values)  # before rules that would compare them
    if not problems:
        problems = _parameter_problems(values, target, region, warnings)
    elif target == "vertex":
        raise OptionsError(problems)
    if target == "local":
        problems += local.local_problems(values)
    if problems:
        raise OptionsError(problems)
    if values["tune"] and (values["scheduling_strategy"] != "STANDARD" or values["tensorboard"]):
        # GCPC 2.22's HyperparameterTuningJobRunOp has no scheduling, timeout, labels or
        # TensorBoard inputs (v1/hyperparameter_tuning_job/component.py); the pipeline's
        # `components.tuning.hyperparameter_tuning_job` adds the timeout alone.
        warnings.append(
            "tune=true: the tuning job's trials run with standard (on-demand) scheduling and without "
            "the TensorBoard: GCPC's HyperparameterTuningJobRunOp takes neither; scheduling_strategy "
            f"{values['scheduling_strategy']} and the TensorBoard apply to the final training job only"
        )
    return warnings


def _parameter_problems(
    values: Mapping[str, Any], target: str, region: str, warnings: list[str]
) -> list[Problem]:
    """The rules of both targets (every number finite already)."""
    problems = _row_problems(values)
    problems += jobs.hardware_problems(values, region, warnings)
    problems += jobs.job_settings_problems(values, region)
    problems += persistent_resource.persistent_resource_problems(values, warnings)
    if values["scheduling_strategy"] == "FLEX_START":
        problems += jobs.flex_start_problems(values)
    problems += tuning.tuning_problems(values)
    problems += gate.registry_problems(values, region, warnings)
    problems += data.data_problems(values, target)
    if target == "vertex":
        problems += data.dataflow_problems(values, region, warnings)
    problems += trainer_flags.trainer_flag_problems(values)
    if not any("dataset_source" in p.parameters for p in problems):
        problems += trainer_flags.source_problems(values)
    return problems
