"""The trainer's SavedModel behind Vertex AI's custom-container contract: `python -m trainer.server`.

The entry point of `Dockerfile.serving`, the serving image for when Vertex's prebuilt TensorFlow
prediction images (TensorFlow Serving; the newest, `tf2-cpu.2-15`/`tf2-gpu.2-15`, carries
TensorFlow 2.15) are no longer offered. It answers as the prebuilt container does for this
model, so clients need not change:

  request   POST $AIP_PREDICT_ROUTE  {"instances": [{"image_bytes": {"b64": "<JPEG/PNG>"}}, ...],
                                      "parameters": ...}   (a bare {"b64": ...} instance too;
                                      "parameters" is accepted and unused: the model has none)
  response  200 {"predictions": [{"probabilities": [...], "class_index": n, "class_name": "..."}]}
  errors    JSON {"error": "..."}: 400 naming what is wrong (and the instance's index); 404 other
            paths; 405 POST to health, GET to predict; 501 other methods; 411 no Content-Length;
            413 over MAX_BODY_BYTES; 408 a body that does not arrive within IDLE_TIMEOUT_SECONDS;
            503 while the model loads; 500 when the model fails (details in the server's log,
            never a traceback to the client)
  health    GET $AIP_HEALTH_ROUTE: 503 until the model is loaded and has answered once, then 200

The accelerator: a GPU deployment that served on the CPU would bill the GPU for nothing, so the
server refuses to start (exit 1, one line, before it ever answers 200) when the container was
handed NVIDIA GPUs (its `/dev/nvidia<N>` device nodes, which the GPU device plugin creates for
each GPU allocated to the container: GoogleCloudPlatform/container-engine-accelerators'
nvidia_gpu plugin, as on GKE) and TensorFlow sees none, whatever is configured. The container
variable SERVING_ACCELERATOR (`cpu` or `gpu`; absent or empty: `cpu`) states the expectation
where one sets it on the Model's containerSpec.env (the pipeline does not: a value from a
pipeline parameter inside the importer's metadata list is not known to be resolved by Vertex):
with `gpu` and no GPU visible the server refuses the same way; any other value exits 2, naming
the allowed ones; with `cpu` and a GPU visible it serves on the GPU and warns. At start it logs
the devices TensorFlow sees, then, after one warm-up prediction, the device the model ran on.

Vertex's contract, from https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements:
the server listens on 0.0.0.0:$AIP_HTTP_PORT (default 8080, the first of containerSpec.ports)
and runs in the foreground, indefinitely (a command that exits leaves a container that exits).
Vertex probes liveness by opening a TCP connection to that port (4 tries, 10 s apart, then it
restarts the container), so the port is bound first and the model loaded afterwards; the health
route answers 200 only once the model is loaded and ready to take traffic, which is what Vertex's
default health check takes a 200 to mean (ModelContainerSpec.healthRoute: Vertex "intermittently
sends GET requests to this path ... to check that the container is healthy",
https://cloud.google.com/vertex-ai/docs/reference/rest/v1/ModelContainerSpec). A server that
cannot serve (no model, a model without the signature, SERVING_ACCELERATOR=gpu on a machine
whose GPU TensorFlow cannot see) exits non-zero rather than answering 503 for ever: the
container never becomes healthy and the DeployModel operation fails with Vertex's own message,
e.g. "Model server exited unexpectedly" or "Model server never became ready"
(FailedPrecondition 400, as reported in https://github.com/googleapis/python-aiplatform/issues/4559
and https://github.com/GoogleCloudPlatform/vertex-ai-samples/issues/3485), the server's last
log line naming the cause in the model server logs the message links to.
Vertex copies the Model's artifact_uri to $AIP_STORAGE_URI (a gs:// URI, which TensorFlow reads
natively; the SDK's local runs, google.cloud.aiplatform.docker_utils.run, pass a gs:// URI or a
mounted folder). The body is the Predict request's, {"instances": [...], "parameters": ...},
and the answer's "predictions" become the Predict response's
(https://cloud.google.com/vertex-ai/docs/reference/rest/v1/PredictResponse;
https://cloud.google.com/vertex-ai/docs/predictions/get-online-predictions for the "parameters"
field of custom containers). AIP_HEALTH_ROUTE and AIP_PREDICT_ROUTE may be the same path (the
ModelContainerSpec reference gives both the same default): health is the GET, prediction the
POST. Payload limits are Vertex's: 1.5 MB on a shared public endpoint, 10 MB on dedicated public
and private ones (https://cloud.google.com/vertex-ai/docs/predictions/choose-endpoint-type);
this server takes up to 10 MB.

Under concurrent load (`make bench BENCH=serve`; docs/serving.md has the figures):
- one thread per connection, HTTP/1.1 keep-alive, each response written in one piece with
  Nagle's algorithm off (TCP_NODELAY): before, every kept-alive response waited about 40 ms for
  the client's delayed ACK (a stand-in model answered 23 requests/s on one connection, now
  thousands);
- a listen backlog of SOMAXCONN: socketserver's default of 5 reset most of a burst of 200
  connections opened at once;
- requests are read, parsed and predicted (each as one batch) in parallel within a budget of
  request bytes, `--inflight_mb` (default INFLIGHT_MB_PER_CPU per CPU), granted in order of
  arrival; a request larger than the whole budget runs alone. The others wait, unread, on their
  connection; health checks never wait. A request's encoded images stand for the work it brings
  (decoding is most of it) and the memory it takes: with 32 clients on 2 CPUs, a fixed bound of
  2 requests cut one-image throughput by about 40% against no bound, while no bound left
  32-image requests longer tails and the server more memory; the byte budget keeps both;
- an idle connection is closed after IDLE_TIMEOUT_SECONDS, longer than the 600 s for which
  Google's load balancers keep idle connections to their backends (so that the server is not the
  one closing a connection the proxy is about to reuse;
  https://cloud.google.com/load-balancing/docs/https/request-distribution; Vertex does not
  document its own proxy's); a body that stops arriving for that long is answered 408;
- on SIGTERM (Vertex stops containers with it) it stops accepting connections, finishes the
  predictions under way (at most DRAIN_SECONDS) and exits 0;
- one log line per prediction request, none per successful health check (turning the request
  lines off made no difference the benchmark could see).

Why not TensorFlow Serving, the server the prebuilt images run: tensorflow_model_server is a
separate C++ binary released on its own schedule, installed from TensorFlow's apt repository or
its own Docker images, not from PyPI, so it cannot be pinned by uv.lock with the trainer's
TensorFlow, and it cannot be installed or run where this project is built and tested. This
server runs on the TensorFlow the trainer exported with (one `serving_default`, loaded once),
through the same code as `python -m trainer.serve`, and is tested here as a real process.
What TensorFlow Serving offers that this server does not (request batching across clients,
gRPC, model version policies...): docs/serving.md.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import collections
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from trainer.serve import SERVING_INPUT, Prediction, ServingError

DEFAULT_PORT = 8080
# What Vertex's local runs use when no routes are given (google.cloud.aiplatform.constants.prediction).
DEFAULT_HEALTH_ROUTE = "/health"
DEFAULT_PREDICT_ROUTE = "/predict"
MB = 1024 * 1024
# The largest request body any Vertex endpoint type forwards.
MAX_BODY_BYTES = 10 * MB
ACCELERATOR_VARIABLE = "SERVING_ACCELERATOR"
ACCELERATORS = ("cpu", "gpu")
INFLIGHT_MB_PER_CPU = 1.0
IDLE_TIMEOUT_SECONDS = 620.0
DRAIN_SECONDS = 20.0

log = logging.getLogger("trainer.server")

Predictor = Callable[[list[bytes]], list[Prediction]]


class BadRequest(ValueError):
    """The client's fault: answered 400 with the message."""


