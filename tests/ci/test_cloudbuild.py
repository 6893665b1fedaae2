"""cloudbuild.yaml: strictly a Cloud Build `Build`, with the checks before the submission."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.cloud.devtools.cloudbuild_v1.types import Build
from google.protobuf import json_format

from tests.ci.tools import ROOT

CONFIG = ROOT / "cloudbuild.yaml"
STEPS = ["setup", "lint", "test", "compile-check", "submit"]
# Substitutions Cloud Build defines itself (all builds, and builds started by triggers).
BUILT_IN = {
    "PROJECT_ID", "BUILD_ID", "PROJECT_NUMBER", "LOCATION", "TRIGGER_NAME", "COMMIT_SHA",
    "REVISION_ID", "SHORT_SHA", "REPO_NAME", "REPO_FULL_NAME", "BRANCH_NAME", "TAG_NAME",
    "REF_NAME", "TRIGGER_BUILD_CONFIG_PATH", "SERVICE_ACCOUNT_EMAIL", "SERVICE_ACCOUNT",
}  # fmt: skip
# $NAME or ${NAME}, but not the $$ escape (a literal $ for the step's shell).
REFERENCE = re.compile(
    r"(?<!\$)\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    data = yaml.safe_load(CONFIG.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def build(raw: dict[str, Any]) -> Build:
    return Build.from_json(json.dumps(raw), ignore_unknown_fields=False)


def strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for value in node.values() for s in strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in strings(value)]
    return []


def references(text: str) -> set[str]:
    return {m["braced"] or m["bare"] for m in REFERENCE.finditer(text)}


def script(build: Build, step_id: str) -> str:
    step = next(s for s in build.steps if s.id == step_id)
    if step.entrypoint == "make":
        return "make " + " ".join(step.args)
    assert step.entrypoint == "bash" and step.args[-2] == "-c", step
    return str(step.args[-1])


def test_parses_strictly_into_the_build_proto(raw: dict[str, Any]) -> None:
    message = Build.pb()()
    json_format.ParseDict(raw, message, ignore_unknown_fields=False)
    assert len(message.steps) == len(STEPS)


def test_strict_parsing_rejects_a_misspelt_field(raw: dict[str, Any]) -> None:
    """The test above is only worth something if a typo fails it."""
    broken = json.loads(json.dumps(raw))
    broken["steps"][1]["waitfor"] = broken["steps"][1].pop("waitFor")
    with pytest.raises(json_format.ParseError, match="waitfor"):
        Build.from_json(json.dumps(broken), ignore_unknown_fields=False)


def test_steps_in_order_and_what_each_waits_for(build: Build) -> None:
    ids = [step.id for step in build.steps]
    assert ids == STEPS
    needs: dict[str, set[str]] = {}
    for n, step in enumerate(build.steps):
        assert "-" not in step.wait_for, f"{step.id} must not start before the steps above it"
        assert set(step.wait_for) <= set(ids[:n]), f"{step.id} waits for a later or unknown step"
        # No waitFor means: after every step above.
        direct = set(step.wait_for) if step.wait_for else set(ids[:n])
        needs[step.id] = direct.union(*(needs[d] for d in direct))
    assert needs["lint"] == needs["test"] == {"setup"}
    assert needs["compile-check"] == {"setup", "lint", "test"}
    assert needs["submit"] == {"setup", "lint", "test", "compile-check"}, "submit only a checked commit"


def test_steps_run_the_makefile_in_python_311(build: Build) -> None:
    images = {step.name for step in build.steps}
    assert len(images) == 1 and images.pop().startswith("python:3.11"), images
    assert script(build, "lint") == "make lint"
    assert script(build, "test") == "make test"
    assert script(build, "submit") == "make run"
    setup = script(build, "setup")
    assert re.search(r"pip install .*\buv==\d+\.\d+\.\d+", setup), setup
    assert "make setup" in setup


def test_uv_is_the_same_version_everywhere(build: Build) -> None:
    in_cloudbuild = re.search(r"\buv==(\S+)", script(build, "setup"))
    in_dockerfile = re.search(r"ghcr\.io/astral-sh/uv:([\d.]+)", (ROOT / "Dockerfile").read_text())
    workflow = yaml.safe_load((ROOT / ".github/workflows/ci.yml").read_text())
    assert in_cloudbuild and in_dockerfile
    assert in_cloudbuild[1] == in_dockerfile[1] == workflow["env"]["UV_VERSION"]


def test_submit_gets_the_project_and_the_substitutions(build: Build) -> None:
    submit = next(step for step in build.steps if step.id == "submit")
    env = dict(item.split("=", 1) for item in submit.env)
    assert env["PROJECT_ID"] == "$PROJECT_ID"
    assert env["REGION"] == "${_REGION}"
    assert env["PIPELINE_ROOT"] == "${_PIPELINE_ROOT}"
    assert env["SERVICE_ACCOUNT"] == "${_SERVICE_ACCOUNT}"
    # Cloud Build's source has no .git: without the trigger's commit every run is `unknown`.
    assert env["SOURCE_COMMIT"] == "$COMMIT_SHA"


def test_substitutions_are_declared_used_and_custom(raw: dict[str, Any], build: Build) -> None:
    declared = set(build.substitutions)
    assert declared, "no substitutions with defaults"
    assert all(re.fullmatch(r"_[A-Z0-9_]+", key) for key in declared), declared
    used = set().union(*(references(s) for s in strings(raw["steps"])))
    defaults = set().union(*(references(v) for v in build.substitutions.values()))
    custom = {name for name in used | defaults if name.startswith("_")}
    assert custom <= declared, f"used but not declared: {sorted(custom - declared)}"
    assert declared <= used, f"declared but never used (Cloud Build rejects that): {declared - used}"
    assert (used | defaults) - custom <= BUILT_IN, f"unknown: {sorted((used | defaults) - custom - BUILT_IN)}"
    assert build.substitutions["_REGION"]
    if defaults:  # a default that refers to another substitution needs dynamic substitutions
        assert build.options.dynamic_substitutions


def test_options_and_timeout(build: Build) -> None:
    assert build.options.logging.name == "CLOUD_LOGGING_ONLY"
    assert build.options.machine_type.name.startswith("E2_HIGHCPU")
    assert 30 * 60 <= build.timeout.total_seconds() <= 2 * 60 * 60


@pytest.fixture()
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "compiled").mkdir()
    (tmp_path / "compiled" / "pipeline.json").write_text('{"v": 1}\n')
    (tmp_path / "bin").mkdir()
    return tmp_path


def run_compile_check(build: Build, workspace: Path, make_body: str) -> subprocess.CompletedProcess[str]:
    """The compile-check step's own script, with a stand-in `make` first on PATH."""
    make = workspace / "bin" / "make"
    make.write_text(f'#!/bin/bash\nset -e\n[ "$1" = compile ]\n{make_body}\n')
    make.chmod(0o755)
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script(build, "compile-check")],
        cwd=workspace,
        env={"PATH": f"{workspace / 'bin'}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_compile_check_passes_when_compiling_changes_nothing(build: Build, workspace: Path) -> None:
    result = run_compile_check(build, workspace, "echo '{\"v\": 1}' > compiled/pipeline.json")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "make_body",
    [
        "echo '{\"v\": 2}' > compiled/pipeline.json",  # a stale file
        "echo '{}' > compiled/schedule.json",  # a file not committed
        "rm compiled/pipeline.json",  # a file the compiler no longer writes
        "exit 3",  # make compile itself fails
    ],
)
def test_compile_check_fails_on_a_stale_compiled_folder(
    build: Build, workspace: Path, make_body: str
) -> None:
    result = run_compile_check(build, workspace, make_body)
    assert result.returncode != 0, result.stdout + result.stderr
