"""Step 5, hyperparameter tuning (optional): a Vertex HyperparameterTuningJob over the trainer,
then our own best-trial step (GCPC 2.22 has none: docs/facts.md, fact 9).

The search space is the pipeline parameter `search_space` (aiplatform_v1 `StudySpec.ParameterSpec`s
as JSON: docs/options.md#the-search-space-search_space), checked by `pipeline.options.tuning`; the
metric (`study_metrics`) is fixed (docs/contracts.md#3-tuning-parameter-ids-are-trainer-flags).
"""

import functools
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from kfp import dsl

from components import stepimage
from components.plan import HYPERPARAMETER_FUNCS, apply_hyperparameters, tunable

METRIC_ID = "val_accuracy"
ALGORITHMS = ("ALGORITHM_UNSPECIFIED", "GRID_SEARCH", "RANDOM_SEARCH")
# GRID_SEARCH: "all parameters must be INTEGER, CATEGORICAL, or DISCRETE" (StudySpec.Algorithm).
GRID_VALUE_SPECS = ("integer_value_spec", "discrete_value_spec", "categorical_value_spec")
# DiscreteValueSpec.values: "in increasing order and at least 1e-10 apart ... not more than 1,000".
DISCRETE_MIN_GAP = 1e-10
DISCRETE_MAX_VALUES = 1000

# The compiled template's space: a log-scale learning rate around the codelab's 1e-4, the head's
# width and dropout, and the batch size per replica.
VERTEX_SEARCH_SPACE: list[dict[str, Any]] = [
    {
        "parameter_id": "learning_rate",
        "double_value_spec": {"min_value": 0.0001, "max_value": 0.01},
        "scale_type": "UNIT_LOG_SCALE",
    },
    {
        "parameter_id": "dense_units",
        "integer_value_spec": {"min_value": "32", "max_value": "1024"},
        "scale_type": "UNIT_LOG_SCALE",
    },
    {
        "parameter_id": "dropout",
        "double_value_spec": {"min_value": 0.0, "max_value": 0.5},
        "scale_type": "UNIT_LINEAR_SCALE",
    },
    {
        "parameter_id": "per_replica_batch_size",
        "discrete_value_spec": {"values": [16.0, 32.0, 64.0]},
        "scale_type": "UNIT_LINEAR_SCALE",
    },
]
# The local target's space: two trials of the `tiny` backbone, whose untuned defaults already reach
# the gate where draws from the Vertex space mostly fell below them; so two dimensions, centred on
# the local defaults (1.5e-3 near 5e-4..5e-3's log-middle).
LOCAL_SEARCH_SPACE: list[dict[str, Any]] = [
    {
        "parameter_id": "learning_rate",
        "double_value_spec": {"min_value": 0.0005, "max_value": 0.005},
        "scale_type": "UNIT_LOG_SCALE",
    },
    {
        "parameter_id": "dropout",
        "double_value_spec": {"min_value": 0.0, "max_value": 0.3},
        "scale_type": "UNIT_LINEAR_SCALE",
    },
]


def study_metrics() -> list[dict[str, Any]]:
    """The study's metric for the Vertex template, written by GCPC's own `serialize_metrics`."""
    from google_cloud_pipeline_components.v1.hyperparameter_tuning_job import serialize_metrics

    return serialize_metrics({METRIC_ID: "maximize"})


# `study_metrics()`'s value, written out for the local target: importing GCPC's tuning module
# imports aiplatform, about 5 s of every local `make run`.
LOCAL_STUDY_METRICS = [{"metric_id": METRIC_ID, "goal": 1}]  # StudySpec.MetricSpec.GoalType.MAXIMIZE