class AcceleratorError(Exception):
    """SERVING_ACCELERATOR asks for what this machine does not have, or for nothing known."""


@dataclass(frozen=True)
class Routes:
    health: str
    predict: str


def routes_from_env(env: Mapping[str, str]) -> Routes:
    return Routes(
        health=env.get("AIP_HEALTH_ROUTE") or DEFAULT_HEALTH_ROUTE,
        predict=env.get("AIP_PREDICT_ROUTE") or DEFAULT_PREDICT_ROUTE,
    )


def accelerator_from_env(env: Mapping[str, str]) -> str:
    """`cpu` or `gpu` from SERVING_ACCELERATOR (absent or empty: `cpu`); AcceleratorError otherwise."""
    value = env.get(ACCELERATOR_VARIABLE, "")
    if value == "":
        return "cpu"
    if value not in ACCELERATORS:
        raise AcceleratorError(
            f"{ACCELERATOR_VARIABLE}={value!r} is not allowed: it must be {' or '.join(ACCELERATORS)} "
            "(absent: cpu)"
        )
    return value


def attached_gpus(dev: str = "/dev") -> list[str]:
    """The NVIDIA GPU device nodes this container was handed (`nvidia0`, `nvidia1`, ...; not
    `nvidiactl` or `nvidia-uvm`, which every GPU container has), without TensorFlow."""
    import re

    try:
        names = os.listdir(dev)
    except OSError:
        return []
    return sorted((n for n in names if re.fullmatch(r"nvidia\d+", n)), key=lambda n: int(n[6:]))


