"""Local fakes of Google's services, at the protocol level, for the real client libraries.

- `GrpcFake`: an insecure gRPC server on a loopback port serving hand-written handlers for
  chosen methods (Cloud Build, Vertex JobService/ModelService, long-running operations).
  Clients reach it through `insecure_client`.
- `RegistryFake`: the Docker Registry v2 manifest API that Artifact Registry speaks.
- `RestFake`: an HTTP/JSON server routing to hand-written handlers (Vertex, Cloud Build REST).
- `DataflowApi`: Dataflow's REST API (Flex Template launches, job states) served on a `RestFake`,
  and `DataflowApi.point_gcpc_launchers`, which sends GCPC's Dataflow launchers to it.
- `storage_emulator`: gcp-storage-emulator (the real google-cloud-storage client talks to it
  when STORAGE_EMULATOR_HOST is set).
Every request a fake receives is kept in `.requests` so tests assert on what was sent.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any

import grpc

from tests.processes import free_port


class GrpcFake:
    """A gRPC server; `add(service, method, request_type, handler)` before `start()`.

    `request_type`/the handler's return value are proto-plus messages or raw protobuf
    messages; handlers get the request and return the response (or raise `Abort`)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.requests: list[tuple[str, Any]] = []
        self._methods: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
        self._server: grpc.Server | None = None

    def add(self, service: str, method: str, request_type: Any, handler: Callable[[Any], Any]) -> None:
        deserialize = getattr(request_type, "deserialize", None) or request_type.FromString

        def call(request: Any, context: grpc.ServicerContext) -> Any:
            self.requests.append((method, request))
            try:
                return handler(request)
            except Abort as abort:
                context.abort(abort.code, abort.message)

        def serialize(message: Any) -> bytes:
            return (
                type(message).serialize(message)
                if hasattr(type(message), "serialize")
                else message.SerializeToString()
            )

        self._methods.setdefault(service, {})[method] = grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=deserialize, response_serializer=serialize
        )

    def start(self) -> GrpcFake:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        for service, methods in self._methods.items():
            self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, methods),))
        self._server.add_insecure_port(self.address)
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.stop(grace=None)

    def calls(self, method: str) -> list[Any]:
        return [request for name, request in self.requests if name == method]


class Abort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def insecure_client(client_class: type, transport_class: type, address: str) -> Callable[..., Any]:
    """A drop-in for a GAPIC client class whose instances talk to `address` without TLS,
    whatever endpoint the caller asked for (the code under test picks regional endpoints)."""

    def make(*_args: Any, **_kwargs: Any) -> Any:
        return client_class(transport=transport_class(channel=grpc.insecure_channel(address)))

    return make


class RegistryFake:
    """Docker Registry v2 manifests: `HEAD /v2/<name>/manifests/<tag>` answers 200 with a digest
    for known tags, 404 for others; `errors["<name>:<tag>"] = (status, body)` makes it answer
    that status instead (the body only to GET, as HEAD answers carry none). Requests are kept
    as "<METHOD> <path>"."""

    def __init__(self) -> None:
        self.manifests: dict[str, str] = {}  # "<name>:<tag>" -> digest
        self.errors: dict[str, tuple[int, str]] = {}  # "<name>:<tag>" -> (status, body)
        self.requests: list[str] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, method: str) -> None:
                fake.requests.append(f"{method} {self.path}")
                name, _, tag = self.path.removeprefix("/v2/").partition("/manifests/")
                key = f"{name}:{tag}"
                digest = fake.manifests.get(key)
                status, text = fake.errors.get(key) or ((200, "{}") if digest else (404, ""))
                body = text.encode() if method == "GET" else b""
                self.send_response(status)
                if digest and status == 200:
                    self.send_header("Docker-Content-Digest", digest)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_HEAD(self) -> None:
                self._answer("HEAD")

            def do_GET(self) -> None:
                self._answer("GET")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()


@contextmanager
def storage_emulator() -> Iterator[str]:
    """A gcp-storage-emulator on a loopback port; yields its URL (for STORAGE_EMULATOR_HOST)."""
    from gcp_storage_emulator.server import create_server

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