def hyperparameter_tuning_job(
    project: str,
    location: str,
    display_name: str,
    base_output_directory: str,
    worker_pool_specs: list,
    study_spec_metrics: list,
    study_spec_parameters: list,
    max_trial_count: int,
    parallel_trial_count: int,
    max_failed_trial_count: int,
    study_spec_algorithm: str,
    study_spec_measurement_selection_type: str,
    encryption_spec_key_name: str,
    service_account: str,
    network: str,
    timeout: str,
    restart_job_on_worker_restart: bool,
    gcp_resources: dsl.OutputPath(str),
) -> dsl.ContainerSpec:
    """GCPC's `HyperparameterTuningJobRunOp` plus each trial's `trial_job_spec.scheduling`: its
    `timeout` and `restart_job_on_worker_restart`, as the training job has them (aiplatform_v1
    `HyperparameterTuningJob.trial_job_spec`: "The same spec applies to the CustomJobs created in
    all the trials"; `Scheduling.timeout`: "The default is 7 days."; `restart_job_on_worker_restart`
    false by default; https://cloud.google.com/vertex-ai/docs/reference/rest/v1/CustomJobSpec#scheduling),
    which GCPC 2.22's op lacks: its container spec is reused, the fields added to its payload (the
    bool unquoted, as GCPC's custom job op writes it)."""
    gcpc = {k: v for k, v in locals().items() if k not in ("timeout", "restart_job_on_worker_restart")}
    from google_cloud_pipeline_components.v1.hyperparameter_tuning_job import HyperparameterTuningJobRunOp

    spec = HyperparameterTuningJobRunOp.pipeline_func(**gcpc)
    payload = spec.args[spec.args.index("--payload") + 1].items  # a ConcatPlaceholder's
    at = payload.index(', "base_output_directory": {')  # inside "trial_job_spec": {...}
    payload[at:at] = [
        ', "scheduling": {"timeout": "',
        timeout,
        '", "restart_job_on_worker_restart": ',
        restart_job_on_worker_restart,
        "}",
    ]
    return spec


@functools.cache
def tuning_job() -> Any:
    """The `hyperparameter_tuning_job` component, made on first use (it imports GCPC: seconds)."""
    return dsl.container_component(hyperparameter_tuning_job)


def parse_search_space(space: Any) -> list[Any]:
    """Each entry of `space` parsed strictly into `aiplatform_v1.StudySpec.ParameterSpec` (proto
    JSON, either key case; unknown fields and two value specs refused). Raises ValueError naming
    the entry."""
    from google.cloud import aiplatform_v1
    from google.protobuf import json_format

    if not isinstance(space, list | tuple):
        raise ValueError(
            f"must be a list of parameter specs (aiplatform_v1 StudySpec.ParameterSpec), got {type(space).__name__}"
        )
    kind = aiplatform_v1.StudySpec.ParameterSpec
    parsed = []
    for n, entry in enumerate(space, 1):
        if not isinstance(entry, Mapping):
            raise ValueError(f"parameter {n}: must be a mapping (a StudySpec.ParameterSpec), got {entry!r}")
        ident = entry.get("parameter_id", entry.get("parameterId"))
        name = f"parameter {n}" + (f" ({ident})" if ident else "")
        message = kind.pb(kind())
        try:
            json_format.ParseDict(dict(entry), message, ignore_unknown_fields=False)
        except (json_format.ParseError, TypeError, ValueError) as err:
            raise ValueError(f"{name}: {str(err).splitlines()[0]}") from None
        parsed.append(kind.wrap(message))
    return parsed


def value_spec_kind(spec: Any) -> str:
    """Which value spec a parsed ParameterSpec has ('' for none)."""
    return str(type(spec).pb(spec).WhichOneof("parameter_value_spec") or "")


def canonical_search_space(space: Any) -> list[dict[str, Any]]:
    """`space` in the proto JSON form GCPC's op hands Vertex (what `serialize_parameters` makes,
    with enum names): snake_case keys, int64 as strings, the ranges' both ends written out."""
    from google.protobuf import json_format

    out = []
    for spec in parse_search_space(space):
        as_json = json_format.MessageToDict(type(spec).pb(spec), preserving_proto_field_name=True)
        entry = {"parameter_id": spec.parameter_id, **as_json}
        kind = value_spec_kind(spec)
        if kind in ("double_value_spec", "integer_value_spec"):  # both ends (MessageToDict leaves out 0)
            v = getattr(spec, kind)
            cast = float if kind == "double_value_spec" else str
            entry[kind] = {"min_value": cast(v.min_value), "max_value": cast(v.max_value)}
        elif kind:  # the values alone, as a trial is handed them
            entry[kind] = {"values": trial_values(spec)}
        out.append(entry)
    return out


def trial_values(spec: Any) -> list[float | str]:
    """Values a trial of this parameter may be handed, as Vertex hands them (numbers as doubles):
    both ends of a range, plus for a DOUBLE one a fractional value inside it (a flag that takes
    whole numbers must refuse it); every DISCRETE and CATEGORICAL value."""
    kind = value_spec_kind(spec)
    if kind in ("discrete_value_spec", "categorical_value_spec"):
        cast = float if kind == "discrete_value_spec" else str
        return [cast(x) for x in getattr(spec, kind).values]
    if not kind:
        return []
    low, high = float(getattr(spec, kind).min_value), float(getattr(spec, kind).max_value)
    inside = (low + high) / 2
    if inside.is_integer():
        inside = math.nextafter(inside, high)
    return [low, high, inside] if kind == "double_value_spec" else [low, high]


