"""The container every lightweight step runs in on Vertex AI Pipelines: its image, the pins that
image carries, and how Cloud Storage appears inside it (`fuse_path`).

Each component's function body is self-contained (imports inside, helpers shipped with KFP's
`additional_funcs`) and runs on the GCPC image of `uv.lock`'s GCPC version (a test keeps the pin
in step), which holds kfp, google-cloud-aiplatform, google-cloud-storage, google-auth and
requests: no component installs anything at run time (docs/facts.md, fact 5 and fact 32), as the
local target needs too (its `SubprocessRunner(use_venv=False)` has no pip).
"""

from __future__ import annotations

GCPC_VERSION = "2.22.0"
BASE_IMAGE = f"gcr.io/ml-pipeline/google-cloud-pipeline-components:{GCPC_VERSION}"


def fuse_path(uri: str) -> str:
    """A gs:// URI as the Cloud Storage FUSE path Vertex mounts in every container (/gcs/...);
    anything else (a local path on the local target) unchanged."""
    return "/gcs/" + uri[len("gs://") :] if uri.startswith("gs://") else uri


def multi_region(location: str) -> str:
    """The Artifact Registry multi-region (us, europe or asia) nearest a Vertex location, where
    Google publishes its images in all three (the prebuilt serving images, the Reduction Server)."""
    area = location.split("-")[0]
    return {"europe": "europe", "asia": "asia", "australia": "asia", "me": "asia"}.get(area, "us")