class RestFake:
    """An HTTP/JSON server: `route(method, path_regex, handler)`; handlers get (match, query,
    body) and return (status, json). Requests are kept as (method, path, query, body)."""

    def __init__(self) -> None:
        import re
        import urllib.parse

        self.routes: list[tuple[str, Any, Callable[..., tuple[int, Any]]]] = []
        self.requests: list[tuple[str, str, dict[str, list[str]], Any]] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                import json

                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw
                fake.requests.append((method, url.path, query, body))
                for route_method, pattern, handler in fake.routes:
                    match = re.fullmatch(pattern, url.path)
                    if route_method == method and match:
                        status, payload = handler(match, query, body)
                        break
                else:
                    status, payload = (
                        404,
                        {"error": {"code": 404, "message": f"no route {method} {url.path}"}},
                    )
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header(
                    "Content-Type", "application/json" if not isinstance(payload, bytes) else "text/plain"
                )
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_PATCH(self) -> None:
                self._serve("PATCH")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def route(self, method: str, pattern: str, handler: Callable[..., tuple[int, Any]]) -> None:
        self.routes.append((method, pattern, handler))

    def bodies(self, method: str, pattern: str) -> list[Any]:
        import re

        return [body for m, path, _, body in self.requests if m == method and re.fullmatch(pattern, path)]

    def stop(self) -> None:
        self._server.shutdown()


def unknown_fields(message: Any, path: str = "") -> list[str]:
    """Where a raw protobuf message holds fields its type does not declare ("<path>: #<number>"):
    what a newer client, or a hand-built payload, sent that the receiving type cannot read."""
    from google.protobuf import unknown_fields as unknown

    here = path or message.DESCRIPTOR.name
    found = [f"{here}: #{field.field_number}" for field in unknown.UnknownFieldSet(message)]
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        name = f"{here}.{field.name}"
        if field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].message_type is not None:
                for key, item in value.items():
                    found += unknown_fields(item, f"{name}[{key!r}]")
        elif field.is_repeated:
            for index, item in enumerate(value):
                found += unknown_fields(item, f"{name}[{index}]")
        else:
            found += unknown_fields(value, name)
    return found


class StrictRequest:
    """A `request_type` for `GrpcFake.add` whose deserializer refuses a request carrying fields the
    proto-plus type does not declare (protobuf's own parser keeps them silently); the refusals
    are kept in `.refused` (the client sees the RPC fail)."""

    def __init__(self, request_type: Any) -> None:
        self.request_type = request_type
        self.refused: list[str] = []

    def deserialize(self, data: bytes) -> Any:
        message = self.request_type.deserialize(data)
        unknown = unknown_fields(type(message).pb(message))
        if unknown:
            self.refused.append(f"{self.request_type.__name__}: unknown fields {', '.join(unknown)}")
            raise ValueError(self.refused[-1])
        return message


def strict_json(request_type: Any, body: Any) -> Any:
    """A REST body (JSON) parsed into the proto-plus `request_type` as the server would: unknown
    fields and wrongly typed values raise google.protobuf.json_format.ParseError."""
    from google.protobuf import json_format

    raw = request_type.pb(request_type())
    json_format.ParseDict(body, raw, ignore_unknown_fields=False)
    return request_type.wrap(raw)


