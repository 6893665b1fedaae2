"""Serving the published SavedModel: its signature's guards in-process, and the same model under
the TensorFlow of each serving image (Vertex's newest prebuilt one, 2.15, and TensorFlow Serving's
in the custom image) as under the trainer's own: `python -m trainer.serve` from
`local.servingenv.python_for(version)` (slow). The custom image's entrypoint: tests/ci/test_serving_dockerfile.py.
"""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from components.servingimage import CUSTOM_SERVING_TF_VERSION, DEFAULT_SERVING_TF_VERSION
from local import servingenv
from tests.processes import ROOT, trainer_env
from trainer import serve, synthetic
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
    depth, only trainer.synthetic and trainer.storage (its path rules) of the trainer, and those
    modules (and trainer.contract, storage's) nothing of TensorFlow or the trainer at their top."""
    used = module_imports(ROOT / "trainer" / "serve.py", top_level_only=False)
    allowed = {"trainer", "trainer.synthetic", "trainer.storage"}
    assert {name for name in used if name.startswith("trainer")} <= allowed, used
    assert "tf_keras" not in used
    top = module_imports(ROOT / "trainer" / "synthetic.py", top_level_only=True)
    assert not {name for name in top if name.startswith(("trainer", "tf_keras", "tensorflow"))}, (
        f"trainer/synthetic.py imports {sorted(top)} at its top: trainer.serve makes its images "
        "under a TensorFlow without tf_keras, so TensorFlow may only be imported inside write_archive"
    )
    top = module_imports(ROOT / "trainer" / "storage.py", top_level_only=True)
    assert {name for name in top if name.startswith(("trainer", "tf_keras", "tensorflow"))} <= {
        "trainer.contract",
        "trainer.contract.METADATA_FILE",
        "trainer.contract.SAVED_MODEL_FILE",
    }, f"trainer/storage.py imports {sorted(top)} at its top: trainer.serve uses its path rules"
    top = module_imports(ROOT / "trainer" / "contract.py", top_level_only=True)
    assert not {name for name in top if name.startswith(("trainer", "tf_keras", "tensorflow"))}, top


def test_serving_input_matches_the_trainers() -> None:
    """(The path rules are trainer.storage's own, and the input's name trainer.serve's: the
    export and the check import them.) Vertex decodes base64 for an input ending in `_bytes`."""
    from trainer import export

    assert serve.SERVING_INPUT == export.SERVING_INPUT and serve.SERVING_INPUT.endswith("_bytes")


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
    assert stamp == {"python": servingenv.PYTHON, "requirements": [], "bytecode": True}
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
    from trainer.config import MAX_IMAGE_PIXELS

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


# --- the serving images' TensorFlow ------------------------------------------------------------

# The TensorFlow of each serving image: Vertex's newest prebuilt one, and TensorFlow Serving's
# release in the custom image (components.servingimage.CUSTOM_SERVING_TF_VERSION).
SERVING_TFS = {DEFAULT_SERVING_TF_VERSION: "2.15.1", CUSTOM_SERVING_TF_VERSION: "2.20.0"}


# Runs trainer.serve's main for each case in turn, as stdin sends them (a JSON line: [case, argv]),
# in the serving environment's interpreter; one JSON line per case: its exit code and output.
SERVE_EACH = """
import contextlib, io, json, sys
from trainer import serve
for line in sys.stdin:
    case, argv = json.loads(line)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = serve.main(argv)
    print(json.dumps({"case": case, "code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}), flush=True)
"""


def check_lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_each_serving_image_has_its_environment() -> None:
    assert set(SERVING_TFS) <= set(servingenv.PINS)
    for version, exact in SERVING_TFS.items():
        assert f"tensorflow-cpu=={exact}" in servingenv.PINS[version]


@pytest.mark.serial
def test_models_exported_here_serve_under_each_serving_images_tensorflow(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    started = time.monotonic()
    pythons = {version: servingenv.python_for(version) for version in SERVING_TFS}
    env_seconds = time.monotonic() - started
    probe = "import importlib.metadata as m, importlib.util as u; print(m.version('tensorflow-cpu'), u.find_spec('tf_keras') is not None)"
    for version, python in pythons.items():
        versions = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True)
        assert versions.stdout.split() == [SERVING_TFS[version], "False"], versions.stdout  # no tf_keras

    # One process per TensorFlow: `python -m trainer.serve`'s main for each model in turn as it is
    # exported, each one's exit code and output kept apart (importing TensorFlow is most of a
    # check; nine processes, one per check, took 195 s of make test's serial tier).
    def check(version: str) -> subprocess.Popen[str]:
        with (tmp_path / f"tensorflow-{version}.log").open("w") as log:  # read on failure
            return subprocess.Popen(
                [pythons[version], "-c", SERVE_EACH],
                cwd=ROOT,
                env=trainer_env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )

    # Under the custom image's TensorFlow, a minor release from the trainer's, the mixed-precision
    # ResNet50 and the guards; everything under the prebuilt image's, the check's own refusal too.
    def checked(v: str, name: str) -> bool:
        return v == DEFAULT_SERVING_TF_VERSION or name in ("tiny", "tiny-bomb", "resnet50-mixed_float16")

    procs = {v: check(v) for v in SERVING_TFS}

    def kill_the_left() -> None:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()

    request.addfinalizer(kill_the_left)

    def send(name: str, *argv: str) -> None:
        for v, proc in procs.items():
            if checked(v, name):
                assert proc.stdin is not None
                proc.stdin.write(json.dumps([name, list(argv)]) + "\n")
                proc.stdin.flush()

    models = {"tiny": tiny_model, "no-signature": export_without_signature(tmp_path / "no-signature")}
    bomb = tmp_path / "over-the-pixel-limit.png"
    bomb.write_bytes(real_png(8193))  # decodable: only the model's guard refuses it
    send("tiny-bomb", "--model_dir", str(tiny_model), f"--image={bomb}")
    for name in ("tiny", "no-signature"):
        send(name, "--model_dir", str(models[name]))
    resnet = replace(TINY, backbone="resnet50", dense_units=0)
    for name, policy in (("resnet50-float32", "float32"), ("resnet50-mixed_float16", "mixed_float16")):
        models[name] = export_model(resnet, tmp_path / name, policy)
        send(name, "--model_dir", str(models[name]))
    exported = time.monotonic()
    # The same SavedModels under the trainer's TensorFlow, through the same check, meanwhile.
    references = {}
    for name in ("tiny", "resnet50-float32", "resnet50-mixed_float16"):
        capsys.readouterr()
        assert serve.main(["--model_dir", str(models[name])]) == 0
        references[name] = check_lines(capsys.readouterr().out)
    results = {}
    for v, proc in procs.items():
        stdout, _ = proc.communicate(timeout=600)  # closes its stdin: no more cases
        assert proc.returncode == 0, (tmp_path / f"tensorflow-{v}.log").read_text()[-3000:]
        for line in stdout.splitlines():
            if line.startswith('{"case"'):
                case = json.loads(line)
                results[(v, case["case"])] = (case["stdout"], case["stderr"], case["code"])
    served = time.monotonic()

    for v in SERVING_TFS:
        stdout, stderr, code = results.pop((v, "tiny-bomb"))
        assert code == 1 and stdout == "", (v, stdout)  # the guards hold under that TensorFlow too
    stdout, stderr, code = results.pop((DEFAULT_SERVING_TF_VERSION, "no-signature"))
    assert code == 1 and stdout == "", stdout
    assert "has no 'serving_default' signature" in stderr, stderr

    assert {
        (CUSTOM_SERVING_TF_VERSION, "tiny"),
        (CUSTOM_SERVING_TF_VERSION, "resnet50-mixed_float16"),
    } <= set(results)
    for (v, name), (stdout, stderr, code) in results.items():
        assert code == 0, f"{name} does not serve under TensorFlow {v}:\n{stderr[-3000:]}"
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
            err_msg=f"{name} under {v}",
        )
        if "mixed" not in name:
            assert [a["class_name"] for a in answers] == [a["class_name"] for a in reference], (v, name)
    print(
        f"\nserving envs {env_seconds:.1f} s, exports {exported - started - env_seconds:.1f} s, "
        f"references and the checks {served - exported:.1f} s"
    )
