"""GitHub Actions: actionlint-clean; pull requests are tested, pushes to main are submitted."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ci.tools import ROOT, run, tool

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))
CI = ROOT / ".github" / "workflows" / "ci.yml"


def actionlint(files: list[Path], home: Path) -> tuple[int, str]:
    # shellcheck from the venv checks every `run:` script; pyflakes is not used (no Python steps).
    args: list[str | Path] = [
        tool("actionlint"), "-no-color", f"-shellcheck={tool('shellcheck')}", "-pyflakes=", *files,
    ]  # fmt: skip
    return run(args, home=home)


def test_actionlint_reports_nothing(tmp_path: Path) -> None:
    assert CI in WORKFLOWS
    code, output = actionlint(WORKFLOWS, tmp_path)
    assert (code, output) == (0, ""), f"actionlint findings:\n{output}"


def test_actionlint_does_report_a_bad_workflow(tmp_path: Path) -> None:
    """The check above is only worth something if this actionlint (and its shellcheck) find things."""
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
        "      - uses: actions/checkout@v3\n"  # retired runtime
        "      - run: echo $FOO\n"  # SC2086, from shellcheck
        "      - run: echo ${{ github.event.pull_request.title }}\n"  # script injection
    )
    code, output = actionlint([bad], tmp_path)
    assert code != 0
    assert "SC2086" in output, output
    assert "actions/checkout@v3" in output, output
    assert "github.event.pull_request.title" in output, output


@pytest.fixture(scope="module")
def workflow() -> dict[Any, Any]:
    data = yaml.safe_load(CI.read_text())
    assert isinstance(data, dict)
    return data


def triggers(workflow: dict[Any, Any]) -> dict[str, Any]:
    on = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` key as true
    assert isinstance(on, dict), on
    return on


def steps_text(job: dict[str, Any]) -> list[str]:
    return [step.get("run", "") for step in job["steps"]]


def uses(job: dict[str, Any]) -> list[str]:
    return [step["uses"] for step in job["steps"] if "uses" in step]


def push_to_main_only(job: dict[str, Any]) -> bool:
    condition = str(job.get("if", ""))
    return "github.event_name == 'push'" in condition and "github.ref == 'refs/heads/main'" in condition


def test_runs_on_pull_requests_and_pushes_to_main(workflow: dict[Any, Any]) -> None:
    on = triggers(workflow)
    assert "pull_request" in on
    assert on["push"]["branches"] == ["main"]
    # Least privilege by default; only the submitting job may mint an OIDC token.
    assert workflow["permissions"] == {"contents": "read"}


def test_pull_requests_are_linted_tested_and_checked_for_a_stale_compile(workflow: dict[Any, Any]) -> None:
    pr_jobs = {name: job for name, job in workflow["jobs"].items() if not push_to_main_only(job)}
    assert pr_jobs, "no job runs on pull requests"
    assert all("if" not in job for job in pr_jobs.values())
    commands = [cmd for job in pr_jobs.values() for cmd in steps_text(job)]
    assert "make lint" in commands and "make test" in commands, commands
    compile_step = next((cmd for cmd in commands if "make compile" in cmd), "no `make compile` step")
    assert re.search(r"git diff --exit-code -- compiled/", compile_step), compile_step
    assert "git status --porcelain -- compiled/" in compile_step, "new untracked files count as stale"
    for job in pr_jobs.values():
        assert "id-token" not in job.get("permissions", {}), "pull requests get no cloud credentials"
        assert any(u.startswith("actions/checkout@") for u in uses(job))


def test_every_job_sets_up_python_311_and_the_pinned_uv(workflow: dict[Any, Any]) -> None:
    assert workflow["env"]["PYTHON_VERSION"] == "3.11"
    for name, job in workflow["jobs"].items():
        by_action = {s["uses"].split("@")[0]: s.get("with", {}) for s in job["steps"] if "uses" in s}
        assert by_action["actions/setup-python"]["python-version"] == "${{ env.PYTHON_VERSION }}", name
        assert by_action["astral-sh/setup-uv"]["version"] == "${{ env.UV_VERSION }}", name


def test_push_to_main_authenticates_with_workload_identity_then_submits(workflow: dict[Any, Any]) -> None:
    jobs = {name: job for name, job in workflow["jobs"].items() if push_to_main_only(job)}
    assert len(jobs) == 1, "exactly one job submits, and only on pushes to main"
    (job,) = jobs.values()
    assert job["permissions"] == {"contents": "read", "id-token": "write"}
    tested = job.get("needs")
    tested = [tested] if isinstance(tested, str) else tested
    assert tested and all(not push_to_main_only(workflow["jobs"][t]) for t in tested), "submit after tests"

    steps = job["steps"]
    auth_at = next(
        n for n, s in enumerate(steps) if s.get("uses", "").startswith("google-github-actions/auth@")
    )
    auth = steps[auth_at]["with"]
    assert set(auth) == {"workload_identity_provider", "service_account"}, "WIF only, no key file"
    for value in auth.values():
        assert re.fullmatch(r"\$\{\{ (vars|secrets)\.[A-Z_]+ \}\}", value), value

    submit_at = next(n for n, s in enumerate(steps) if "make run" in s.get("run", ""))
    assert auth_at < submit_at
    submit = steps[submit_at]
    assert re.search(r"make compile\s*&&\s*make run", submit["run"]), submit["run"]
    for key in ("PROJECT_ID", "REGION", "PIPELINE_ROOT"):
        assert re.fullmatch(r"\$\{\{ vars\.[A-Z_]+ \}\}", submit["env"][key]), (key, submit["env"])


def test_actions_are_pinned_to_a_major_version_at_least(workflow: dict[Any, Any]) -> None:
    refs = [u for job in workflow["jobs"].values() for u in uses(job)]
    assert refs
    for ref in refs:
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@(v\d+(\.\d+){0,2}|[0-9a-f]{40})", ref), ref