def pick_best_trial(trials: list[dict[str, Any]], metric_id: str, goal: str) -> dict[str, Any]:
    """The best SUCCEEDED trial (aiplatform_v1 Trial JSON, either key case) by its final
    `metric_id`, as {"trial_id", "value", "parameters"}; ties go to the earlier trial. Raises
    RuntimeError listing every trial's state when none succeeded with the metric."""

    def get(d: dict[str, Any], camel: str, snake: str) -> Any:
        return d.get(camel, d.get(snake))

    if goal not in ("MAXIMIZE", "MINIMIZE"):
        raise ValueError(f"goal must be MAXIMIZE or MINIMIZE, got {goal!r}")
    candidates = []
    for trial in trials:
        metrics = (get(trial, "finalMeasurement", "final_measurement") or {}).get("metrics", [])
        values = [m.get("value") for m in metrics if get(m, "metricId", "metric_id") == metric_id]
        if trial.get("state") == "SUCCEEDED" and values and values[0] is not None:
            candidates.append((float(values[0]), trial))
    if not candidates:
        reasons = [get(t, "infeasibleReason", "infeasible_reason") for t in trials]
        states = ", ".join(
            f"{t.get('id')}: {t.get('state')}" + (f" ({why})" if why else "")
            for t, why in zip(trials, reasons, strict=True)
        )
        raise RuntimeError(
            f"no trial succeeded with a final {metric_id} measurement; trials: {states or 'none'}"
        )
    sign = 1.0 if goal == "MAXIMIZE" else -1.0
    value, best = max(candidates, key=lambda c: sign * c[0])  # max() keeps the first of equals
    params = {get(p, "parameterId", "parameter_id"): p.get("value") for p in best.get("parameters", [])}
    return {"trial_id": str(best.get("id")), "value": value, "parameters": params}


def best_trial_outputs(table: list, training_pools: list, metric_id: str, goal: str) -> Any:
    """`best_trial`'s outputs on either target: `table`'s best trial set in the training job's flags."""
    import collections

    best = pick_best_trial(table, metric_id, goal)
    pools, resolved = apply_hyperparameters(training_pools, best["parameters"], tunable())
    print(f"best trial {best['trial_id']} of {len(table)}: {metric_id}={best['value']:.4f} {resolved}")
    Outputs = collections.namedtuple("Outputs", ["worker_pool_specs", "hyperparameters", "trial_id", "value"])
    return Outputs(pools, resolved, best["trial_id"], best["value"])


BEST_TRIAL_FUNCS = [*HYPERPARAMETER_FUNCS, pick_best_trial, best_trial_outputs]


@dsl.component(base_image=stepimage.BASE_IMAGE, install_kfp_package=False, additional_funcs=BEST_TRIAL_FUNCS)
def best_trial(
    project: str,
    location: str,
    gcp_resources: str,
    training_pools: list,
    trials: dsl.Output[dsl.Artifact],
    metric_id: str = "val_accuracy",
    goal: str = "MAXIMIZE",
) -> NamedTuple("Outputs", worker_pool_specs=list, hyperparameters=dict, trial_id=str, value=float):
    """Picks the best trial of the tuning job in `gcp_resources` and writes its parameters into the
    planned training job's flags; `trials` gets the whole trials table (JSON list)."""
    import json
    import re

    from google.cloud import aiplatform_v1

    resources = json.loads(gcp_resources).get("resources", [])
    uris = [r.get("resourceUri", "") for r in resources if r.get("resourceType") == "HyperparameterTuningJob"]
    match = re.search(
        r"(projects/[^/]+/locations/([^/]+)/hyperparameterTuningJobs/[^/?]+)", uris[0] if uris else ""
    )
    if not match:
        raise ValueError(f"gcp_resources names no HyperparameterTuningJob: {gcp_resources[:500]}")
    name, job_location = match.groups()
    client = aiplatform_v1.JobServiceClient(
        client_options={"api_endpoint": f"{job_location or location}-aiplatform.googleapis.com"}
    )
    job = client.get_hyperparameter_tuning_job(name=name)
    table = [json.loads(aiplatform_v1.Trial.to_json(t, use_integers_for_enums=False)) for t in job.trials]
    with open(trials.path, "w") as f:
        json.dump(table, f, indent=1)
    out = best_trial_outputs(table, training_pools, metric_id, goal)
    trials.metadata.update({"count": len(table), "best_trial_id": out.trial_id, metric_id: out.value})
    return out
