from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Small but learnable: the tiny backbone reaches high accuracy on it in 3 epochs.
SYNTHETIC_ARGS = dict(source="synthetic", image_size=64, synthetic_per_class=60, shards=8, seed=7)
FAST_TRAIN_FLAGS = [
    "--backbone=tiny",
    "--weights=none",
    "--image_size=64",
    "--epochs=3",
    "--per_replica_batch_size=16",
    "--learning_rate=0.003",
    "--dense_units=64",
]


@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic dataset prepared once per session through the real TFDS cassava builder."""
    from trainer.prepare import PrepareConfig, prepare

    out = tmp_path_factory.mktemp("data") / "synthetic64"
    prepare(PrepareConfig(output_dir=str(out), **SYNTHETIC_ARGS))  # type: ignore[arg-type]
    return out


# The day in-process tests judge the serving images' end of availability on: 200 days before
# TF 2.15's prebuilt image ends (2027-01-14), so `serving_image=auto` means the prebuilt image and
# nothing warns, whatever day the suite runs. Tests of the dates themselves pass their day
# (`today=`) or patch this (tests/components/test_serving_policy.py). Processes the tests start
# (local runs) judge on the real day: either answer works there.
SERVING_TEST_DAY = "2026-06-28"


@pytest.fixture(autouse=True)
def serving_images_judged_on_a_fixed_day(monkeypatch: pytest.MonkeyPatch) -> None:
    from components import servingimage

    real = servingimage.prebuilt_days_left
    monkeypatch.setattr(
        servingimage, "prebuilt_days_left", lambda version, today="": real(version, today or SERVING_TEST_DAY)
    )


# aiplatform's PipelineJob reads its template with the pure-Python YAML parser: a second for the
# compiled 620 KB JSON, on every submission (py-spy: three quarters of a test_submit test). The
# tests submit the same few templates hundreds of times, compiled afresh into their own folders
# or served by a fake registry, so each process parses a content once and hands out copies of
# what that parse returned: the library's answer either way. aiplatform reads every template
# (local file, https or gs://) through yaml_utils._maybe_import_yaml().safe_load; installed once
# aiplatform is imported (tests import it inside themselves).
_PARSED_TEMPLATES: dict[bytes, Any] = {}


class _TemplatesParsedOnce:
    def __init__(self, yaml: Any) -> None:
        self.yaml = yaml

    def __getattr__(self, name: str) -> Any:
        return getattr(self.yaml, name)

    def safe_load(self, stream: Any) -> Any:
        import copy
        import hashlib

        text = stream.read() if hasattr(stream, "read") else stream
        key = hashlib.sha256(text.encode() if isinstance(text, str) else text).digest()
        if key not in _PARSED_TEMPLATES:
            _PARSED_TEMPLATES[key] = self.yaml.safe_load(text)
        return copy.deepcopy(_PARSED_TEMPLATES[key])


@pytest.fixture(autouse=True)
def templates_parsed_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    yaml_utils = sys.modules.get("google.cloud.aiplatform.utils.yaml_utils")
    if yaml_utils is not None:
        shim = _TemplatesParsedOnce(yaml_utils._maybe_import_yaml())
        monkeypatch.setattr(yaml_utils, "_maybe_import_yaml", lambda: shim)


def trainer_check_in_process(module: str, request: Any, timeout: float | None = None) -> Any:
    """`pipeline.options.trainer_flags.trainer_check` answered in this process: the same module's `main` on the
    same JSON, without a Python start per check (hundreds of them across the suite)."""
    import contextlib
    import importlib
    import io
    import json
    import sys

    out, err = io.StringIO(), io.StringIO()
    stdin, sys.stdin = sys.stdin, io.StringIO(json.dumps(request))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main = importlib.import_module(module).main
            code = main([]) if module == "trainer.preparation.sourcecheck" else main()
    finally:
        sys.stdin = stdin
    if code != 0:
        raise RuntimeError(f"python -m {module} failed: {err.getvalue().strip()[-2000:]}")
    return json.loads(out.getvalue())


@pytest.fixture(autouse=True)
def trainer_checks_in_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The front door's trainer checks run in-process, except in the tests marked
    `trainer_check_process`, which prove the process path (`pipeline.options.trainer_flags.trainer_check`)."""
    if request.node.get_closest_marker("trainer_check_process"):
        return
    from pipeline.options import trainer_flags

    monkeypatch.setattr(trainer_flags, "trainer_check", trainer_check_in_process)


# The pipeline root's bucket of the made-up project the Vertex-side tests use.
TEST_BUCKET = "p-proj-pipelines"


@pytest.fixture
def gcs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A Cloud Storage client on a local emulator (tests/fakes.py), with TEST_BUCKET created;
    the client libraries in this process reach the emulator through STORAGE_EMULATOR_HOST."""
    import google.cloud.storage as storage
    from google.auth.credentials import AnonymousCredentials

    from tests.fakes import storage_emulator

    with storage_emulator() as url:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
        client = storage.Client(project="p-proj", credentials=AnonymousCredentials())
        client.create_bucket(TEST_BUCKET)
        yield client


@pytest.fixture
def fresh_aiplatform() -> Iterator[None]:
    """aiplatform.init() keeps its credentials, project and endpoint in one process-wide object:
    tests that ran before (with AnonymousCredentials and a fake endpoint) must not lend theirs."""
    from google.cloud.aiplatform import initializer

    config = initializer.global_config
    saved = dict(vars(config))
    config.__init__()  # type: ignore[misc]
    yield
    vars(config).clear()
    vars(config).update(saved)


# Under `--dist loadscope` (make test's first part, make test-fast) a module runs whole on one
# worker, and xdist hands out the modules with the most tests first; these few tests each train
# or build a model and take a minute or so in all (make test-fast's timeline: test_task last,
# alone for its last 25 s on a 2-core machine). With `--no-loadscope-reorder` this order stands:
# these modules first, then xdist's own (most tests first).
HEAVIEST_MODULES = (
    "tests/trainer/test_task.py",
    "tests/trainer/test_backbones.py",
    "tests/trainer/test_model.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if getattr(config.option, "loadscopereorder", True):  # xdist sets dist="no" in its workers
        return
    counts: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        counts[module] = counts.get(module, 0) + 1

    def weight(item: pytest.Item) -> tuple[int, int]:
        module = item.nodeid.split("::")[0]
        first = HEAVIEST_MODULES.index(module) if module in HEAVIEST_MODULES else len(HEAVIEST_MODULES)
        return (first, -counts[module])

    items.sort(key=weight)  # stable: a module's tests keep their order
