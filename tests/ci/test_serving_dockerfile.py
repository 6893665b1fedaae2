"""The custom serving image's Dockerfile.serving: hadolint-clean, TensorFlow Serving of the release
the local target checks models under, a `cpu` and a `gpu` stage (the targets the build step
names), not root, and an entrypoint that maps Vertex's AIP_HTTP_PORT and AIP_STORAGE_URI onto
tensorflow_model_server's flags: run here with a stand-in tensorflow_model_server that prints
what it was given."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from components.buildcontext import context_members
from components.servingimage import CUSTOM_SERVING_TF_VERSION, tf_serving_routes
from tests.ci.test_dockerfile import (
    DOCKERIGNORE,
    Instruction,
    dockerignore_patterns,
    hadolint,
    instructions,
    named_stage,
    sent,
)
from tests.ci.tools import ROOT

SERVING_DOCKERFILE = ROOT / "Dockerfile.serving"
# Dockerfile.serving's stage per `serving_accelerator` (components.image builds `--target <it>`).
STAGES = {"cpu": "", "gpu": "-gpu"}


@pytest.fixture(scope="module", params=list(STAGES))
def stage(request: pytest.FixtureRequest) -> list[Instruction]:
    return named_stage(instructions(SERVING_DOCKERFILE.read_text()), request.param)


def test_hadolint_reports_nothing(tmp_path: Path) -> None:
    code, output = hadolint(SERVING_DOCKERFILE, tmp_path)
    assert (code, output) == (0, ""), f"hadolint findings:\n{output}"


def test_each_stage_is_tensorflow_serving_of_the_checked_release() -> None:
    items = instructions(SERVING_DOCKERFILE.read_text())
    for accelerator, suffix in STAGES.items():
        base = named_stage(items, accelerator)[0].args.split()[0]
        assert base == f"tensorflow/serving:{CUSTOM_SERVING_TF_VERSION}.0{suffix}", (accelerator, base)
    assert len([i for i in items if i.keyword == "FROM"]) == len(STAGES)


def test_runs_as_a_user_that_is_not_root_on_vertexs_default_port(stage: list[Instruction]) -> None:
    users = [i.args for i in stage if i.keyword == "USER"]
    assert users, "no USER: the server would run as root"
    user, _, group = users[-1].partition(":")
    assert user not in ("root", "0") and group not in ("root", "0"), users[-1]
    assert user.isdigit(), "a numeric uid lets the platform see it is not root without /etc/passwd"
    created = [i.args for i in stage if i.keyword == "RUN" and "useradd" in i.args]
    assert created and f"--uid {user}" in created[0], "USER must be the uid the image creates"
    assert [i.args for i in stage if i.keyword == "EXPOSE"] == ["8080"]
    # Vertex sets these on the container; a default baked into the image would hide a mistake.
    assert not [i for i in stage if i.keyword == "ENV" and "AIP_" in i.args]


def entrypoint(stage: list[Instruction]) -> list[str]:
    [args] = [i.args for i in stage if i.keyword == "ENTRYPOINT"]
    assert not [i for i in stage if i.keyword == "CMD"]
    return json.loads(args)


def run_entrypoint(
    stage: list[Instruction], tmp_path: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """The stage's ENTRYPOINT with Vertex's appended `args`, a stand-in tensorflow_model_server on
    PATH that prints its arguments as JSON."""
    fake = tmp_path / "bin" / "tensorflow_model_server"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text("#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    path = f"{fake.parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        [*entrypoint(stage), *args], env={"PATH": path, **env}, capture_output=True, text=True, check=False
    )


def test_the_entrypoint_serves_vertexs_storage_uri_on_its_port_as_the_routes_model(tmp_path: Path) -> None:
    cpu = named_stage(instructions(SERVING_DOCKERFILE.read_text()), "cpu")
    env = {"AIP_HTTP_PORT": "7001", "AIP_STORAGE_URI": "gs://b/models/m/run"}
    done = run_entrypoint(cpu, tmp_path, env, "--enable_batching")
    assert done.returncode == 0, done.stderr
    flags = json.loads(done.stdout)
    assert flags[-1] == "--enable_batching"  # the containerSpec's args are passed on
    given = dict(f.removeprefix("--").split("=", 1) for f in flags[:-1])
    assert given["rest_api_port"] == "7001" and given["model_base_path"] == "gs://b/models/m/run"
    # The model's name is the one in the Model's routes (`registered_artifact`).
    for route in tf_serving_routes().values():
        assert route.startswith(f"/v1/models/{given['model_name']}")
    assert given["port"] != given["rest_api_port"]
    # Vertex's default port when AIP_HTTP_PORT is unset.
    assert "--rest_api_port=8080" in json.loads(
        run_entrypoint(cpu, tmp_path, {"AIP_STORAGE_URI": "/m"}).stdout
    )


def test_without_a_storage_uri_nothing_starts(tmp_path: Path) -> None:
    cpu = named_stage(instructions(SERVING_DOCKERFILE.read_text()), "cpu")
    done = run_entrypoint(cpu, tmp_path, {"AIP_HTTP_PORT": "8080"})
    assert done.returncode != 0 and done.stdout == ""
    assert "AIP_STORAGE_URI" in done.stderr


def test_the_gpu_stage_starts_the_server_as_the_cpu_stage_does_after_its_check() -> None:
    items = instructions(SERVING_DOCKERFILE.read_text())
    cpu, gpu = (entrypoint(named_stage(items, name)) for name in ("cpu", "gpu"))
    assert cpu[:2] == gpu[:2] == ["/bin/sh", "-c"] and cpu[3:] == gpu[3:]
    assert gpu[2].endswith("; " + cpu[2]) and "/dev/nvidia" in gpu[2].removesuffix(cpu[2])


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this machine has a GPU")
def test_the_gpu_stage_refuses_to_start_without_a_gpu(tmp_path: Path) -> None:
    gpu = named_stage(instructions(SERVING_DOCKERFILE.read_text()), "gpu")
    done = run_entrypoint(gpu, tmp_path, {"AIP_STORAGE_URI": "/m"})
    assert done.returncode == 1 and done.stdout == "", done.stdout
    assert "serving_accelerator=cpu" in done.stderr


def test_it_is_in_the_build_context() -> None:
    members = dict(context_members(ROOT))
    assert members["Dockerfile.serving"] == SERVING_DOCKERFILE.read_bytes()
    assert sent("Dockerfile.serving", dockerignore_patterns(DOCKERIGNORE.read_text()))
    copies = [i for i in instructions(SERVING_DOCKERFILE.read_text()) if i.keyword in ("COPY", "ADD")]
    assert copies == []  # nothing of the context: the image is TensorFlow Serving and its entrypoint
