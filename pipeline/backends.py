"""The per-target table: the steps that differ between Vertex and the local target
(`BACKENDS[target]`, a `Backend` of five entries); everything else in `pipeline.dag` is shared."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from kfp import dsl

import pipeline.step as step
from components import evaluation, image, registry, tuning
from local import steps as local_steps

# The image parameters both targets' build steps take under their own names.
_IMAGE = (
    "serving_image",
    "serving_tf_version",
    "serving_accelerator",
    "reduction_server_count",
    "prepare_engine",
)


def _vertex_image(p: dict[str, Any]) -> dsl.PipelineTask:
    builds = ("build_location", "build_machine_type", "build_service_account", "build_worker_pool")
    return image.build_trainer_image(
        project=p["project"],
        location=p["location"],
        context_uri=p["context_uri"],
        repository=p["artifact_repository"],
        **{name: p[name] for name in (*_IMAGE, *builds)},
    )


def _local_image(p: dict[str, Any]) -> dsl.PipelineTask:
    return local_steps.check_build_context(
        context_dir=p["context_uri"],
        repository=p["artifact_repository"],
        **{name: p[name] for name in _IMAGE},
    )


def _vertex_custom_job(
    name: str, where: dict[str, Any], pools: Any, folder: Any, settings: dict[str, Any], **extra: Any
) -> dsl.PipelineTask:
    """GCPC's CustomTrainingJobOp, `persistent_resource_id` passed explicitly ('': machines started
    for the job): the op's default is "resolved to the PipelineJob RuntimeConfig's persistent
    resource id at runtime" (GCPC 2.22 v1/custom_job/component.py), set only by a v1beta1
    PipelineJob, and `launch.submit` sends a v1 one (docs/architecture.md#a-warm-pool-the-jobs-on-a-vertex-persistent-resource).
    aiplatform_v1 `CustomJobSpec.persistent_resource_id`: run "on existing machines held by the
    PersistentResource instead of on-demand short-live machines"."""
    from google_cloud_pipeline_components.v1.custom_job import CustomTrainingJobOp

    return CustomTrainingJobOp(
        **where, display_name=name, worker_pool_specs=pools, base_output_directory=folder, **settings, **extra
    ).set_display_name(name)


def dataflow_preparation(
    where: dict[str, Any], p: dict[str, Any], plan: Any, built: Any, settings: dict[str, Any]
) -> dsl.PipelineTask:
    """The Vertex target's preparation with prepare_engine=beam (docs/training.md#preparing-on-apache-beam):
    GCPC's `DataflowFlexTemplateJobOp` launches the Beam pipeline from the Flex Template spec the
    plan wrote (image: Dockerfile's `dataflow` stage) and returns (GCPC 2.22 container/preview/
    dataflow/flex_template/remote_runner.py); `WaitGcpResourcesOp` polls the job until
    JOB_STATE_DONE and fails on any other end state (container/v1/wait_gcp_resources/remote_runner.py)."""
    from google_cloud_pipeline_components.v1.dataflow import DataflowFlexTemplateJobOp
    from google_cloud_pipeline_components.v1.wait_gcp_resources import WaitGcpResourcesOp

    launch = DataflowFlexTemplateJobOp(
        **where,
        container_spec_gcs_path=plan["dataflow_template"],
        parameters=plan["dataflow_parameters"],
        max_workers=p["dataflow_max_workers"],
        machine_type=p["dataflow_machine_type"],
        service_account_email=settings["service_account"],
        network=plan["dataflow_network"],
        subnetwork=p["dataflow_subnetwork"],
        kms_key_name=settings["encryption_spec_key_name"],
        additional_user_labels=settings["labels"],
        temp_location=plan["dataflow_temp_location"],
        staging_location=plan["dataflow_temp_location"],
        sdk_container_image=built["dataflow_image_uri"],
    ).set_display_name("launch-dataflow-preparation")
    return WaitGcpResourcesOp(gcp_resources=launch.outputs["gcp_resources"]).set_display_name(
        "wait-dataflow-preparation"
    )


def _local_custom_job(
    name: str, where: dict[str, Any], pools: Any, folder: Any, settings: dict[str, Any], **extra: Any
) -> dsl.PipelineTask:
    """The same specs; the job settings the local runner cannot honour are Vertex's alone."""
    return local_steps.local_custom_job(
        display_name=name,
        project=where["project"],
        worker_pool_specs=pools,
        base_output_directory=folder,
        timeout=settings["timeout"],
        restart_job_on_worker_restart=settings["restart_job_on_worker_restart"],
    ).set_display_name(name)


def _study(p: dict[str, Any], metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """What both tuning steps get: the fixed metric, the declared `search_space`, the trial counts,
    the search algorithm and each trial's timeout and restart setting."""
    return {
        "study_spec_metrics": metrics,
        "study_spec_parameters": p["search_space"],
        "max_trial_count": p["max_trial_count"],
        "parallel_trial_count": p["parallel_trial_count"],
        "max_failed_trial_count": p["max_failed_trial_count"],
        "study_spec_algorithm": p["search_algorithm"],
        "timeout": p["timeout"],
        "restart_job_on_worker_restart": p["restart_job_on_worker_restart"],
    }


def _vertex_tuning(where: dict[str, Any], p: dict[str, Any], plan: Any, prepared: Any) -> dsl.PipelineTask:
    """The tuning job (`tuning.tuning_job`), then the best-trial step that writes the best values
    into the training job's flags; returns that step. No automated early stopping: GCPC 2.22's op
    has no input for it (docs/options.md#the-search-space-search_space)."""
    job = tuning.tuning_job()(
        **where,
        display_name=step.TUNE,
        base_output_directory=plan["tuning_dir"],
        worker_pool_specs=plan["tuning_pools"],
        **_study(p, tuning.study_metrics()),
        study_spec_measurement_selection_type=plan["measurement_selection_type"],
        encryption_spec_key_name=p["encryption_spec_key_name"],
        service_account=p["service_account"],
        network=p["network"],
    ).set_display_name(step.TUNE)
    job.after(prepared)
    best = tuning.best_trial(
        **where,
        gcp_resources=job.outputs["gcp_resources"],
        training_pools=plan["training_pools"],
        metric_id=tuning.METRIC_ID,
    )
    return best.set_display_name(step.BEST_TRIAL)


def _local_tuning(where: dict[str, Any], p: dict[str, Any], plan: Any, prepared: Any) -> dsl.PipelineTask:
    job = local_steps.local_tuning_job(
        project=where["project"],
        worker_pool_specs=plan["tuning_pools"],
        base_output_directory=plan["tuning_dir"],
        **_study(p, tuning.LOCAL_STUDY_METRICS),
        measurement_selection=plan["measurement_selection_type"],
        seed=p["seed"],
    ).set_display_name(step.TUNE)
    job.after(prepared)
    best = local_steps.local_best_trial(
        trials=job.outputs["trials"], training_pools=plan["training_pools"], metric_id=tuning.METRIC_ID
    )
    return best.set_display_name(step.BEST_TRIAL)


def _vertex_find_champion(where: dict[str, Any], p: dict[str, Any]) -> dsl.PipelineTask:
    return registry.find_champion(**where, model_display_name=p["model_display_name"])


def _local_find_champion(where: dict[str, Any], p: dict[str, Any]) -> dsl.PipelineTask:
    return local_steps.local_find_champion(
        registry_dir=p["registry_dir"], model_display_name=p["model_display_name"]
    )


def _gate(t: dict[str, Any], **vertex: Any) -> dsl.PipelineTask:
    """The gate (`evaluation.evaluate_model`); `t` as `pipeline.dag._train_and_register`'s."""
    return evaluation.evaluate_model(
        dataset_uri=t["plan"]["dataset_uri"],
        model_uri=t["plan"]["model_uri"],
        evaluation_dir=t["plan"]["evaluation_dir"],
        gate_metric=t["gate_metric"],
        min_score=t["min_score"],
        gate_rule=t["gate_rule"],
        gate_margin=t["gate_margin"],
        champion_class_names=t["champion"]["class_names"],
        champion_version=t["champion"]["champion_version"],
        **vertex,
    )


def _vertex_registry(
    where: dict[str, Any], t: dict[str, Any], settings: dsl.PipelineTask, evaluated: dsl.PipelineTask
) -> None:
    """ModelUploadOp (a new version of the champion's model when there is one), then the gate,
    which moves the alias when it passed (`registry.record_on_version`). One upload for both cases
    (no artifact `dsl.OneOf`, kubeflow/pipelines#13436): GCPC's upload launcher leaves an empty
    parent out (container/v1/model/upload_model/remote_runner.py: `if parent_model_name:`)."""
    from google_cloud_pipeline_components.types.artifact_types import UnmanagedContainerModel, VertexModel
    from google_cloud_pipeline_components.v1.model import ModelUploadOp

    # (`servingimage.registered_artifact`) A route left "" is unset (proto3) and takes Vertex's
    # default, /v1/endpoints/ENDPOINT/deployedModels/DEPLOYED_MODEL:predict, the prebuilt images'
    # (aiplatform_v1 `ModelContainerSpec.predict_route`: "If you don't specify this field, ...").
    unmanaged = dsl.importer(
        artifact_uri=settings.outputs["artifact_uri"],
        artifact_class=UnmanagedContainerModel,
        metadata={
            "containerSpec": {
                "imageUri": settings.outputs["serving_image"],
                "predictRoute": settings.outputs["predict_route"],
                "healthRoute": settings.outputs["health_route"],
            }
        },
    ).set_display_name("serving-container")
    parent = dsl.importer(
        artifact_uri=t["champion"]["resource_uri"],
        artifact_class=VertexModel,
        metadata={"resourceName": t["champion"]["resource_name"]},
    ).set_display_name("parent-model")
    upload = ModelUploadOp(
        **where,
        display_name=t["model_display_name"],
        unmanaged_container_model=unmanaged.output,
        parent_model=parent.output,
        labels=settings.outputs["labels"],
        encryption_spec_key_name=t["encryption_spec_key_name"],
    )
    step.uncached(upload, step.UPLOAD).after(evaluated)
    step.uncached(_gate(t, uploaded=upload.outputs["model"], location=t["location"]), step.GATE)


def _local_registry(
    where: dict[str, Any], t: dict[str, Any], settings: dsl.PipelineTask, evaluated: dsl.PipelineTask
) -> None:
    """The gate, then the local upload, which moves the alias by its decision under the lock."""
    gate = step.uncached(_gate(t), step.GATE).after(evaluated)
    upload = local_steps.local_upload_model(
        model=gate.outputs["model"],
        registry_dir=t["registry_dir"],
        model_display_name=t["model_display_name"],
        serving_image=settings.outputs["serving_image"],
        artifact_uri=settings.outputs["artifact_uri"],
        predict_route=settings.outputs["predict_route"],
        labels=settings.outputs["labels"],
        promote=gate.outputs["promote"],
        gate_reason=gate.outputs["reason"],
        description=gate.outputs["description"],
        evaluated_champion=t["champion"]["champion_version"],
        evaluation_dir=t["plan"]["evaluation_dir"],
    )
    step.uncached(upload, step.UPLOAD)


@dataclasses.dataclass(frozen=True)
class Backend:
    """The steps that differ between the targets; everything else in `_dag` is shared."""

    build_image: Callable[[dict[str, Any]], dsl.PipelineTask]
    custom_job: Callable[..., dsl.PipelineTask]
    # (where, parameters, the planning step's outputs, the preparation job) -> the best-trial step
    tuning: Callable[..., dsl.PipelineTask]
    find_champion: Callable[[dict[str, Any], dict[str, Any]], dsl.PipelineTask]
    # (where, the parameters and upstream outputs, upload-settings, the evaluation job)
    registry: Callable[..., None]


BACKENDS = {
    "vertex": Backend(
        _vertex_image, _vertex_custom_job, _vertex_tuning, _vertex_find_champion, _vertex_registry
    ),
    "local": Backend(_local_image, _local_custom_job, _local_tuning, _local_find_champion, _local_registry),
}