def check_devices(accelerator: str, device_names: Sequence[str], attached: Sequence[str] = ()) -> str | None:
    """Whether TensorFlow's physical devices (`/physical_device:GPU:0`...) fit `accelerator` and
    the GPUs the container was handed (`attached_gpus`): raises AcceleratorError for GPUs handed
    over that TensorFlow cannot see, and for a GPU deployment without a visible GPU; returns a
    warning for a CPU one with a GPU, None when they fit."""
    gpus = [name for name in device_names if ":GPU:" in name]
    if attached and not gpus:
        raise AcceleratorError(
            f"this container was handed {len(attached)} NVIDIA GPU(s) (/dev/{', /dev/'.join(attached)}) "
            f"but TensorFlow sees none (it sees: {', '.join(device_names) or 'nothing'}): refusing to "
            "serve on the CPU while the GPU is billed. The image's TensorFlow needs its CUDA libraries "
            "(uv.lock's gpu group) and the host's driver (libcuda.so.1; Dockerfile.serving says where)."
        )
    if accelerator == "gpu" and not gpus:
        raise AcceleratorError(
            f"{ACCELERATOR_VARIABLE}=gpu but TensorFlow sees no GPU (it sees: "
            f"{', '.join(device_names) or 'nothing'}): refusing to serve a GPU deployment on the CPU. "
            "Check the machine has a GPU (the deployment's accelerator_type and accelerator_count) "
            "and that the image's TensorFlow has its CUDA libraries; or register the model with "
            "serving_accelerator=cpu."
        )
    if accelerator == "cpu" and gpus:
        return (
            f"{ACCELERATOR_VARIABLE} is cpu (or unset) but TensorFlow sees {', '.join(gpus)}: "
            "the model will run on the GPU"
        )
    return None


def parse_instances(body: bytes) -> list[bytes]:
    """The encoded images of a request body, or BadRequest saying what is wrong."""
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BadRequest(f"the request body is not JSON: {err}") from None
    if not isinstance(payload, dict) or "instances" not in payload:
        raise BadRequest('the request body must be a JSON object with an "instances" list')
    instances = payload["instances"]
    if not isinstance(instances, list) or not instances:
        raise BadRequest('"instances" must be a non-empty list')
    return [_instance_bytes(i, instance) for i, instance in enumerate(instances)]


