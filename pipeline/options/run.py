"""Where the run is and what it is built from: the parameters the submitter gives (`make run`,
`make schedule`), never baked into the compiled JSON. No rule of their own: the settings that
fill them are checked by `launch.settings`."""

from __future__ import annotations

from pipeline.options.common import REQUIRED
from pipeline.options.common import Parameter as _p

PARAMETERS: tuple[_p, ...] = (
    _p("project", str, REQUIRED, "Google Cloud project of every job and of the model.", "local"),
    _p("location", str, REQUIRED, "Region of every job and of the model (e.g. us-central1).", "us-central1"),
    _p(
        "context_uri",
        str,
        REQUIRED,
        "gs:// URI of the build context tarball (Vertex) or the checkout folder (local).",
        ".",
    ),
    _p(
        "artifact_repository",
        str,
        REQUIRED,
        "Artifact Registry repository, <region>-docker.pkg.dev/<project>/<repo>.",
        "local",
    ),
    _p("source_commit", str, "", "Git commit of the source, recorded on the model version."),
)
