"""The local stand-in for a Vertex HyperparameterTuningJob: real trials chosen by Optuna.

It takes the study spec the Vertex job gets, parsed as the real `aiplatform_v1.StudySpec`, and
honours parameter types, ranges and scales, the goal, the trial counts and the algorithm
(ALGORITHM_UNSPECIFIED: TPE, Optuna's Bayesian optimiser; RANDOM_SEARCH; GRID_SEARCH). Each trial
is a local custom job (`local.jobs`) with `--<parameter_id>=<value>` flags appended, its own AIP
directories under `<base>/<trial_id>/` and its measurements from its cloudml-hypertune file. The
trials table is in the `aiplatform_v1.Trial` JSON form, like the Vertex job's.

No trial is stopped by the study: GCPC 2.22's `HyperparameterTuningJobRunOp` cannot ask Vertex
for automated stopping (docs/options.md#the-search-space-search_space). A trial's final measurement
follows `measurement_selection` (aiplatform_v1 `StudySpec.MeasurementSelectionType`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, TextIO

from local import jobs


def parse_study(metrics: Sequence[Mapping[str, Any]], parameters: Sequence[Mapping[str, Any]]) -> Any:
    """The study as the real API type, parsed as strictly as the API (unknown fields refused),
    either key case. kfp.local hands JSON numbers over as doubles (2.0 for an enum): protobuf's
    `json_format` reads whole ones as ints. Not `components.tuning`'s parser: this module runs in
    a local step, where kfp's runtime has no `dsl.component` for that module's components."""
    from google.cloud import aiplatform_v1
    from google.protobuf import json_format

    def parse(kind: Any, entry: Any, what: str) -> Any:
        try:
            return kind.wrap(json_format.ParseDict(dict(entry), kind.pb(kind())))
        except (json_format.ParseError, TypeError, ValueError) as err:
            raise ValueError(f"{what}: {str(err).splitlines()[0]}") from None

    spec = aiplatform_v1.StudySpec(
        metrics=[parse(aiplatform_v1.StudySpec.MetricSpec, m, "metric") for m in metrics],
        parameters=[
            parse(aiplatform_v1.StudySpec.ParameterSpec, q, f"parameter {n}")
            for n, q in enumerate(parameters, 1)
        ],
    )
    if len(spec.metrics) != 1:
        raise ValueError(f"the study needs exactly one metric, got {len(spec.metrics)}")
    if not spec.parameters:
        raise ValueError("the study has no parameters")
    return spec


def grid(spec: Any) -> dict[str, list[Any]]:
    """GRID_SEARCH's feasible points per parameter (every parameter INTEGER, DISCRETE or
    CATEGORICAL: aiplatform_v1 `StudySpec.Algorithm`)."""
    points: dict[str, list[Any]] = {}
    for p in spec.parameters:
        kind = _value_spec(p)
        if kind not in ("integer_value_spec", "discrete_value_spec", "categorical_value_spec"):
            raise ValueError(
                f"GRID_SEARCH needs integer, discrete or categorical parameters; {p.parameter_id} is a double"
            )
        v = getattr(p, kind)
        ints = kind == "integer_value_spec"
        points[p.parameter_id] = list(range(v.min_value, v.max_value + 1) if ints else v.values)
    return points


def make_sampler(algorithm: str, spec: Any, seed: int) -> Any:
    import optuna

    if algorithm in ("ALGORITHM_UNSPECIFIED", ""):
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=2)
    if algorithm == "RANDOM_SEARCH":
        return optuna.samplers.RandomSampler(seed=seed)
    if algorithm == "GRID_SEARCH":

        class Grid(optuna.samplers.GridSampler):
            """Optuna's grid, without its `study.stop()` once every point was tried (allowed only
            inside `study.optimize`, not in ask-and-tell): `run_tuning` stops asking then, as a
            Vertex study is done "when the service exhausts the parameter search space"
            (aiplatform_v1 `Study.State.COMPLETED`)."""

            def after_trial(self, *args: Any, **kwargs: Any) -> None:
                return None

        return Grid(grid(spec), seed=seed)
    raise ValueError(
        f"search algorithm must be ALGORITHM_UNSPECIFIED, RANDOM_SEARCH or GRID_SEARCH, got {algorithm!r}"
    )


def suggest(trial: Any, spec: Any) -> dict[str, Any]:
    """One value per parameter, within its range and on its scale."""
    from google.cloud import aiplatform_v1

    scale = aiplatform_v1.StudySpec.ParameterSpec.ScaleType
    values: dict[str, Any] = {}
    for p in spec.parameters:
        kind = _value_spec(p)
        if not kind:
            raise ValueError(f"parameter {p.parameter_id} has no value spec")
        pid = p.parameter_id
        v = getattr(p, kind)
        log = p.scale_type in (scale.UNIT_LOG_SCALE, scale.UNIT_REVERSE_LOG_SCALE)
        # UNIT_REVERSE_LOG_SCALE: "values close to the top of the feasible space are spread out
        # more than points near the bottom" (aiplatform_v1 ParameterSpec.ScaleType): the log-scale
        # draw, mirrored within the range.
        mirror = p.scale_type == scale.UNIT_REVERSE_LOG_SCALE
        if kind in ("double_value_spec", "integer_value_spec"):
            draw = trial.suggest_float if kind == "double_value_spec" else trial.suggest_int
            value = draw(pid, v.min_value, v.max_value, log=log)
            values[pid] = v.min_value + v.max_value - value if mirror else value
        else:  # a discrete value that is whole is offered as an int
            discrete = kind == "discrete_value_spec"
            options = [int(x) if discrete and float(x).is_integer() else x for x in v.values]
            values[pid] = trial.suggest_categorical(pid, options)
    return values


def trial_value(value: Any) -> float | str:
    """A trial's parameter value as Vertex holds it (docs/facts.md, fact 25): a
    `google.protobuf.Value`, a double for INTEGER, DOUBLE and DISCRETE parameters, a string for
    CATEGORICAL ones (aiplatform_v1 `types/study.py`, `Trial.Parameter`;
    googleapis/python-aiplatform issue #866)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return float(value)


def trial_flag(parameter_id: str, value: Any) -> str:
    """`--<parameter_id>=<value>` exactly as a Vertex trial gets it (`--per_replica_batch_size=32.0`)."""
    v = trial_value(value)
    return f"--{parameter_id}={json.dumps(v) if isinstance(v, float) else v}"


def read_measurements(path: Path, metric_id: str) -> list[tuple[int, float]]:
    """(step, value) pairs cloudml-hypertune wrote for `metric_id`."""
    if not path.exists():
        return []
    out: list[tuple[int, float]] = []
    for line in path.read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            if metric_id in entry:
                out.append((int(float(entry.get("global_step") or len(out) + 1)), float(entry[metric_id])))
    return out


def run_tuning(
    worker_pool_specs: Sequence[Mapping[str, Any]],
    base_output_directory: str,
    study_spec_metrics: Sequence[Mapping[str, Any]],
    study_spec_parameters: Sequence[Mapping[str, Any]],
    *,
    max_trial_count: int,
    parallel_trial_count: int,
    max_failed_trial_count: int = 0,
    algorithm: str = "ALGORITHM_UNSPECIFIED",
    measurement_selection: str = "BEST_MEASUREMENT",
    project: str = "local",
    timeout: str = "3600s",
    restart_job_on_worker_restart: bool = False,
    seed: int = 0,
    out: TextIO | None = None,
) -> list[dict[str, Any]]:
    """Runs the trials; returns the trials table. Raises RuntimeError when
    `max_failed_trial_count` trials have failed. 0 means "Vertex AI decides how many Trials must
    fail before the whole job fails" (aiplatform_v1 `HyperparameterTuningJob`), an unpublished
    rule: locally 0 fails the job only when every trial failed."""
    import optuna
    from google.cloud import aiplatform_v1
    from google.protobuf import json_format

    stream = out or sys.stdout
    if max_trial_count < 1 or parallel_trial_count < 1:
        raise ValueError(
            f"max_trial_count and parallel_trial_count must be >= 1, got {max_trial_count}, {parallel_trial_count}"
        )
    spec = parse_study(study_spec_metrics, study_spec_parameters)
    metric = spec.metrics[0]
    maximize = metric.goal == aiplatform_v1.StudySpec.MetricSpec.GoalType.MAXIMIZE
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        direction="maximize" if maximize else "minimize", sampler=make_sampler(algorithm, spec, seed)
    )
    if algorithm == "GRID_SEARCH":  # the study ends when the grid is exhausted
        max_trial_count = min(max_trial_count, math.prod(len(v) for v in grid(spec).values()))
    table: list[dict[str, Any]] = []

    def run_trial(number: int, params: dict[str, Any]) -> dict[str, Any]:
        trial_id = str(number)
        trial_dir = Path(base_output_directory) / trial_id
        metric_file = trial_dir / "hypertune" / "output.metrics"
        flags = [trial_flag(k, v) for k, v in params.items()]
        specs = copy.deepcopy(list(worker_pool_specs))
        for s in filter(None, specs):  # an empty pool keeps its place
            s["container_spec"]["args"] = [*s["container_spec"].get("args", []), *flags]
        row: dict[str, Any] = {
            "id": trial_id,
            "parameters": [{"parameterId": k, "value": trial_value(v)} for k, v in params.items()],
            "startTime": _timestamp(time.time()),
        }
        stream.write(f"[tune] trial {trial_id} started: {' '.join(flags)}\n")
        reason = ""
        try:
            jobs.run_job(
                specs,
                str(trial_dir),
                display_name=f"trial-{trial_id}",
                project=project,
                log_dir=trial_dir / "replica_logs",
                timeout=timeout,
                restart_job_on_worker_restart=restart_job_on_worker_restart,
                job_id=f"local-trial-{trial_id}",
                # On Vertex each trial's metric file is on its own VM; here trials share one
                # machine, so each gets its own file (the variable cloudml-hypertune reads).
                extra_env={"CLOUD_ML_HP_METRIC_FILE": str(metric_file), "CLOUD_ML_TRIAL_ID": trial_id},
                out=stream,
                cancel=cancel,
            )
        except jobs.JobFailed as err:
            reason = str(err).splitlines()[0]
        measurements = [] if reason else read_measurements(metric_file, metric.metric_id)
        if not measurements:
            reason = reason or f"the trial reported no {metric.metric_id} (cloudml-hypertune)"
            row.update(state="INFEASIBLE", infeasibleReason=reason, endTime=_timestamp(time.time()))
            return row
        best = (max if maximize else min)(measurements, key=lambda m: m[1])  # the first of equals
        final = best if measurement_selection == "BEST_MEASUREMENT" else measurements[-1]
        as_api = [
            {"stepCount": str(s), "metrics": [{"metricId": metric.metric_id, "value": v}]}
            for s, v in measurements
        ]
        row.update(
            state="SUCCEEDED",
            measurements=as_api,
            finalMeasurement=as_api[measurements.index(final)],
            endTime=_timestamp(time.time()),
        )
        stream.write(f"[tune] trial {trial_id} {metric.metric_id}={final[1]:.4f}\n")
        return row

    # Set when the study ends early (max_failed_trial_count: "failing the HyperparameterTuningJob",
    # aiplatform_v1; Ctrl-C): the trials still running are stopped, their replicas given their grace.
    # That a failed job's running trials stop at once on Vertex is inferred (a failed job holds no
    # machines), not documented: a real run's trial timeline shows it.
    cancel = threading.Event()
    with ThreadPoolExecutor(max_workers=parallel_trial_count) as pool, _cancelling_on_error(cancel):
        pending: dict[Future[dict[str, Any]], Any] = {}
        started = 0
        while started < max_trial_count or pending:
            while started < max_trial_count and len(pending) < parallel_trial_count:
                trial = study.ask()
                params = suggest(trial, spec)
                started += 1
                pending[pool.submit(run_trial, started, params)] = trial
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                trial = pending.pop(future)
                row = future.result()
                table.append(row)
                if row["state"] == "SUCCEEDED":
                    study.tell(trial, row["finalMeasurement"]["metrics"][0]["value"])
                else:
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    stream.write(f"[tune] trial {row['id']} failed: {row['infeasibleReason']}\n")
                    failed = sum(r["state"] != "SUCCEEDED" for r in table)
                    if max_failed_trial_count and failed >= max_failed_trial_count:
                        raise RuntimeError(
                            f"{failed} trials failed (max_failed_trial_count {max_failed_trial_count})"
                        )
    table.sort(key=lambda r: int(r["id"]))
    for row in table:  # the table must be what the API would return
        json_format.ParseDict(row, aiplatform_v1.Trial.pb(aiplatform_v1.Trial()))
    if not any(r["state"] == "SUCCEEDED" for r in table):
        raise RuntimeError(
            "every trial failed: " + "; ".join(f"{r['id']}: {r['infeasibleReason']}" for r in table)
        )
    return table


@contextlib.contextmanager
def _cancelling_on_error(cancel: threading.Event) -> Iterator[None]:
    try:
        yield
    except BaseException:
        cancel.set()
        raise


def _timestamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(math.modf(t)[0] * 1000):03d}Z"


def _value_spec(p: Any) -> str:
    """Which value spec a parsed ParameterSpec has ('' for none)."""
    return str(type(p).pb(p).WhichOneof("parameter_value_spec") or "")
