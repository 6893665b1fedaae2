"""Serving the published SavedModel.

- Under TensorFlow 2.15, the TensorFlow of Vertex's newest prebuilt prediction image, as under the
  trainer's own: `python -m trainer.serve` from `local.servingenv.python_for("2.15")` (slow).
- `python -m trainer.server`, the custom serving image's server, on Vertex's custom-container
  contract: request parsing and HTTP behaviour in-process with a stand-in model (fast; its
  behaviour under load and SERVING_ACCELERATOR in tests/trainer/test_server_load.py), then as a
  real process on an exported model, with SERVING_ACCELERATOR=cpu, and refusing to start with
  SERVING_ACCELERATOR=gpu on a machine where TensorFlow sees no GPU (slow).
"""

from __future__ import annotations

import ast
import base64
import contextlib
import http.client
import io
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from local import servingenv
from tests.processes import ROOT, free_port, trainer_env
from trainer import serve, server, synthetic
from trainer.config import TrainConfig

CLASSES = list(synthetic.CASSAVA_CLASSES)

# --- the check's imports ------------------------------------------------------------------------


def module_imports(path: Path, *, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def test_the_check_imports_tensorflow_and_numpy_but_nothing_that_needs_tf_keras() -> None:
    """Under the serving environment there is no tf_keras: trainer.serve may import, at any
    depth, only trainer.synthetic of the trainer, and that module only numpy at its top."""
    used = module_imports(ROOT / "trainer" / "serve.py", top_level_only=False)
    assert {name for name in used if name.startswith("trainer")} <= {"trainer", "trainer.synthetic"}, used
    assert "tf_keras" not in used
    top = module_imports(ROOT / "trainer" / "synthetic.py", top_level_only=True)
    assert not {name for name in top if name.startswith(("trainer", "tf_keras", "tensorflow"))}, (
        f"trainer/synthetic.py imports {sorted(top)} at its top: trainer.serve makes its images "
        "under a TensorFlow without tf_keras, so TensorFlow may only be imported inside write_archive"
    )


def test_serving_input_and_path_rules_match_the_trainers() -> None:
    from trainer import export, storage

    assert serve.SERVING_INPUT == export.SERVING_INPUT and serve.SERVING_INPUT.endswith("_bytes")
    for path in ("/gcs/bucket/model", "gs://bucket/model", "/tmp/model", "relative/model"):
        assert serve.resolve(path) == storage.resolve(path)


# --- request parsing ------------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def body(payload: Any) -> bytes:
    return json.dumps(payload).encode()


def test_instances_in_the_prebuilt_containers_form_and_bare() -> None:
    instances = [{"image_bytes": {"b64": b64(b"one")}}, {"b64": b64(b"two")}]
    assert server.parse_instances(body({"instances": instances, "parameters": {"x": 1}})) == [b"one", b"two"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (body([1, 2]), '"instances" list'),
        (body({"instance": []}), '"instances" list'),
        (body({"instances": []}), "non-empty list"),
        (body({"instances": {"b64": "AA=="}}), "non-empty list"),
        (body({"instances": [{"b64": "AA=="}, "AA=="]}), "instance 1: expected"),
        (body({"instances": [{"image_bytes": "AA=="}]}), "instance 0: expected"),
        (body({"instances": [{"image_bytes": {"b64": 5}}]}), "instance 0: expected"),
        (
            body({"instances": [{"image_bytes": {"b64": "AA=="}, "key": 1}]}),
            "instance 0: unknown keys ['key']",
        ),
        (
            body({"instances": [{"b64": "AA=="}, {"b64": "not base64!"}]}),
            "instance 1: b64 is not valid base64",
        ),
    ],
)
def test_bad_requests_say_what_is_wrong(raw: bytes, message: str) -> None:
    with pytest.raises(server.BadRequest, match=message.replace("[", r"\[").replace("]", r"\]")):
        server.parse_instances(raw)


# --- HTTP behaviour, in-process with a stand-in model --------------------------------------------


