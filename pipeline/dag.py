"""The DAG, for either target, and nothing else.

    image build (beside it: the champion, read from the registry) -> plan every job
        -> prepare the dataset (refused there when it is not the champion's task)
        -> [tune -> best trial] -> train -> evaluate the new model and the champion on this
        run's test split -> upload a new model version -> gate (moves the champion alias)

Every container step is a machine start on Vertex (`pipeline.cost`), so the bookkeeping lives in
the planning step. The steps that differ between "vertex" (GCPC) and "local" (`local.steps`) are
looked up in `pipeline.backends.BACKENDS`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kfp import compiler, dsl

import pipeline.step as step
from components import plan, registry, worker_pools
from components.plan import plan_jobs
from local import ROOT
from pipeline.backends import BACKENDS, dataflow_preparation
from pipeline.options import REQUIRED, parameters_for

PIPELINE_NAME = "multiworker-cassava-training"
COMPILED = ROOT / "compiled" / "pipeline.json"
COMPILED_NOTIFY = ROOT / "compiled" / "pipeline-notify.json"
# The pipeline parameters `components.plan.plan_jobs` takes under their own names
# (tests/components/test_steps.py keeps them equal), also `trainer_flags.trainer_commands`' source.
PLAN_PARAMETERS = (
    "dataset_source",
    "image_size",
    "dataset_shards",
    "synthetic_per_class",
    "search_space",
    "model_display_name",
    *plan.MODEL_FLAGS,
    *worker_pools.HARDWARE_PARAMETERS,
    "prepare_machine_type",
    "prepare_engine",
    "network",
)


def _dag(target: str, p: dict[str, Any]) -> None:
    """`p` maps parameter names to pipeline channels."""
    steps = BACKENDS[target]
    where = {"project": p["project"], "location": p["location"]}

    # 1. The trainer image, and the champion read before any work (its class names go to the
    # preparation job, its SavedModel to the evaluation job).
    built = steps.build_image(p)
    step.uncached(built, step.BUILD)
    champion = step.uncached(steps.find_champion(where, p), step.FIND_CHAMPION)

    # 2. Every job's worker pools, flags and folder, in one step (`components.plan`).
    plan = plan_jobs(
        image_uri=built.outputs["image_uri"],
        training_image_uri=built.outputs["training_image_uri"],
        cpu_image_uri=built.outputs["cpu_image_uri"],
        champion_class_names=champion.outputs["class_names"],
        champion_uri=champion.outputs["champion_uri"],
        model_root=p.get("model_root", ""),  # the Vertex target's alone
        pipeline_run=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
        region=p["location"],
        dataflow_image_uri=built.outputs["dataflow_image_uri"],
        **{name: p[name] for name in PLAN_PARAMETERS},
    )
    step.uncached(plan, step.PLAN)
    out = plan.outputs

    # 3. The dataset, prepared by a one-replica CPU job (locally with prepare_engine=beam too:
    # Beam's DirectRunner), or on Vertex with prepare_engine=beam by a Dataflow job.
    tail = {**p, "where": where, "plan": out, "champion": champion.outputs, "built": built.outputs}
    if target == "vertex":
        with dsl.If(p["prepare_engine"] == "beam", name="prepare-on-dataflow"):
            prepared = dataflow_preparation(where, p, out, built.outputs, _job_settings(p))
            _tune_then_train(target, tail, prepared)
        with dsl.Else(name="prepare-in-a-job"):
            _tune_then_train(target, tail, _prepare_job(target, where, p, out))
    else:
        _tune_then_train(target, tail, _prepare_job(target, where, p, out))


def _prepare_job(target: str, where: dict[str, Any], p: dict[str, Any], out: Any) -> Any:
    return BACKENDS[target].custom_job(
        step.PREPARE,
        where,
        out["prepare_pools"],
        out["prepare_dir"],
        {**_job_settings(p), "restart_job_on_worker_restart": False},
    )


def _tune_then_train(target: str, t: dict[str, Any], prepared: Any) -> None:
    """4-7. Tuning (optional), then training and everything after it in both branches: nothing
    joins them (no artifact `dsl.OneOf`: kubeflow/pipelines#13436; a KFP sub-pipeline compiles to
    different bytes from run to run)."""
    with dsl.If(t["tune"] == True, name="tuning-enabled"):  # noqa: E712 (a KFP condition)
        best = BACKENDS[target].tuning(t["where"], t, t["plan"], prepared)
        _train_and_register(target, t, best.outputs["worker_pool_specs"], prepared)
    with dsl.Else(name="tuning-disabled"):
        _train_and_register(target, t, t["plan"]["training_pools"], prepared)


def _job_settings(p: dict[str, Any]) -> dict[str, Any]:
    """The settings every custom job gets; on Vertex the persistent resource too."""
    return {
        "timeout": p["timeout"],
        "restart_job_on_worker_restart": p["restart_job_on_worker_restart"],
        "service_account": p["service_account"],
        "network": p["network"],
        "encryption_spec_key_name": p["encryption_spec_key_name"],
        "labels": p["labels"],
        **({"persistent_resource_id": p["persistent_resource_id"]} if "persistent_resource_id" in p else {}),
    }


def _train_and_register(target: str, t: dict[str, Any], training_pools: Any, prepared: Any) -> None:
    """The training job (on the plan's or the best trial's pools), the evaluation job, then the
    registry. `t`: the parameters and the plan, find-champion and build outputs."""
    steps = BACKENDS[target]
    train = steps.custom_job(
        step.TRAIN,
        t["where"],
        training_pools,
        t["plan"]["training_dir"],
        _job_settings(t),
        strategy=t["scheduling_strategy"],
        tensorboard=t["tensorboard"],
    ).after(prepared)
    evaluated = steps.custom_job(
        step.EVALUATE,
        t["where"],
        t["plan"]["evaluation_pools"],
        t["plan"]["evaluation_dir"],
        {**_job_settings(t), "restart_job_on_worker_restart": False},
    ).after(train)
    settings = registry.upload_settings(
        location=t["location"],
        serving_image=t["serving_image"],
        tf_version=t["serving_tf_version"],
        serving_accelerator=t["serving_accelerator"],
        custom_image_uri=t["built"]["serving_image_uri"],
        model_uri=t["plan"]["model_uri"],
        labels=t["labels"],
        source_commit=t["source_commit"],
        pipeline_run=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
    ).set_display_name(step.UPLOAD_SETTINGS)
    steps.registry(t["where"], t, settings, evaluated)


def create_pipeline(target: str = "vertex", notify: bool = False) -> Callable[..., Any]:
    """The pipeline for `target` ("vertex" or "local"). `notify` (Vertex only) wraps the DAG in an
    exit handler e-mailing `notification_emails` (GCPC's `VertexNotificationEmailOp`); Google
    documents no empty recipient list (docs/facts.md, fact 33), hence `template_for`."""
    if notify and target != "vertex":
        raise ValueError("notify exists only on the vertex target (the e-mail is sent by Vertex)")
    params = tuple(q for q in parameters_for(target) if notify or q.name != "notification_emails")
    # A Python signature lists the parameters without a default first.
    params = tuple(sorted(params, key=lambda q: q.default_for(target) is not REQUIRED))

    def pipeline_func(*args: Any) -> None:
        bound = dict(zip((q.name for q in params), args, strict=True))
        if notify:
            from google_cloud_pipeline_components.v1.vertex_notification_email import (
                VertexNotificationEmailOp,
            )

            handler = VertexNotificationEmailOp(recipients=bound["notification_emails"])
            with dsl.ExitHandler(handler, name="train-and-register"):
                _dag(target, bound)
        else:
            _dag(target, bound)

    pipeline_func.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                q.name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=q.type,
                **({} if q.default_for(target) is REQUIRED else {"default": q.default_for(target)}),
            )
            for q in params
        ]
    )
    pipeline_func.__doc__ = (
        "Multi-worker TensorFlow training, from source to the Model Registry.\n\nArgs:\n"
        + "".join(f"    {q.name}: {q.help}\n" for q in params)
    )
    pipeline_func.__name__ = pipeline_func.__qualname__ = PIPELINE_NAME.replace("-", "_")
    return dsl.pipeline(name=PIPELINE_NAME if target == "vertex" else f"{PIPELINE_NAME}-local")(pipeline_func)


def compile_pipeline(path: str | Path = COMPILED, notify: bool = False) -> Path:
    """Writes a Vertex pipeline spec; the bytes depend only on the sources."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(create_pipeline("vertex", notify=notify), str(out))
    return out


def template_for(notification_emails: Any) -> Path:
    """The compiled template a run uses: with the e-mail exit handler only when it has recipients."""
    return COMPILED_NOTIFY if notification_emails else COMPILED
