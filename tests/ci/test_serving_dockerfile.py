"""The serving image's Dockerfile.serving: hadolint-clean, on the locked TensorFlow and CUDA, running
`python -m trainer.server` as a user that is not root, built from the trainer image's context."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from components.buildcontext import context_members
from tests.ci.test_dockerfile import (
    DOCKERFILE,
    DOCKERIGNORE,
    Instruction,
    dockerignore_patterns,
    final_stage,
    hadolint,
    instructions,
    locked_version,
    sent,
)
from tests.ci.tools import ROOT
from trainer import server

SERVING_DOCKERFILE = ROOT / "Dockerfile.serving"


@pytest.fixture(scope="module")
def stage() -> list[Instruction]:
    return final_stage(instructions(SERVING_DOCKERFILE.read_text()))


def test_hadolint_reports_nothing(tmp_path: Path) -> None:
    code, output = hadolint(SERVING_DOCKERFILE, tmp_path)
    assert (code, output) == (0, ""), f"hadolint findings:\n{output}"


def test_base_carries_no_tensorflow_of_its_own(stage: list[Instruction]) -> None:
    """TensorFlow (the locked one, the exporter's) and its CUDA libraries come from the lock; the
    base is the trainer's plain Python (tests/ci/test_dockerfile.py checks it is the same)."""
    image = stage[0].args.split()[0]
    assert image.startswith("python:"), image
    assert locked_version("tensorflow").startswith("2.")


def test_uv_is_the_trainer_images_uv() -> None:
    def uv_images(text: str) -> list[str]:
        froms = [i.args.split()[0] for i in instructions(text) if i.keyword == "FROM"]
        return [f for f in froms if f.startswith("ghcr.io/astral-sh/uv")]

    assert uv_images(SERVING_DOCKERFILE.read_text()) == uv_images(DOCKERFILE.read_text())


def test_dependencies_come_from_the_lock_before_the_code(stage: list[Instruction]) -> None:
    keywords = [(i.keyword, i.args) for i in stage]
    copy_lock = next(n for n, (k, a) in enumerate(keywords) if k == "COPY" and "uv.lock" in a.split())
    install = next(
        n for n, (k, a) in enumerate(keywords) if k == "RUN" and "uv export" in a and "uv pip install" in a
    )
    copy_code = next(n for n, (k, a) in enumerate(keywords) if k == "COPY" and a.split()[0] == "trainer/")
    assert copy_lock < install < copy_code, "COPY lock, install, then COPY trainer/ (layer cache)"
    run_args = keywords[install][1]
    for flag in (
        "--frozen",
        "--only-group trainer --only-group gpu",
        "--require-hashes",
        "-r /tmp/requirements.txt",
    ):
        assert flag in run_args, run_args


def test_environment(stage: list[Instruction]) -> None:
    env: dict[str, str] = {}
    for item in stage:
        if item.keyword == "ENV":
            env.update(dict(word.split("=", 1) for word in shlex.split(item.args)))
    for key in ("PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "TF_USE_LEGACY_KERAS"):
        assert env.get(key) == "1", f"ENV {key}=1 missing ({env})"
    assert env.get("PYTHONPATH") == "/app"
    # Vertex sets these on the container; a default baked into the image would hide a mistake.
    assert not [key for key in env if key.startswith("AIP_")], env


def test_entry_point_runs_the_server_on_vertexs_default_port(stage: list[Instruction]) -> None:
    entrypoints = [i.args for i in stage if i.keyword == "ENTRYPOINT"]
    assert len(entrypoints) == 1, entrypoints
    assert json.loads(entrypoints[0]) == ["python", "-m", "trainer.server"]  # exec form: SIGTERM reaches it
    assert not [i for i in stage if i.keyword == "CMD"]
    exposed = [i.args for i in stage if i.keyword == "EXPOSE"]
    assert exposed == [str(server.DEFAULT_PORT)] == ["8080"]


def test_runs_as_a_user_that_is_not_root(stage: list[Instruction]) -> None:
    users = [i.args for i in stage if i.keyword == "USER"]
    assert users, "no USER: the server would run as root"
    user, _, group = users[-1].partition(":")
    assert user not in ("root", "0") and group not in ("root", "0"), users[-1]
    assert user.isdigit(), "a numeric uid lets the platform see it is not root without /etc/passwd"
    created = [i.args for i in stage if i.keyword == "RUN" and "useradd" in i.args]
    assert created and f"--uid {user}" in created[0], "USER must be the uid the image creates"
    last_user = max(n for n, i in enumerate(stage) if i.keyword == "USER")
    assert not [i for i in stage[last_user:] if i.keyword == "RUN"], "nothing runs as root after USER"


def test_it_is_in_the_build_context_with_all_it_copies(stage: list[Instruction]) -> None:
    members = dict(context_members(ROOT))
    assert members["Dockerfile.serving"] == SERVING_DOCKERFILE.read_bytes()
    rules = dockerignore_patterns(DOCKERIGNORE.read_text())
    assert sent("Dockerfile.serving", rules)
    copies = [i.args.split() for i in stage if i.keyword in ("COPY", "ADD")]
    sources = [s for c in copies if not c[0].startswith("--from") for s in c[:-1]]
    assert {"pyproject.toml", "uv.lock", "trainer/"} <= set(sources)
    assert [s for s in sources if not sent(s.rstrip("/"), rules)] == []
    assert [s for s in sources if s.rstrip("/") not in members and not s.startswith("trainer")] == []