def _instance_bytes(index: int, instance: Any) -> bytes:
    value = instance
    if isinstance(instance, dict) and SERVING_INPUT in instance:
        extra = sorted(set(instance) - {SERVING_INPUT})
        if extra:
            raise BadRequest(
                f"instance {index}: unknown keys {extra}; the model's only input is {SERVING_INPUT!r}"
            )
        value = instance[SERVING_INPUT]
    if not (isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str)):
        raise BadRequest(
            f'instance {index}: expected {{"{SERVING_INPUT}": {{"b64": "<base64 JPEG or PNG>"}}}} '
            f'or {{"b64": "<base64 JPEG or PNG>"}}'
        )
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError) as err:
        raise BadRequest(f"instance {index}: b64 is not valid base64 ({err})") from None


def model_predictor(served: Any) -> Predictor:
    """Predictions from a `trainer.serve.load`ed model, a request's images in one batch. A batch
    the model refuses is a BadRequest: over MAX_INSTANCES images, or naming the images it refuses
    one by one (not JPEG or PNG, over the pixel limit, undecodable: trainer.export's guards)."""
    from trainer import serve

    def refused(blobs: Sequence[bytes]) -> list[int]:
        bad = []
        for i, blob in enumerate(blobs):
            try:
                serve.answer(served, [blob])
            except ServingError:
                bad.append(i)
        return bad

    def predict(blobs: list[bytes]) -> list[Prediction]:
        if len(blobs) > serve.MAX_INSTANCES:
            raise BadRequest(
                f"{len(blobs)} instances: the model takes at most {serve.MAX_INSTANCES} a request"
            )
        try:
            return serve.answer(served, blobs)
        except ServingError:
            bad = refused(blobs)  # only on failure: the happy path predicts once
            if bad:
                raise BadRequest(
                    f"instance{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))}: "
                    "not a JPEG or PNG image of at most the model's pixel limit that decodes"
                ) from None
            raise

    return predict


def warm_up(served: Any) -> tuple[str, float]:
    """One prediction on a synthetic JPEG (the first call of a signature is its slowest): the
    device its probabilities were computed on, and the call's seconds."""
    from trainer import serve

    tf = serve.import_tf()
    _, blobs = serve.synthetic_images()
    started = time.monotonic()
    try:
        out = served.signature(**{SERVING_INPUT: tf.constant(blobs[:1], dtype=tf.string)})
        device = str(out["probabilities"].device)
        out["probabilities"].numpy()
    except (tf.errors.OpError, ValueError, TypeError) as err:
        raise ServingError(f"the model failed its warm-up prediction: {err}") from None
    return device, time.monotonic() - started


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_inflight_bytes() -> int:
    return int(INFLIGHT_MB_PER_CPU * MB * usable_cpus())


