"""`make report RUN=<job id or resource name>`: a Vertex run's `summary.json` and
`report.html`, as a local run leaves them, in `<runs_dir>/<job id>/` (replaced on every report).

What it reads and shows: `launch.vertexrun`; a run still running is reported as it stands (`status`
RUNNING). Exit status: docs/vertex.md#on-vertex-ai-the-runs-report.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from launch import settings as settings_mod
from launch import submit, vertexreader, vertexrun
from launch.cloud import calling_vertex, said
from launch.flags import RUNS_DIR
from launch.settings import Settings, SettingsError

PROG = "make report"

RUN_FORMS = (
    "a pipeline job id (its project and region are PROJECT_ID and REGION, env or env.sh) or a "
    "resource name projects/<project>/locations/<region>/pipelineJobs/<id>"
)
# aiplatform_v1 CreatePipelineJobRequest.pipeline_job_id: "This value should be less than 128
# characters, and valid characters are /[a-z][0-9]-/".
_JOB_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,127}")
_RESOURCE = re.compile(r"projects/([^/]+)/locations/([^/]+)/pipelineJobs/([^/]+)")
# A project id (as launch.settings takes PROJECT_ID) or a project number.
_PROJECT = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]|[0-9]{1,20}")


class Run(NamedTuple):
    """A RUN as given: the job id, and its project and region when it was a resource name."""

    job_id: str
    project: str = ""
    location: str = ""


def parse_run(text: str) -> Run:
    """RUN checked for its form, before any setting is read or request sent; ValueError naming both forms."""
    value = text.strip()
    if not value:
        raise ValueError(f"RUN is not set: give {RUN_FORMS}")
    if full := _RESOURCE.fullmatch(value):
        project, location, job_id = full.groups()
        if _PROJECT.fullmatch(project) and _JOB_ID.fullmatch(job_id):
            if settings_mod.region_problem(location):
                raise ValueError(f"RUN={value!r}: its region {location!r} is not a Vertex AI region")
            return Run(job_id, project, location)
    elif _JOB_ID.fullmatch(value):
        return Run(value)
    raise ValueError(f"RUN={value!r} is not a pipeline run: give {RUN_FORMS}")


def run_settings(run: Run, environ: Mapping[str, str], env_file: Path = Path("env.sh")) -> Settings:
    """The settings the report's requests use: those `make run` reads; a resource name brings its
    own project and region, so only a bare job id needs PROJECT_ID and REGION."""
    if run.project:
        loaded = settings_mod.load(environ, env_file, required=())
        endpoint = loaded.api_endpoint
        if endpoint and loaded.region and run.location != loaded.region:  # an endpoint serves one region
            if endpoint != f"{loaded.region}-aiplatform.googleapis.com":
                raise SettingsError(
                    f"API_ENDPOINT={endpoint} serves REGION={loaded.region}, and RUN is in {run.location}: "
                    "give that region's endpoint, or leave API_ENDPOINT unset"
                )
            endpoint = ""  # REGION's default endpoint: RUN's region has its own
        return dataclasses.replace(loaded, project=run.project, region=run.location, api_endpoint=endpoint)
    return settings_mod.load(environ, env_file, required=("PROJECT_ID", "REGION"))


def main(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] = os.environ,
    env_file: Path = Path("env.sh"),
    *,
    credentials: Any = None,
    transport: str | None = None,
    now: datetime.datetime | None = None,
    dataflow_endpoint: str = vertexreader.DATAFLOW_ENDPOINT,
) -> int:
    parser = argparse.ArgumentParser(prog=f"{PROG} RUN=...", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="?", default=None, help="the run (default: RUN); " + RUN_FORMS)
    parser.add_argument(
        "--runs_dir", default=RUNS_DIR, help=f"where <job id>/ is written (default {RUNS_DIR})"
    )
    ns = parser.parse_args(argv)
    try:
        run = parse_run(ns.run if ns.run is not None else environ.get("RUN", ""))
    except ValueError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    runs_dir = Path(ns.runs_dir)
    if runs_dir.exists() and not runs_dir.is_dir():
        print(f"{PROG}: --runs_dir {runs_dir} exists and is not a folder", file=sys.stderr)
        return 2
    settings = submit.load_settings(PROG, lambda: run_settings(run, environ, env_file), "read the run from")
    if settings is None:
        return 2
    name = f"projects/{settings.project}/locations/{settings.region}/pipelineJobs/{run.job_id}"

    def request() -> int:
        from google.api_core import exceptions
        from google.cloud import aiplatform

        submit.init_aiplatform(settings, credentials, transport)
        try:
            with calling_vertex(f"reading the pipeline run {name}", settings):
                job = aiplatform.PipelineJob.get(resource_name=name).gca_resource
        except exceptions.NotFound as err:
            print(f"{PROG}: Vertex AI has no pipeline run {name} (404: {said(err)})", file=sys.stderr)
            return 1
        reader = vertexreader.Reader(settings, credentials, dataflow_endpoint)
        reader.reached.add(reader.vertex[1])  # calling_vertex probed it
        vertexrun.write(job, reader, runs_dir, now, submit.console_url(name))
        return 0

    return submit.exit_status(PROG, request)


if __name__ == "__main__":
    sys.exit(main())
