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
            413 over MAX_BODY_BYTES; 503 while the model loads; 500 when the model fails
            (details in the server's log, never a traceback to the client)
  health    GET $AIP_HEALTH_ROUTE: 503 until the model is loaded, then 200

Vertex's contract, from https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements:
the server listens on 0.0.0.0:$AIP_HTTP_PORT (default 8080, the first of containerSpec.ports)
and runs in the foreground. Vertex probes liveness by opening a TCP connection to that port (4
tries, 10 s apart, then it restarts the container), so the port is bound first and the model
loaded afterwards; the health route answers 200 only once the model is loaded and ready to
take traffic, which is what Vertex's default health check takes a 200 to mean. Vertex copies
the Model's artifact_uri to $AIP_STORAGE_URI (a gs:// URI, which TensorFlow reads natively; the
SDK's local runs, google.cloud.aiplatform.docker_utils.run, pass a gs:// URI or a mounted folder).
The body is the Predict request's, {"instances": [...], "parameters": ...}, and the answer's
"predictions" become the Predict response's (https://cloud.google.com/vertex-ai/docs/reference/rest/v1/PredictResponse;
https://cloud.google.com/vertex-ai/docs/predictions/get-online-predictions for the "parameters"
field of custom containers). AIP_HEALTH_ROUTE and AIP_PREDICT_ROUTE may be the same path (the
ModelContainerSpec reference gives both the same default): health is the GET, prediction the
POST. Payload limits are Vertex's: 1.5 MB on a shared public endpoint, 10 MB on dedicated public
and private ones (https://cloud.google.com/vertex-ai/docs/predictions/choose-endpoint-type);
this server takes up to 10 MB.

Why not TensorFlow Serving, the server the prebuilt images run: tensorflow_model_server is a
separate C++ binary released on its own schedule, installed from TensorFlow's apt repository or
its own Docker images, not from PyPI, so it cannot be pinned by uv.lock with the trainer's
TensorFlow, and it cannot be installed or run where this project is built and tested. This
server runs on the TensorFlow the trainer exported with (one `serving_default`, loaded once,
each request's instances run as one batch), through the same code as `python -m trainer.serve`,
and is tested here as a real process.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from trainer.serve import SERVING_INPUT, Prediction, ServingError

DEFAULT_PORT = 8080
# What Vertex's local runs use when no routes are given (google.cloud.aiplatform.constants.prediction).
DEFAULT_HEALTH_ROUTE = "/health"
DEFAULT_PREDICT_ROUTE = "/predict"
# The largest request body any Vertex endpoint type forwards.
MAX_BODY_BYTES = 10 * 1024 * 1024

log = logging.getLogger("trainer.server")

Predictor = Callable[[list[bytes]], list[Prediction]]


class BadRequest(ValueError):
    """The client's fault: answered 400 with the message."""


@dataclass(frozen=True)
class Routes:
    health: str
    predict: str


def routes_from_env(env: Mapping[str, str]) -> Routes:
    return Routes(
        health=env.get("AIP_HEALTH_ROUTE") or DEFAULT_HEALTH_ROUTE,
        predict=env.get("AIP_PREDICT_ROUTE") or DEFAULT_PREDICT_ROUTE,
    )


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
    that fails because images do not decode is a BadRequest naming them."""
    from trainer import serve

    tf = serve.import_tf()

    def undecodable(blobs: Sequence[bytes]) -> list[int]:
        bad = []
        for i, blob in enumerate(blobs):
            try:
                tf.io.decode_image(blob, channels=3, expand_animations=False)
            except (tf.errors.OpError, ValueError):
                bad.append(i)
        return bad

    def predict(blobs: list[bytes]) -> list[Prediction]:
        try:
            return serve.answer(served, blobs)
        except ServingError:
            bad = undecodable(blobs)  # only on failure: the happy path decodes once
            if bad:
                raise BadRequest(
                    f"instance{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))}: "
                    "not a decodable image (JPEG, PNG, GIF or BMP)"
                ) from None
            raise

    return predict


class PredictionServer(ThreadingHTTPServer):
    """The HTTP side. `predictor` is None until the model is loaded."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], routes: Routes, max_body: int = MAX_BODY_BYTES) -> None:
        super().__init__(address, Handler)
        self.routes = routes
        self.max_body = max_body
        self.predictor: Predictor | None = None


class Handler(BaseHTTPRequestHandler):
    server: PredictionServer
    protocol_version = "HTTP/1.1"  # keep-alive: every response has a Content-Length
    server_version = "trainer-server"
    sys_version = ""

    def _path(self) -> str:
        return str(getattr(self, "path", "")).split("?", 1)[0]  # unset when the request line is bad

    def _send(self, status: HTTPStatus, payload: Any) -> None:
        data = json.dumps(payload).encode()
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
        body = self.rfile.read(size)
        predictor = self.server.predictor
        if predictor is None:
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, "the model is still loading")
            return
        try:
            blobs = parse_instances(body)
            predictions = predictor(blobs)
        except BadRequest as err:
            self._error(HTTPStatus.BAD_REQUEST, str(err))
            return
        self._send(HTTPStatus.OK, {"predictions": predictions})

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
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args.model_dir:
        log.error(
            "no model: set AIP_STORAGE_URI (Vertex sets it to the Model's artifacts) or pass --model_dir"
        )
        return 2
    port_text = os.environ.get("AIP_HTTP_PORT") or str(DEFAULT_PORT)
    if not port_text.isdigit():
        log.error("AIP_HTTP_PORT=%r is not a port number", port_text)
        return 2
    routes = routes_from_env(os.environ)
    try:
        server = PredictionServer((args.host, int(port_text)), routes)
    except OSError as err:
        log.error("cannot listen on %s:%s: %s", args.host, port_text, err)
        return 1
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    log.info(
        "listening on %s:%s (health GET %s, predict POST %s); loading %s",
        args.host,
        port_text,
        routes.health,
        routes.predict,
        args.model_dir,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # Vertex stops containers with SIGTERM
    try:
        from trainer import serve

        started = time.monotonic()
        served = serve.load(args.model_dir)
        server.predictor = model_predictor(served)
        log.info("model loaded in %.1f s: ready", time.monotonic() - started)
        stop.wait()
        log.info("stopping")
        return 0
    except ServingError as err:
        log.error("%s", err)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
