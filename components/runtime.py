"""Where our lightweight components run on Vertex AI Pipelines.

Each component's function body is self-contained (imports inside, helpers shipped with KFP's
`additional_funcs`), so it runs on a stock Python image with the client libraries below; the
versions are the ones in `uv.lock` (a test keeps them in step). On the local target
(`SubprocessRunner(use_venv=False)`) the same functions run in this checkout's environment.
"""

from __future__ import annotations

BASE_IMAGE = "python:3.11-slim"

AIPLATFORM = "google-cloud-aiplatform==1.165.1"
CLOUD_BUILD = "google-cloud-build==3.42.0"
STORAGE = "google-cloud-storage==3.17.1"

PINNED = (AIPLATFORM, CLOUD_BUILD, STORAGE)


def fuse_path(uri: str) -> str:
    """A gs:// URI as the Cloud Storage FUSE path Vertex mounts in every container (/gcs/...);
    anything else (a local path on the local target) unchanged."""
    return "/gcs/" + uri[len("gs://") :] if uri.startswith("gs://") else uri