def call(
    port: int, method: str, path: str, payload: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, body=payload, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        assert response.getheader("Content-Type") == "application/json", data
        return response.status, json.loads(data)
    finally:
        conn.close()


def fake_predictor(blobs: list[bytes]) -> list[dict[str, Any]]:
    if b"crash" in blobs:
        raise RuntimeError("the model broke")
    if b"bad" in blobs:
        raise server.BadRequest(f"instance {blobs.index(b'bad')}: not a decodable image")
    return [{"probabilities": [1.0], "class_index": 0, "class_name": blob.decode()} for blob in blobs]


@pytest.fixture
def local_server(request: pytest.FixtureRequest) -> Iterator[server.PredictionServer]:
    routes = getattr(request, "param", server.Routes(health="/h", predict="/p"))
    srv = server.PredictionServer(("127.0.0.1", 0), routes, max_body=1000)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def test_health_is_503_until_the_model_is_there_then_200(local_server: server.PredictionServer) -> None:
    port = local_server.server_address[1]
    assert call(port, "GET", "/h") == (503, {"error": "the model is still loading"})
    request = body({"instances": [{"b64": b64(b"x")}]})
    assert call(port, "POST", "/p", request)[0] == 503
    local_server.predictor = fake_predictor
    assert call(port, "GET", "/h") == (200, {})
    assert call(port, "POST", "/p", request) == (
        200,
        {"predictions": [{"probabilities": [1.0], "class_index": 0, "class_name": "x"}]},
    )


def test_errors_are_json_with_the_right_status(local_server: server.PredictionServer) -> None:
    port = local_server.server_address[1]
    local_server.predictor = fake_predictor
    status, answer = call(port, "POST", "/p", b"{")
    assert status == 400 and "not JSON" in answer["error"]
    status, answer = call(
        port, "POST", "/p", body({"instances": [{"b64": b64(b"ok")}, {"b64": b64(b"bad")}]})
    )
    assert (status, answer) == (400, {"error": "instance 1: not a decodable image"})
    status, answer = call(port, "POST", "/p", body({"instances": [{"b64": b64(b"crash")}]}))
    assert status == 500 and "Traceback" not in answer["error"] and "broke" not in answer["error"]
    assert call(port, "GET", "/other")[0] == 404
    assert call(port, "POST", "/other", b"{}")[0] == 404
    assert call(port, "GET", "/p") == (405, {"error": "GET /p: only POST"})
    assert call(port, "POST", "/h", b"{}") == (405, {"error": "POST /h: only GET"})
    assert call(port, "PUT", "/p", b"{}")[0] == 501
    status, answer = call(port, "POST", "/p", b"{}", headers={"Content-Length": "5000"})
    assert status == 413 and "5000 bytes" in answer["error"]
    # The server still answers after all of that.
    assert call(port, "GET", "/h") == (200, {})


@pytest.mark.parametrize(
    "local_server",
    [
        server.Routes(
            health="/v1/endpoints/e/deployedModels/d:predict",
            predict="/v1/endpoints/e/deployedModels/d:predict",
        )
    ],
    indirect=True,
)
def test_health_and_predict_may_share_a_route(local_server: server.PredictionServer) -> None:
    """The API reference gives both routes the same default: GET is health, POST predict."""
    port, route = local_server.server_address[1], local_server.routes.predict
    local_server.predictor = fake_predictor
    assert call(port, "GET", route) == (200, {})
    assert call(port, "POST", route, body({"instances": [{"b64": b64(b"a")}]}))[0] == 200
    assert call(port, "DELETE", route)[0] == 501


def test_routes_and_defaults_come_from_vertexs_variables() -> None:
    assert server.routes_from_env({}) == server.Routes("/health", "/predict")
    env = {"AIP_HEALTH_ROUTE": "/x", "AIP_PREDICT_ROUTE": "/y"}
    assert server.routes_from_env(env) == server.Routes("/x", "/y")
    assert server.DEFAULT_PORT == 8080


# --- the serving environments (uv; no TensorFlow) ---------------------------------------------


@pytest.fixture
def empty_env_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    """A version whose environment installs nothing: made by uv in well under a second."""
    monkeypatch.setitem(servingenv.PINS, "0.0", ())


@pytest.mark.serial  # timed: beside one other serial test at most (make test)
def test_environment_is_made_once_and_then_reused(
    empty_env_pins: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    python = servingenv.python_for("0.0", out=sys.stdout, cache_dir=tmp_path)
    assert python == tmp_path / "serving-tf-0.0" / "bin" / "python"
    assert capsys.readouterr().out.count("making the TensorFlow 0.0 serving environment") == 1
    version = subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True)
    assert version.stdout.strip() == str(tmp_path / "serving-tf-0.0")  # a venv, usable after the rename
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []

    def no_uv() -> Path:
        raise AssertionError("a ready environment must not run uv")

    monkeypatch.setattr(servingenv, "find_uv", no_uv)
    started = time.monotonic()
    assert servingenv.python_for("0.0", out=sys.stdout, cache_dir=tmp_path) == python
    assert time.monotonic() - started < 0.5
    assert capsys.readouterr().out == ""


def test_changed_pins_rebuild_the_environment(
    empty_env_pins: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    python = servingenv.python_for("0.0", out=sys.stdout, cache_dir=tmp_path)
    (python.parent.parent / "marker").write_text("old")
    stamp = json.loads((python.parent.parent / servingenv.STAMP).read_text())
    assert stamp == {"python": servingenv.PYTHON, "requirements": []}
    # Same pins, another stamp (as after a change of PINS): the folder is made anew.
    (python.parent.parent / servingenv.STAMP).write_text("{}")
    capsys.readouterr()
    assert servingenv.python_for("0.0", out=sys.stdout, cache_dir=tmp_path) == python
    assert "making" in capsys.readouterr().out
    assert not (python.parent.parent / "marker").exists()


def test_concurrent_callers_make_it_once(empty_env_pins: None, tmp_path: Path) -> None:
    import io

    outs = [io.StringIO() for _ in range(3)]
    threads = [
        threading.Thread(target=servingenv.python_for, args=("0.0", out), kwargs={"cache_dir": tmp_path})
        for out in outs
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum("making" in out.getvalue() for out in outs) == 1
    assert (tmp_path / "serving-tf-0.0" / "bin" / "python").exists()


def test_missing_uv_and_failed_installs_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(
        ValueError, match=r"no serving environment is defined for TensorFlow '9.9'; known: 2.15"
    ):
        servingenv.python_for("9.9", cache_dir=tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(
        servingenv.ServingEnvError, match=r"uv .* found neither on PATH nor at .*home/.local/bin/uv"
    ):
        servingenv.python_for("2.15", cache_dir=tmp_path / "a")
    monkeypatch.undo()
    # An install that cannot succeed (offline, a version that does not exist): uv's reason is shown.
    monkeypatch.setitem(servingenv.PINS, "0.1", ("tensorflow-cpu==0.0.0",))
    monkeypatch.setenv("UV_OFFLINE", "1")
    with pytest.raises(
        servingenv.ServingEnvError, match=r"installing tensorflow-cpu==0.0.0 with .*uv failed"
    ):
        servingenv.python_for("0.1", out=sys.stdout, cache_dir=tmp_path / "b")
    assert not (tmp_path / "b" / "serving-tf-0.1").exists()
    assert [p.name for p in (tmp_path / "b").iterdir() if ".tmp-" in p.name] == []


# --- models exported by the trainer, for the slow tests ----------------------------------------

TINY = TrainConfig(
    data_dir="/d",
    model_dir="/m",
    checkpoint_dir="/c",
    tensorboard_dir="/l",
    backbone="tiny",
    weights="none",
    image_size=32,
    dense_units=16,
    dropout=0.0,
    fine_tune_fraction=1.0,
)


def export_model(config: TrainConfig, path: Path, policy: str = "float32") -> Path:
    """Builds (untrained: the answers need not be right, only equal) and exports as the chief does."""
    from trainer import export
    from trainer import model as model_lib
    from trainer._tf import keras

    keras.mixed_precision.set_global_policy(policy)
    try:
        model = model_lib.build_model(config, num_classes=len(CLASSES), input_size=config.image_size)
        export.save(model, str(path), CLASSES, config.image_size)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return path


def export_without_signature(path: Path) -> Path:
    from trainer._tf import tf

    module = tf.Module()
    module.w = tf.Variable(1.0)
    tf.saved_model.save(module, str(path))
    return path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_model(TINY, tmp_path_factory.mktemp("serving") / "tiny")


def real_png(side: int) -> bytes:
    """A decodable all-black PNG of side x side pixels, compressed a row at a time."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    z, row = zlib.compressobj(1), b"\0" * (1 + 3 * side)
    idat = b"".join(z.compress(row) for _ in range(side)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def test_the_signature_refuses_pixel_bombs_other_formats_and_oversized_requests(tiny_model: Path) -> None:
    """trainer.export's guards, in the graph: they hold under any server."""
    from PIL import Image

    from trainer._tf import tf
    from trainer.folders import MAX_IMAGE_PIXELS

    served = serve.load(str(tiny_model))
    ok = tf.io.encode_jpeg(synthetic.make_image(np.random.default_rng(0), CLASSES[0], 64)).numpy()
    side = int(MAX_IMAGE_PIXELS**0.5)
    assert len(serve.answer(served, [ok, real_png(64)])) == 2
    assert len(serve.answer(served, [ok] * serve.MAX_INSTANCES)) == serve.MAX_INSTANCES
    gif = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(gif, "GIF")  # which TensorFlow decodes
    refused = {
        # Decodable, one pixel row over the limit (201 MB decoded): refused from its IHDR.
        "png over the limit": [real_png(side + 1)],
        "not JPEG or PNG": [gif.getvalue()],
        "too many images": [ok] * (serve.MAX_INSTANCES + 1),
    }
    for name, blobs in refused.items():
        with pytest.raises(serve.ServingError):
            serve.answer(served, blobs)
            pytest.fail(name)


# --- TensorFlow 2.15 ---------------------------------------------------------------------------


def check_lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@pytest.mark.serial
def test_models_exported_here_serve_under_tensorflow_2_15(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    python = servingenv.python_for("2.15")
    env_seconds = time.monotonic() - started
    probe = "import importlib.metadata as m, importlib.util as u; print(m.version('tensorflow-cpu'), u.find_spec('tf_keras') is not None)"
    versions = subprocess.run(
        [python, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
    )
    assert versions.stdout.split() == ["2.15.1", "False"], versions.stdout  # and no tf_keras there

    def check(path: Path, *images: Path) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [python, "-m", "trainer.serve", "--model_dir", str(path), *(f"--image={i}" for i in images)],
            cwd=ROOT,
            env=trainer_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    # Each check runs while the next model is exported (most of a check is importing TensorFlow).
    models = {"tiny": tiny_model, "no-signature": export_without_signature(tmp_path / "no-signature")}
    procs = {name: check(path) for name, path in models.items()}
    bomb = tmp_path / "over-the-pixel-limit.png"
    bomb.write_bytes(real_png(8193))  # decodable: only the model's guard refuses it
    procs["tiny-bomb"] = check(tiny_model, bomb)
    resnet = replace(TINY, backbone="resnet50", dense_units=0)
    for name, policy in (("resnet50-float32", "float32"), ("resnet50-mixed_float16", "mixed_float16")):
        models[name] = export_model(resnet, tmp_path / name, policy)
        procs[name] = check(models[name])
    exported = time.monotonic()
    # The same SavedModels under the trainer's TensorFlow, through the same check, meanwhile.
    references = {}
    for name in ("tiny", "resnet50-float32", "resnet50-mixed_float16"):
        capsys.readouterr()
        assert serve.main(["--model_dir", str(models[name])]) == 0
        references[name] = check_lines(capsys.readouterr().out)
    results = {name: (*proc.communicate(timeout=300), proc.returncode) for name, proc in procs.items()}
    served = time.monotonic()

    stdout, stderr, code = results.pop("tiny-bomb")
    assert code == 1 and stdout == "", stdout  # the guards hold under TensorFlow 2.15 too
    stdout, stderr, code = results.pop("no-signature")
    assert code == 1 and stdout == "", stdout
    assert "has no 'serving_default' signature" in stderr, stderr

    for name, (stdout, stderr, code) in results.items():
        assert code == 0, f"{name} does not serve under TensorFlow 2.15:\n{stderr[-3000:]}"
        answers, reference = check_lines(stdout), references[name]
        assert [a["image"] for a in answers] == [f"synthetic:{c}" for c in CLASSES], name
        for a in answers:
            assert a["class_name"] in CLASSES and a["class_name"] == CLASSES[a["class_index"]]
            assert len(a["probabilities"]) == len(CLASSES) and sum(a["probabilities"]) == pytest.approx(
                1, abs=1e-4
            )
            assert int(np.argmax(a["probabilities"])) == a["class_index"]
        assert [a["image"] for a in reference] == [a["image"] for a in answers]
        # float16 arithmetic differs between TensorFlow versions' CPU kernels in the 3rd decimal.
        atol = 1e-2 if "mixed" in name else 1e-5
        np.testing.assert_allclose(
            [a["probabilities"] for a in answers],
            [a["probabilities"] for a in reference],
            atol=atol,
            err_msg=name,
        )
        if "mixed" not in name:
            assert [a["class_name"] for a in answers] == [a["class_name"] for a in reference], name
    print(
        f"\nserving env {env_seconds:.1f} s, exports (checks started) {exported - started - env_seconds:.1f} s, "
        f"references and the rest of the checks {served - exported:.1f} s"
    )


# --- trainer.server as a process ----------------------------------------------------------------

PREDICT_ROUTE = "/v1/endpoints/e/deployedModels/d:predict"
HEALTH_ROUTE = "/v1/endpoints/e/deployedModels/d/health"


def health_statuses(port: int, proc: subprocess.Popen[bytes], timeout: float) -> list[int]:
    """GETs the health route from the first moment it can be reached until it answers 200."""
    statuses: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            status, _ = call(port, "GET", HEALTH_ROUTE)
        except (ConnectionRefusedError, ConnectionResetError):
            time.sleep(0.05)
            continue
        statuses.append(status)
        if status == 200:
            return statuses
        time.sleep(0.1)
    raise AssertionError(f"the server did not become healthy (statuses {statuses}, exit {proc.poll()})")


def start_server(port: int, model: Path, log: Path, accelerator: str) -> subprocess.Popen[bytes]:
    """`python -m trainer.server` as Vertex starts it (non-default routes), its output in `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "trainer.server", "--host", "127.0.0.1"],
            cwd=ROOT,
            env=trainer_env(
                {
                    "AIP_HTTP_PORT": str(port),
                    "AIP_HEALTH_ROUTE": HEALTH_ROUTE,
                    "AIP_PREDICT_ROUTE": PREDICT_ROUTE,
                    "AIP_STORAGE_URI": str(model),
                    "SERVING_ACCELERATOR": accelerator,
                }
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@pytest.mark.serial
def test_server_process_serves_on_vertexs_contract(tiny_model: Path, tmp_path: Path) -> None:
    from trainer._tf import tf

    port = free_port()
    log = tmp_path / "server.log"
    proc = start_server(port, tiny_model, log, accelerator="cpu")
    try:
        statuses = health_statuses(port, proc, timeout=120)
        # Bound before the model loads (Vertex's TCP liveness probe), healthy only once it has.
        assert statuses[0] == 503 and statuses[-1] == 200, statuses

        rng = np.random.default_rng(5)
        images = [synthetic.make_image(rng, c, 80) for c in CLASSES]
        encoded = [
            (tf.io.encode_jpeg(im) if i % 2 else tf.io.encode_png(im)).numpy() for i, im in enumerate(images)
        ]
        instances = [{"image_bytes": {"b64": b64(e)}} for e in encoded[:3]] + [
            {"b64": b64(e)} for e in encoded[3:]
        ]
        status, answer = call(port, "POST", PREDICT_ROUTE, body({"instances": instances, "parameters": {}}))
        assert status == 200, answer
        predictions = answer["predictions"]
        assert len(predictions) == len(CLASSES)
        for p in predictions:
            assert set(p) == {"probabilities", "class_index", "class_name"}
            assert p["class_name"] == CLASSES[p["class_index"]]
        expected = tf.saved_model.load(str(tiny_model)).signatures["serving_default"](
            image_bytes=tf.constant(encoded)
        )
        np.testing.assert_allclose(
            [p["probabilities"] for p in predictions], expected["probabilities"].numpy(), atol=1e-6
        )

        status, answer = call(port, "POST", PREDICT_ROUTE, b'{"instances": [')
        assert status == 400 and "not JSON" in answer["error"]
        assert call(port, "POST", PREDICT_ROUTE, body({"parameters": {}}))[0] == 400
        status, answer = call(port, "POST", PREDICT_ROUTE, body({"instances": [{"b64": "@@@"}]}))
        assert status == 400 and "instance 0: b64 is not valid base64" in answer["error"]
        # The model's guards (trainer.export) answer 400, naming the image they refuse.
        for refused in (b"not an image", real_png(8193)):
            not_images = {"instances": [{"b64": b64(encoded[0])}, {"b64": b64(refused)}]}
            status, answer = call(port, "POST", PREDICT_ROUTE, body(not_images))
            assert status == 400 and answer["error"].startswith("instance 1: "), answer
        too_many = {"instances": [{"b64": b64(encoded[0])}] * (serve.MAX_INSTANCES + 1)}
        assert call(port, "POST", PREDICT_ROUTE, body(too_many))[0] == 400
        assert call(port, "GET", "/health")[0] == 404
        assert call(port, "POST", "/predict", body({"instances": instances}))[0] == 404
        assert call(port, "GET", HEALTH_ROUTE) == (200, {})

        proc.terminate()  # SIGTERM, as Vertex stops a container
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert "model loaded" in text and "ready" in text
    assert "SERVING_ACCELERATOR=cpu" in text
    # The devices TensorFlow sees, and where the warm-up prediction ran.
    seen = next(line for line in text.splitlines() if f"TensorFlow {tf.__version__} sees: " in line)
    assert "/physical_device:CPU:0" in seen, seen
    if "GPU" not in seen:
        assert "it runs on /job:localhost/replica:0/task:0/device:CPU:0 (warm-up prediction" in text, text


@pytest.mark.serial
def test_a_gpu_deployment_where_tensorflow_sees_no_gpu_refuses_to_start(
    tiny_model: Path, tmp_path: Path
) -> None:
    """SERVING_ACCELERATOR=gpu on this CPU machine: one clear line, exit 1, never healthy (a GPU
    deployment serving on the CPU would bill the GPU for nothing; Vertex reports the deployment
    as failed)."""
    from benchmarks.common import gpu_names

    if gpu_names():
        pytest.skip("this machine has a GPU: the server would serve on it")
    port = free_port()
    log = tmp_path / "server.log"
    proc = start_server(port, tiny_model, log, accelerator="gpu")
    statuses = []
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and 200 not in statuses:
            with contextlib.suppress(ConnectionRefusedError, ConnectionResetError):
                statuses.append(call(port, "GET", HEALTH_ROUTE)[0])
            time.sleep(0.1)
        assert 200 not in statuses, f"a GPU deployment served without a GPU: {statuses}"
        assert proc.wait(timeout=10) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    # The server's one error line (TensorFlow's own lines, e.g. its failed cuInit, are not its).
    errors = [line for line in text.splitlines() if " ERROR trainer.server: " in line]
    assert len(errors) == 1 and "Traceback" not in text, text[-3000:]
    assert "model loaded" not in text  # refused before loading the model
    assert errors[0].endswith(
        "trainer.server: SERVING_ACCELERATOR=gpu but TensorFlow sees no GPU (it sees: "
        "/physical_device:CPU:0): refusing to serve a GPU deployment on the CPU. Check the machine "
        "has a GPU (the deployment's accelerator_type and accelerator_count) and that the image's "
        "TensorFlow has its CUDA libraries; or register the model with serving_accelerator=cpu."
    ), errors[0]


def test_server_exits_when_the_model_does_not_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Rather than answering 503 for ever: Vertex then reports the deployment as failed."""
    monkeypatch.setattr(server.signal, "signal", lambda *args: None)  # not in pytest's process
    monkeypatch.setenv("AIP_HTTP_PORT", "0")
    monkeypatch.setenv("AIP_STORAGE_URI", str(tmp_path / "missing"))
    assert server.main(["--host", "127.0.0.1"]) == 1
    assert "does not load as a serving model" in caplog.text
    assert (
        server.main(["--host", "127.0.0.1", "--model_dir", str(export_without_signature(tmp_path / "x"))])
        == 1
    )
    assert "has no 'serving_default' signature" in caplog.text
