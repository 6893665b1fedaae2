"""The steps' display names (what the console, the run summary and Vertex's run graph show) and
the caching policy: the steps compiled with Vertex's execution cache off (`NEVER_CACHED`)."""

from __future__ import annotations

from kfp import dsl

BUILD, FIND_CHAMPION, PLAN = "build-trainer-image", "find-champion", "plan-jobs"
PREPARE, TUNE, BEST_TRIAL, TRAIN = "prepare-dataset", "tune-hyperparameters", "best-trial", "train-model"
EVALUATE, GATE, UPLOAD_SETTINGS, UPLOAD = (
    "evaluate-models",
    "evaluate-model",
    "upload-settings",
    "upload-model",
)

# Steps that read or write state outside the pipeline (the Artifact Registry, the Model
# Registry) or that make a run's job folders: never served from Vertex's execution cache
# (docs/architecture.md#caching says what each would do cached). Vertex keys its cache on a
# task's inputs, outputs and component spec ("Configure execution caching", Vertex AI Pipelines
# docs); `PipelineJob(enable_caching=None)` keeps these compiled per-task options (aiplatform
# `pipeline_jobs.py`: `_set_enable_caching_value` runs only when it is not None).
NEVER_CACHED = (BUILD, PLAN, FIND_CHAMPION, UPLOAD, GATE)


def uncached(task: dsl.PipelineTask, name: str) -> dsl.PipelineTask:
    task.set_display_name(name)
    if name in NEVER_CACHED:
        task.set_caching_options(False)
    return task
