"""A real end-to-end run on Vertex AI, for users with a project: `make e2e` (settings from the
environment or env.sh). Submits the compiled pipeline with a small configuration, waits for it,
and checks that a new version of the model exists in the Model Registry. Never run by CI: it
needs Google Cloud and costs money."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launch import settings, submit

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not (
            os.environ.get("PROJECT_ID")
            or "PROJECT_ID=" in (Path("env.sh").read_text() if Path("env.sh").exists() else "")
        ),
        reason="needs a Google Cloud project (PROJECT_ID in the environment or env.sh)",
    ),
]


def test_a_small_run_registers_a_model_version() -> None:
    from google.cloud import aiplatform

    config = settings.load(os.environ)
    submit.init_aiplatform(config)
    name = f"cassava-e2e-{os.getpid()}"
    before = {m.version_id for m in aiplatform.Model.list(filter=f'display_name="{name}"')}
    small = {
        "model_display_name": name,
        "epochs": 1,
        "dataset_source": "synthetic",
        "image_size": 64,
        "backbone": "tiny",
        "weights": "none",
        "chief_accelerator_type": "",
        "chief_accelerator_count": 0,
        "worker_accelerator_type": "",
        "worker_accelerator_count": 0,
        "min_score": 0.0,
    }
    assert submit.submit(config, small, wait=True, poll_seconds=30) == 0
    models = aiplatform.Model.list(filter=f'display_name="{name}"')
    assert models, f"no model named {name} after the run"
    versions = {v.version_id for v in aiplatform.ModelRegistry(models[0]).list_versions()}
    assert versions - before, "the run registered no new version"
