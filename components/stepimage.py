"""The container every lightweight step runs in on Vertex AI Pipelines: its image, the pins that
image carries, and how Cloud Storage appears inside it (`fuse_path`).

Each component's function body is self-contained (imports inside, helpers shipped with KFP's
`additional_funcs`) and runs on the Google Cloud Pipeline Components image of the GCPC version
in `uv.lock`, which already holds kfp, google-cloud-aiplatform and google-cloud-storage: so no
component installs anything at run time (`install_kfp_package=False`), which is also what the
local target needs (`SubprocessRunner(use_venv=False)` runs the same functions in this
checkout's environment, where pip is not even present). The image build, too, needs nothing
more: it speaks Cloud Build's REST API with google-auth and requests, both in that image. The
GCPC pin below follows uv.lock's version (a test keeps it in step).
"""

from __future__ import annotations

GCPC_VERSION = "2.22.0"
BASE_IMAGE = f"gcr.io/ml-pipeline/google-cloud-pipeline-components:{GCPC_VERSION}"

PINNED = (f"google-cloud-pipeline-components=={GCPC_VERSION}",)


def fuse_path(uri: str) -> str:
    """A gs:// URI as the Cloud Storage FUSE path Vertex mounts in every container (/gcs/...);
    anything else (a local path on the local target) unchanged."""
    return "/gcs/" + uri[len("gs://") :] if uri.startswith("gs://") else uri


def multi_region(location: str) -> str:
    """The Artifact Registry multi-region (us, europe or asia) nearest a Vertex location, where
    Google publishes its images in all three (the prebuilt serving images, the Reduction Server)."""
    area = location.split("-")[0]
    return {"europe": "europe", "asia": "asia", "australia": "asia", "me": "asia"}.get(area, "us")
