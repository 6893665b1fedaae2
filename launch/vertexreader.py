"""How `launch.vertexrun` reads a Vertex run's jobs and files: through aiplatform, Dataflow's and
Cloud Storage's clients, each service probed once before its first use (`launch.cloud.reach`), and
whatever is missing or refused recorded rather than raised (`Reader.unreadable`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from launch.cloud import client_args, reach, reaching, said, vertex_service
from launch.settings import Settings

DATAFLOW_ENDPOINT = "dataflow.googleapis.com"
DATAFLOW_MESSAGES = 50  # the first messages a summary keeps of a Dataflow job

# (name, URL, hint) of a Google service, as launch.cloud names them.
Service = tuple[str, str, str]


class Reader:
    """The jobs and files a report reads (module docstring), through aiplatform (initialized by
    the caller: `launch.submit.init_aiplatform`) and google-cloud-storage."""

    def __init__(
        self, settings: Settings, credentials: Any = None, dataflow_endpoint: str = DATAFLOW_ENDPOINT
    ) -> None:
        self.project = settings.project
        self.vertex = vertex_service(settings)
        self.credentials = credentials
        # Where Dataflow's API is (a test's fake: http://host:port, spoken over REST).
        self.dataflow_endpoint = dataflow_endpoint
        self.unreadable: list[str] = []
        self._storage: Any = None
        self.reached: set[str] = set()  # the URLs probed (`reach`): each once per reader

    def job(self, name: str) -> Any:
        """The CustomJob or HyperparameterTuningJob `name` (aiplatform_v1 types), or None."""
        from google.cloud import aiplatform

        kind = aiplatform.CustomJob if "/customJobs/" in name else aiplatform.HyperparameterTuningJob
        return self._read(
            f"the job {name}", name, self.vertex, lambda: kind.get(resource_name=name).gca_resource
        )

    def model_version(self, name: str) -> Any:
        """The model version `name` (`projects/.../models/<id>@<version>`, aiplatform_v1 Model:
        its `version_aliases` and `container_spec`), or None (recorded)."""
        from google.cloud import aiplatform

        return self._read(
            f"the model version {name}",
            name,
            self.vertex,
            lambda: aiplatform.Model(model_name=name).gca_resource,
        )

    def dataflow_job(self, name: str) -> tuple[Any, list[Any]] | None:
        """The Dataflow job `name` (projects/<p>/locations/<l>/jobs/<id>) and its first messages
        of importance JOB_MESSAGE_BASIC and above (dataflow_v1beta3 types), or None (recorded)."""
        from google.cloud import dataflow_v1beta3 as dataflow

        _, project, _, location, _, job_id = name.split("/")
        where = {"project_id": project, "location": location, "job_id": job_id}
        endpoint = self.dataflow_endpoint
        options = client_args(endpoint, self.credentials)
        url = endpoint if endpoint.startswith("http") else f"https://{endpoint}"

        def job_and_messages() -> tuple[Any, list[Any]]:
            job = dataflow.JobsV1Beta3Client(**options).get_job(
                request={**where, "view": dataflow.JobView.JOB_VIEW_SUMMARY}
            )
            pages = dataflow.MessagesV1Beta3Client(**options).list_job_messages(
                request={
                    **where,
                    "minimum_importance": dataflow.JobMessageImportance.JOB_MESSAGE_BASIC,
                    "page_size": DATAFLOW_MESSAGES,
                }
            )
            return job, list(next(iter(pages.pages)).job_messages)[:DATAFLOW_MESSAGES]

        return self._read(f"the Dataflow job {name}", name, ("Dataflow", url, ""), job_and_messages)

    def text(self, uri: str) -> str | None:
        """The text of the gs:// object `uri`, or None (recorded) when it cannot be read."""
        match = re.fullmatch(r"gs://([^/]+)/(.+)", uri)
        if not match:
            self.unreadable.append(f"{uri}: not a gs:// object")
            return None
        bucket, name = match.groups()
        if self._storage is None:
            import google.cloud.storage as storage

            self._storage = storage.Client(project=self.project, credentials=self.credentials)
        return self._read(
            uri,
            uri,
            (f"Cloud Storage for gs://{bucket}", str(self._storage.api_endpoint), ""),
            lambda: str(self._storage.bucket(bucket).blob(name).download_as_text()),
        )

    def _read(self, what: str, name: str, service: Service, fetch: Callable[[], Any]) -> Any:
        """`fetch()` once `service` is reached: a network failure is the caller's one line
        (`reaching`); Google refusing or missing it is recorded under `name`: None."""
        from google.api_core import exceptions

        if service[1] not in self.reached:  # out of reach is one line, not minutes of retries
            reach(service)
            self.reached.add(service[1])
        try:
            with reaching(f"reading {what}", service):
                return fetch()
        except exceptions.GoogleAPICallError as err:
            self.unreadable.append(f"{name}: {said(err)}")
            return None
