"""Step 5, hyperparameter tuning (optional): a Vertex HyperparameterTuningJob over the trainer,
then our own best-trial step (GCPC 2.22 has none: docs/facts.md, fact 9).

The study (`study_parameters`, `study_metrics`) is fixed here and serialized with GCPC's own
`serialize_parameters`/`serialize_metrics`; trial counts and the search algorithm are pipeline
parameters. Each trial receives `--<parameter_id>=<value>` flags and reports `val_accuracy`
through cloudml-hypertune at the end of every epoch.

`pick_best_trial` works on trials in the `aiplatform_v1.Trial` JSON form; the Vertex form
(`best_trial`) reads them from the tuning job, the local form from the local tuner's trials
table (`local.tuner`, read by `local.steps.local_best_trial`), so both pick by the same rule.
"""

from typing import Any, NamedTuple

from kfp import dsl

from components import runtime

METRIC_ID = "val_accuracy"
ALGORITHMS = ("ALGORITHM_UNSPECIFIED", "GRID_SEARCH", "RANDOM_SEARCH")


def study_parameters() -> list[dict[str, Any]]:
    """The search space: learning rate on a log scale, head width, dropout, batch size."""
    from google.cloud.aiplatform import hyperparameter_tuning as hpt
    from google_cloud_pipeline_components.v1.hyperparameter_tuning_job import serialize_parameters

    return serialize_parameters(
        {
            "learning_rate": hpt.DoubleParameterSpec(min=1e-4, max=1e-2, scale="log"),
            "dense_units": hpt.IntegerParameterSpec(min=32, max=1024, scale="log"),
            "dropout": hpt.DoubleParameterSpec(min=0.0, max=0.5, scale="linear"),
            "per_replica_batch_size": hpt.DiscreteParameterSpec(values=[16, 32, 64], scale="linear"),
        }
    )


def study_metrics() -> list[dict[str, Any]]:
    from google_cloud_pipeline_components.v1.hyperparameter_tuning_job import serialize_metrics

    return serialize_metrics({METRIC_ID: "maximize"})


def pick_best_trial(trials: list[dict[str, Any]], metric_id: str, goal: str) -> dict[str, Any]:
    """The best SUCCEEDED trial by its final measurement of `metric_id` (goal MAXIMIZE or
    MINIMIZE), as {"trial_id", "value", "parameters"}; ties go to the earlier trial.

    Trials are dicts in the aiplatform_v1 Trial JSON form (camelCase or snake_case keys).
    Raises RuntimeError listing every trial's state when none succeeded with the metric."""

    def get(d: dict[str, Any], camel: str, snake: str, default: Any = None) -> Any:
        return d.get(camel, d.get(snake, default))

    if goal not in ("MAXIMIZE", "MINIMIZE"):
        raise ValueError(f"goal must be MAXIMIZE or MINIMIZE, got {goal!r}")
    candidates = []
    for trial in trials:
        state = str(trial.get("state", ""))
        if state != "SUCCEEDED":
            continue
        measurement = get(trial, "finalMeasurement", "final_measurement") or {}
        values = [
            m.get("value")
            for m in measurement.get("metrics", [])
            if get(m, "metricId", "metric_id") == metric_id
        ]
        if values and values[0] is not None:
            candidates.append((float(values[0]), trial))
    if not candidates:
        states = ", ".join(
            f"{t.get('id')}: {t.get('state')}"
            + (
                f" ({get(t, 'infeasibleReason', 'infeasible_reason')})"
                if get(t, "infeasibleReason", "infeasible_reason")
                else ""
            )
            for t in trials
        )
        raise RuntimeError(
            f"no trial succeeded with a final {metric_id} measurement; trials: {states or 'none'}"
        )
    sign = 1.0 if goal == "MAXIMIZE" else -1.0
    value, best = max(candidates, key=lambda c: sign * c[0])  # max() keeps the first of equals
    params = {get(p, "parameterId", "parameter_id"): p.get("value") for p in best.get("parameters", [])}
    return {"trial_id": str(best.get("id")), "value": value, "parameters": params}


@dsl.component(
    base_image=runtime.BASE_IMAGE,
    install_kfp_package=False,
    additional_funcs=[pick_best_trial],
)
def best_trial(
    project: str,
    location: str,
    gcp_resources: str,
    trials: dsl.Output[dsl.Artifact],
    metric_id: str = "val_accuracy",
    goal: str = "MAXIMIZE",
) -> NamedTuple("Outputs", hyperparameters=dict, trial_id=str, value=float):
    """Reads the tuning job named in `gcp_resources` (the GCPC op's output) and returns the best
    SUCCEEDED trial's parameters. `trials` gets the whole trials table (JSON list)."""
    import collections
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
    best = pick_best_trial(table, metric_id, goal)
    # Integer parameters come back as JSON numbers (512.0): give the trainer whole numbers.
    kinds = {}
    for spec in job.study_spec.parameters:
        kinds[spec.parameter_id] = aiplatform_v1.StudySpec.ParameterSpec.pb(spec).WhichOneof(
            "parameter_value_spec"
        )
    params = {
        k: int(v)
        if kinds.get(k) == "integer_value_spec"
        or (isinstance(v, float) and v.is_integer() and kinds.get(k) == "discrete_value_spec")
        else v
        for k, v in best["parameters"].items()
    }
    trials.metadata.update({"count": len(table), "best_trial_id": best["trial_id"], metric_id: best["value"]})
    print(f"best trial {best['trial_id']} of {len(table)}: {metric_id}={best['value']:.4f} {params}")
    Outputs = collections.namedtuple("Outputs", ["hyperparameters", "trial_id", "value"])
    return Outputs(params, best["trial_id"], best["value"])