class Budget:
    """At most `limit` units claimed at once, granted in order of arrival; a claim over the
    limit waits for everything and takes it all."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a budget must be at least 1, got {limit}")
        self.limit = limit
        self.used = 0
        self._changed = threading.Condition()
        self._queue: collections.deque[object] = collections.deque()

    @contextlib.contextmanager
    def claim(self, units: int) -> Iterator[None]:
        units = max(1, min(units, self.limit))
        ticket = object()
        with self._changed:
            self._queue.append(ticket)
            while self._queue[0] is not ticket or self.used + units > self.limit:
                self._changed.wait()
            self._queue.popleft()
            self.used += units
            self._changed.notify_all()  # the next in line may fit too
        try:
            yield
        finally:
            with self._changed:
                self.used -= units
                self._changed.notify_all()


class PredictionServer(ThreadingHTTPServer):
    """The HTTP side. `predictor` is None until the model is loaded (and warmed up)."""

    daemon_threads = True
    # The listen backlog: socketserver's default of 5 drops the connections of a burst of new
    # clients beyond it (they retry after a second).
    request_queue_size = socket.SOMAXCONN

    def __init__(
        self,
        address: tuple[str, int],
        routes: Routes,
        max_body: int = MAX_BODY_BYTES,
        inflight_bytes: int | None = None,
    ) -> None:
        super().__init__(address, Handler)
        self.routes = routes
        self.max_body = max_body
        self.predictor: Predictor | None = None
        self.budget = Budget(inflight_bytes or default_inflight_bytes())
        self._busy = threading.Condition()
        self._in_flight = 0
        self.draining = False

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        with self._busy:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._busy:
                self._in_flight -= 1
                self._busy.notify_all()

    def drain(self, timeout: float = DRAIN_SECONDS) -> int:
        """Stops accepting connections and waits up to `timeout` for the predictions under way
        (kept-alive connections are closed after their answer); the number still under way."""
        self.draining = True
        self.shutdown()  # no more accept(); the connections' threads go on
        deadline = time.monotonic() + timeout
        with self._busy:
            while self._in_flight and (left := deadline - time.monotonic()) > 0:
                self._busy.wait(left)
            return self._in_flight


class Handler(BaseHTTPRequestHandler):
    server: PredictionServer
    protocol_version = "HTTP/1.1"  # keep-alive: every response has a Content-Length
    server_version = "trainer-server"
    sys_version = ""
    # A response is written whole (headers and body, one buffered write flushed after each
    # request) and sent at once: with Nagle's algorithm on, a kept-alive response's last segment
    # waited for the client's delayed ACK (about 40 ms on Linux).
    wbufsize = 64 * 1024
    disable_nagle_algorithm = True
    timeout = IDLE_TIMEOUT_SECONDS

    def _path(self) -> str:
        return str(getattr(self, "path", "")).split("?", 1)[0]  # unset when the request line is bad

    def _send(self, status: HTTPStatus, payload: Any) -> None:
        data = json.dumps(payload).encode()
        if self.server.draining:
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._send(status, {"error": message})

    def _not_here(self, method: str) -> None:
        """Answers a request to a path or with a method that is not served (body unread)."""
        self.close_connection = True
        path, routes = self._path(), self.server.routes
        allowed = [m for m, route in (("GET", routes.health), ("POST", routes.predict)) if route == path]
        if allowed:
            self._error(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} {path}: only {' and '.join(allowed)}")
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no route {path}")

    def do_GET(self) -> None:
        if self._path() != self.server.routes.health:
            self._not_here("GET")
        elif self.server.predictor is None:
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, "the model is still loading")
        else:
            self._send(HTTPStatus.OK, {})

    def do_POST(self) -> None:
        if self._path() != self.server.routes.predict:
            self._not_here("POST")
            return
        with self.server.in_flight():
            try:
                self._predict()
            except Exception:
                # Whatever went wrong, the client gets a JSON 500; the traceback goes to the log.
                log.exception("prediction failed")
                self.close_connection = True
                self._error(
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    "internal error: the model failed to answer (see the server log)",
                )

    def _predict(self) -> None:
        length = self.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            self.close_connection = True
            self._error(HTTPStatus.LENGTH_REQUIRED, "a Content-Length header is required")
            return
        size = int(length)
        if size > self.server.max_body:
            self.close_connection = True
            self._error(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"the request body has {size} bytes; at most {self.server.max_body} are accepted",
            )
            return
        # The body is read once the budget has room for it: the other clients wait on their
        # connection, in order of arrival.
        with self.server.budget.claim(size):
            try:
                body = self.rfile.read(size)
            except TimeoutError:
                self.close_connection = True
                self._error(
                    HTTPStatus.REQUEST_TIMEOUT,
                    f"the request body did not arrive within {self.timeout:g} s",
                )
                return
            if len(body) < size:  # the client went away mid-body: nobody to answer
                self.close_connection = True
                return
            predictor = self.server.predictor
            payload: dict[str, Any]
            if predictor is None:
                status, payload = HTTPStatus.SERVICE_UNAVAILABLE, {"error": "the model is still loading"}
            else:
                try:
                    status, payload = HTTPStatus.OK, {"predictions": predictor(parse_instances(body))}
                except BadRequest as err:
                    status, payload = HTTPStatus.BAD_REQUEST, {"error": str(err)}
        self._send(status, payload)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's own errors (a malformed request line, an unknown method...) as JSON too."""
        self.close_connection = True
        self.log_error("code %d, message %s", code, message)
        try:
            status = HTTPStatus(code)
        except ValueError:
            status = HTTPStatus.BAD_REQUEST
        self._error(status, message or status.phrase)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # Health checks come every few seconds: only their failures are logged.
        if self._path() != self.server.routes.health or code != HTTPStatus.OK:
            super().log_request(code, size)

    def log_message(self, format: str, *args: Any) -> None:
        log.info("%s %s", self.address_string(), format % args)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.server", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model_dir",
        default=os.environ.get("AIP_STORAGE_URI", ""),
        help="The SavedModel folder (local, gs:// or /gcs/). Default: $AIP_STORAGE_URI.",
    )
    p.add_argument(
        "--host", default="0.0.0.0", help="The address to listen on (default: all, as Vertex needs)."
    )
    p.add_argument(
        "--inflight_mb",
        type=float,
        default=None,
        help="Megabytes of request bodies read, parsed and predicted at once; the other requests "
        f"wait (default: {INFLIGHT_MB_PER_CPU:g} per CPU, {default_inflight_bytes() / MB:g} here).",
    )
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args.model_dir:
        log.error(
            "no model: set AIP_STORAGE_URI (Vertex sets it to the Model's artifacts) or pass --model_dir"
        )
        return 2
    if args.inflight_mb is not None and not args.inflight_mb > 0:
        log.error("--inflight_mb must be a positive number of megabytes, got %s", args.inflight_mb)
        return 2
    port_text = os.environ.get("AIP_HTTP_PORT") or str(DEFAULT_PORT)
    if not port_text.isdigit():
        log.error("AIP_HTTP_PORT=%r is not a port number", port_text)
        return 2
    try:
        accelerator = accelerator_from_env(os.environ)
    except AcceleratorError as err:
        log.error("%s", err)
        return 2
    routes = routes_from_env(os.environ)
    try:
        server = PredictionServer(
            (args.host, int(port_text)),
            routes,
            inflight_bytes=None if args.inflight_mb is None else max(1, int(args.inflight_mb * MB)),
        )
    except OSError as err:
        log.error("cannot listen on %s:%s: %s", args.host, port_text, err)
        return 1
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    log.info(
        "listening on %s:%s (health GET %s, predict POST %s); %s=%s; loading %s",
        args.host,
        port_text,
        routes.health,
        routes.predict,
        ACCELERATOR_VARIABLE,
        accelerator,
        args.model_dir,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # Vertex stops containers with SIGTERM
    try:
        from trainer import serve

        started = time.monotonic()
        tf = serve.import_tf()
        devices = [d.name for d in tf.config.list_physical_devices()]
        log.info("TensorFlow %s sees: %s", tf.__version__, ", ".join(devices) or "no device")
        attached = attached_gpus()
        if attached:
            log.info("GPU device nodes handed to this container: %s", ", ".join(attached))
        warning = check_devices(accelerator, devices, attached)
        if warning:
            log.warning("%s", warning)
        served = serve.load(args.model_dir)
        device, seconds = warm_up(served)
        server.predictor = model_predictor(served)
        log.info(
            "model loaded in %.1f s; it runs on %s (warm-up prediction %.0f ms); ready",
            time.monotonic() - started,
            device,
            seconds * 1000,
        )
        stop.wait()
        log.info("stopping: finishing the predictions under way")
        left = server.drain()
        if left:
            log.warning("%d prediction(s) still under way after %.0f s; exiting", left, DRAIN_SECONDS)
        return 0
    except (ServingError, AcceleratorError) as err:
        log.error("%s", err)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