class DataflowApi:
    """Dataflow's REST API (v1b3) at the protocol level, served on `rest`: `flexTemplates:launch`,
    its body parsed strictly into `dataflow_v1beta3.LaunchFlexTemplateRequest` (refused with a
    400, as Dataflow answers, when it does not parse) and answered with a new job; `jobs.get`
    answered with that job in the states of `states`, one a poll (the last one repeated), each
    response a valid `dataflow_v1beta3.Job`. `launched` keeps the parsed requests, `polled` the
    job IDs polled, `refused` why a request was refused."""

    LAUNCH = r"/v1b3/projects/([^/]+)/locations/([^/]+)/flexTemplates:launch"
    JOB = r"/v1b3/projects/([^/]+)/locations/([^/]+)/jobs/([^/]+)"

    def __init__(
        self,
        rest: RestFake,
        states: tuple[str, ...] = ("JOB_STATE_QUEUED", "JOB_STATE_RUNNING", "JOB_STATE_DONE"),
    ) -> None:
        self.rest = rest
        self.states = states
        self.launched: list[Any] = []
        self.polled: list[str] = []
        self.refused: list[str] = []
        self._polls: dict[str, int] = {}
        rest.route("POST", self.LAUNCH, self._launch)
        rest.route("GET", self.JOB, self._get)

    @staticmethod
    def job_id(n: int) -> str:
        return f"2026-12-01_06_00_00-{4200 + n}"

    def _launch(self, match: Any, _query: Any, body: Any) -> tuple[int, Any]:
        from google.cloud import dataflow_v1beta3
        from google.protobuf import json_format

        try:
            request = strict_json(
                dataflow_v1beta3.LaunchFlexTemplateRequest,
                {**body, "project_id": match.group(1), "location": match.group(2)},
            )
        except (json_format.ParseError, TypeError, AttributeError) as err:
            self.refused.append(f"LaunchFlexTemplateRequest: {err}")
            return 400, {"error": {"code": 400, "message": str(err), "status": "INVALID_ARGUMENT"}}
        self.launched.append(request)
        job = self.job_id(len(self.launched))
        self._polls[job] = 0
        return 200, {"job": {"id": job, "projectId": match.group(1), "location": match.group(2)}}

    def _get(self, match: Any, _query: Any, _body: Any) -> tuple[int, Any]:
        from google.cloud import dataflow_v1beta3

        job_id = match.group(3)
        if job_id not in self._polls:
            return 404, {"error": {"code": 404, "message": f"no job {job_id}", "status": "NOT_FOUND"}}
        self.polled.append(job_id)
        state = self.states[min(self._polls[job_id], len(self.states) - 1)]
        self._polls[job_id] += 1
        job = {"id": job_id, "projectId": match.group(1), "location": match.group(2), "currentState": state}
        strict_json(dataflow_v1beta3.Job, job)
        return 200, job

    def reset(self) -> None:
        self.launched.clear()
        self.polled.clear()
        self.refused.clear()

    @staticmethod
    def point_gcpc_launchers(monkeypatch: Any, address: str, endpoints: list[str] | None = None) -> None:
        """GCPC 2.22's Dataflow launchers, in this process, sent to the fake at `address` where
        they name Dataflow's host: the flex-template launcher's HTTP session (its URL is fixed in
        `container/preview/dataflow/flex_template/remote_runner.py`), and the wait launcher's
        discovery client (`discovery.build("dataflow", "v1b3")` in
        `container/v1/wait_gcp_resources/remote_runner.py`: the discovery document
        google-api-python-client ships, its root moved to the fake by `api_endpoint`), its
        20 s polling sleep made 0. Each call's Google host is appended to `endpoints`. Credentials
        are the caller's (google.auth.default)."""
        import googleapiclient.discovery
        import requests
        from google_cloud_pipeline_components.container.preview.dataflow.flex_template import (
            remote_runner as flex_runner,
        )
        from google_cloud_pipeline_components.container.v1.wait_gcp_resources import (
            remote_runner as wait_runner,
        )

        seen = endpoints if endpoints is not None else []
        host = "https://dataflow.googleapis.com/"

        class Session(requests.Session):
            def post(self, url: Any, data: Any = None, **kwargs: Any) -> Any:
                assert str(url).startswith(host), f"the launcher called {url}, not Dataflow"
                assert kwargs["headers"]["Authorization"].startswith("Bearer "), "no bearer token"
                seen.append("dataflow.googleapis.com")
                return super().post(f"http://{address}/{str(url)[len(host) :]}", data=data, **kwargs)

        build = googleapiclient.discovery.build

        def discovery_build(service: str, version: str, **kwargs: Any) -> Any:
            assert (service, version) == ("dataflow", "v1b3"), (service, version)
            client = build(service, version, **kwargs)
            assert client._baseUrl == host, client._baseUrl  # where it would have gone
            seen.append("dataflow.googleapis.com")
            return build(service, version, client_options={"api_endpoint": f"http://{address}/"}, **kwargs)

        monkeypatch.setattr(
            flex_runner.DataflowFlexTemplateRemoteRunner, "_get_session", lambda self: Session()
        )
        monkeypatch.setattr(wait_runner.discovery, "build", discovery_build)
        monkeypatch.setattr(wait_runner, "_POLLING_INTERVAL_IN_SECONDS", 0)
