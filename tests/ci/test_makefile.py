"""The Makefile hands the variables a person types (CRON, TIMEZONE, START, END, MAX_CONCURRENT,
NAME, WAIT, TARGET, BENCH) to the programs in their environment, never through a shell: an
injection attempt in any of them runs nothing, reaches the program verbatim, and fails the
target with an error naming the variable; every failure reaches make's exit status.

Fast and local: the real `make`, with `-o .venv/.setup-stamp` (never `uv sync`), no PROJECT_ID
and a temporary HOME; the real targets stop at their validation, before any settings or request,
and the matrix runs against a stand-in for the venv's python that records what it was given.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = ROOT / "Makefile"
VARIABLES = ("CRON", "TIMEZONE", "START", "END", "MAX_CONCURRENT", "NAME", "WAIT", "TARGET", "BENCH", "RUN")
# Where each variable goes: the target that reads it, and the other variables it needs to get
# as far as reading it.
TARGETS: dict[str, tuple[str, dict[str, str]]] = {
    "CRON": ("schedule", {}),
    "TIMEZONE": ("schedule", {"CRON": "0 6 * * 1"}),
    "START": ("schedule", {"CRON": "0 6 * * 1"}),
    "END": ("schedule", {"CRON": "0 6 * * 1"}),
    "MAX_CONCURRENT": ("schedule", {"CRON": "0 6 * * 1"}),
    "NAME": ("schedule-pause", {}),
    "WAIT": ("run", {"TARGET": "vertex"}),
    "TARGET": ("run", {}),
    "BENCH": ("bench", {}),
    "RUN": ("report", {}),
}
# What the program says about a bad value: the variable's name, or for the two passed as flags
# (--target=..., --bench=...), the flag's own error.
NAMED = {"TARGET": "argument --target: invalid choice", "BENCH": "unknown benchmark(s)"}
PAYLOADS = {
    "double quotes": 'x"; touch {f}; echo "',
    "single quotes": "x'; touch {f}; echo '",
    "command substitution": "$(touch {f})",
    "make function": "$(shell touch {f})",
    "backticks": "`touch {f}`",
    "newline": "x\ntouch {f}",
}
# Variables of the Makefile itself (and one it does not know): any given on make's command line is
# exported to every recipe, and so was expanded by make; UV and TF_CPP_MIN_LOG_LEVEL are also
# read from the environment.
TOOL_VARIABLES = ("TF_CPP_MIN_LOG_LEVEL", "UV_PYTHON", "UV", "VENV", "PY", "STAMP", "SOME_SETTING")
FROM_ENVIRONMENT = ("TF_CPP_MIN_LOG_LEVEL", "UV")
RECORDED = ("TF_CPP_MIN_LOG_LEVEL", "UV_PYTHON", "SOME_SETTING")  # what the fake python also records
pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed"),
]


def make_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment without a project, a parent make's flags or the variables themselves."""
    drop = {"PROJECT_ID", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "ARGS", *VARIABLES}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("GOOGLE_")}
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), **extra)
    return env


def make(
    *args: str, home: Path, env: dict[str, str] | None = None, py: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "-o", ".venv/.setup-stamp", f"PY={py}", *args],
        env=env or make_env(home),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def fake_python(tmp_path: Path) -> Path:
    """A stand-in for the venv's python: records its arguments and the variables' values, then
    exits with FAKE_CODE."""
    fake = tmp_path / "fake-python"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"names = {list(VARIABLES + RECORDED)!r}\n"
        "with open(os.environ['FAKE_OUT'], 'w') as out:\n"
        "    json.dump({'argv': sys.argv[1:], 'env': {n: os.environ.get(n) for n in names}}, out)\n"
        "sys.exit(int(os.environ.get('FAKE_CODE', '0')))\n"
    )
    fake.chmod(0o755)
    return fake


# --- the Makefile's text -------------------------------------------------------------------------


def test_no_line_of_the_makefile_interpolates_the_variables() -> None:
    """Make pastes `$(CRON)` into the recipe before the shell parses it: no line may do that
    (recipe lines, or variables a recipe uses); the programs read them from the environment."""
    text = MAKEFILE.read_text()
    for name in VARIABLES:
        pasted = [
            line
            for line in text.splitlines()
            if re.search(rf"\$[({{]\s*{name}\s*[)}}]", line) and not line.lstrip().startswith("#")
        ]
        assert pasted == [], f"{name} is interpolated by make: {pasted}"


def test_each_variable_is_exported_raw() -> None:
    """`override X := $(value X)`: make never expands a `$(...)` inside a value (it expands a
    command-line or environment variable when it exports it); `export`: handed over verbatim."""
    text = MAKEFILE.read_text()
    exported = {word for line in re.findall(r"^export ([A-Z_ ]+)$", text, re.M) for word in line.split()}
    for name in VARIABLES:
        assert re.search(rf"^override {name} := \$\(value {name}\)$", text, re.M), name
        assert name in exported, name


def test_recipes_chain_no_command_after_a_failure() -> None:
    """Every recipe line stops at its first failure (-e, pipefail), and the lines that run the
    programs keep the program's exit code."""
    text = MAKEFILE.read_text()
    assert re.search(r"^\.SHELLFLAGS := -e -o pipefail -c$", text, re.M)
    explain = re.search(r"^EXPLAIN = (.*)$", text, re.M)
    assert explain and explain.group(1).startswith("|| {") and "exit $$code; }" in explain.group(1)
    recipes = [line for line in text.splitlines() if line.startswith("\t")]
    for line in recipes:
        if "-m launch.cli" in line or "-m launch.schedules" in line:
            assert line.rstrip().endswith("$(EXPLAIN)"), line


@pytest.mark.parametrize("name", VARIABLES)
def test_dry_run_commands_never_contain_the_value(name: str, tmp_path: Path) -> None:
    target, others = TARGETS[name]
    value = PAYLOADS["double quotes"].format(f=tmp_path / "pwned")
    assigns = [f"{k}={v}" for k, v in others.items()] + [f"{name}={value}"]
    result = make("-n", target, *assigns, home=tmp_path / "home")
    assert result.returncode == 0, result.stderr
    assert "pwned" not in result.stdout
    assert not (tmp_path / "pwned").exists()


# --- the values reach the programs verbatim, and nothing else runs ---------------------------------


@pytest.mark.parametrize("origin", ["command line", "environment"])
@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
@pytest.mark.parametrize("name", VARIABLES)
def test_values_reach_the_program_verbatim(name: str, payload: str, origin: str, tmp_path: Path) -> None:
    target, others = TARGETS[name]
    pwned = tmp_path / "pwned"
    value = payload.format(f=pwned)
    out = tmp_path / "seen.json"
    env = make_env(tmp_path / "home", FAKE_OUT=str(out))
    assigns = [f"{k}={v}" for k, v in others.items()]
    if origin == "environment":
        env[name] = value
    else:
        assigns.append(f"{name}={value}")
    result = make(target, *assigns, home=tmp_path / "home", env=env, py=str(fake_python(tmp_path)))
    assert not pwned.exists(), f"{name}: the shell or make ran the value {value!r}"
    assert result.returncode == 0, result.stderr
    seen = json.loads(out.read_text())
    flag = {"TARGET": "--target=", "BENCH": "--bench="}.get(name)
    if flag:
        assert flag + value in seen["argv"], seen["argv"]
    else:
        assert seen["env"][name] == value
        assert not any(pwned.name in arg for arg in seen["argv"]), seen["argv"]


@pytest.mark.parametrize("name", VARIABLES)
def test_a_bad_value_fails_the_target_naming_the_variable(name: str, tmp_path: Path) -> None:
    """The real programs: each stops at its validation (no project is configured, nothing is
    sent), and make exits non-zero."""
    target, others = TARGETS[name]
    pwned = tmp_path / "pwned"
    value = PAYLOADS["double quotes"].format(f=pwned)
    result = make(target, *[f"{k}={v}" for k, v in others.items()], f"{name}={value}", home=tmp_path / "home")
    assert not pwned.exists()
    assert result.returncode == 2, result.stdout + result.stderr
    assert NAMED.get(name, f"{name}=") in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    if target != "bench":
        assert f"make {target}: exit code 2, usage or settings error" in result.stderr


@pytest.mark.parametrize(
    ("target", "assigns"),
    [("schedule", []), ("schedule-delete", []), ("schedule", ["CRON=0 6 * * 1 *"])],
)
def test_missing_or_malformed_values_are_usage_errors(
    target: str, assigns: list[str], tmp_path: Path
) -> None:
    result = make(target, *assigns, home=tmp_path / "home")
    assert result.returncode == 2
    assert re.search(r"(CRON|NAME) is not set|CRON must have five fields", result.stderr), result.stderr
    assert f"make {target}: exit code 2, usage or settings error: nothing was started" in result.stderr


# --- exit codes through make ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "meaning"),
    [
        (1, "failed: the run failed, or a request to Google Cloud did"),
        (2, "usage or settings error: nothing was started"),
        (130, "interrupted"),
    ],
)
@pytest.mark.parametrize("target", ["run", "schedule", "schedules", "schedule-resume"])
def test_the_last_line_names_the_programs_exit_code(
    target: str, code: int, meaning: str, tmp_path: Path
) -> None:
    """make exits 2 for any failed recipe; the line before make's own names the program's code."""
    env = make_env(tmp_path / "home", FAKE_OUT=str(tmp_path / "seen.json"), FAKE_CODE=str(code))
    result = make(target, home=tmp_path / "home", env=env, py=str(fake_python(tmp_path)))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert f"make {target}: exit code {code}, {meaning}" in lines[-2], lines
    assert lines[-1].endswith(f"Error {code}"), lines


def test_a_program_that_succeeds_makes_make_succeed(tmp_path: Path) -> None:
    env = make_env(tmp_path / "home", FAKE_OUT=str(tmp_path / "seen.json"), FAKE_CODE="0")
    result = make("run", home=tmp_path / "home", env=env, py=str(fake_python(tmp_path)))
    assert result.returncode == 0 and "exit code" not in result.stderr, result.stderr
    assert json.loads((tmp_path / "seen.json").read_text())["argv"] == [
        "-m",
        "launch.cli",
        "run",
        "--target=auto",
    ]


# --- the Makefile's own variables are never expanded either ------------------------------------------


@pytest.mark.parametrize(
    ("name", "origin"),
    [(n, "command line") for n in TOOL_VARIABLES] + [(n, "environment") for n in FROM_ENVIRONMENT],
)
def test_a_make_function_in_a_tool_variable_runs_nothing(name: str, origin: str, tmp_path: Path) -> None:
    """`make help TF_CPP_MIN_LOG_LEVEL='$(shell touch f)'`: make exports every command-line
    variable to the recipe (help's awk) and expanded UV and VENV as it read the Makefile; the
    value must stay text. help runs no program of the project, so any value may be tried."""
    pwned = tmp_path / "pwned"
    value = f"$(shell touch {pwned})"
    env = make_env(tmp_path / "home")
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    assigns = []
    if origin == "environment":
        env[name] = value
    else:
        assigns.append(f"{name}={value}")
    result = make("help", *assigns, home=tmp_path / "home", env=env)
    assert not pwned.exists(), f"{name} from the {origin}: make ran the $(shell ...) in its value"
    assert result.returncode == 0, result.stderr
    assert "run" in result.stdout  # help still lists the targets


@pytest.mark.parametrize("origin", ["command line", "environment", "default"])
def test_tf_cpp_min_log_level_reaches_the_program_verbatim(origin: str, tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    value = f"$(shell touch {pwned})"
    out = tmp_path / "seen.json"
    env = make_env(tmp_path / "home", FAKE_OUT=str(out))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    assigns = []
    if origin == "environment":
        env["TF_CPP_MIN_LOG_LEVEL"] = value
    elif origin == "command line":
        assigns.append(f"TF_CPP_MIN_LOG_LEVEL={value}")
    result = make("run", *assigns, home=tmp_path / "home", env=env, py=str(fake_python(tmp_path)))
    assert not pwned.exists(), "make ran the $(shell ...) in TF_CPP_MIN_LOG_LEVEL"
    assert result.returncode == 0, result.stderr
    seen = json.loads(out.read_text())["env"]
    assert seen["TF_CPP_MIN_LOG_LEVEL"] == (value if origin != "default" else "2")
    assert seen["UV_PYTHON"] == "3.11"


def test_other_command_line_variables_reach_the_program_verbatim(tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    value = f"$(shell touch {pwned})"
    out = tmp_path / "seen.json"
    env = make_env(tmp_path / "home", FAKE_OUT=str(out))
    result = make(
        "run",
        f"UV_PYTHON={value}",
        f"SOME_SETTING={value}",
        home=tmp_path / "home",
        env=env,
        py=str(fake_python(tmp_path)),
    )
    assert not pwned.exists()
    assert result.returncode == 0, result.stderr
    seen = json.loads(out.read_text())["env"]
    assert seen["UV_PYTHON"] == value and seen["SOME_SETTING"] == value


def test_the_tool_variables_keep_their_defaults(tmp_path: Path) -> None:
    """With nothing given, the raw-value lines changed no default: uv found on PATH (else
    ~/.local/bin/uv), the venv's python, the stamp file."""
    home = tmp_path / "home"
    env = make_env(home)
    env.pop("UV", None)
    found = shutil.which("uv", path=env.get("PATH"))
    uv = found or f"{home}/.local/bin/uv"

    def dry(*args: str) -> str:
        result = subprocess.run(
            ["make", "--no-print-directory", "-C", str(ROOT), "-n", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    setup = dry("-W", "pyproject.toml", "setup").splitlines()
    assert f"{uv} sync --frozen --compile-bytecode" in setup and "touch .venv/.setup-stamp" in setup, setup
    recipe = dry("-o", ".venv/.setup-stamp", "test")
    # The tests write bytecode even where the environment says not to (the Makefile says why).
    pytest = "PYTHONDONTWRITEBYTECODE= .venv/bin/python -m pytest"
    # One worker more than there are cores (the Makefile says why), the heaviest modules first.
    workers = (os.cpu_count() or 1) + 1
    assert f'{pytest} -m "not serial" -n {workers} --dist loadscope --no-loadscope-reorder' in recipe, recipe
    assert f"{pytest} -m serial " in recipe, recipe


def test_every_target_that_runs_a_launch_program_passes_args(tmp_path: Path) -> None:
    """`make models ARGS="--registry_dir DIR"` lists DIR, as `make run ARGS=...` wrote it: every
    recipe that runs a `launch` program hands ARGS over (the README's examples use it)."""
    runs = [
        line for line in MAKEFILE.read_text().splitlines() if line.startswith("\t") and "-m launch." in line
    ]
    assert runs and not [line for line in runs if "$(ARGS)" not in line]
    done = subprocess.run(
        ["make", "-n", "models", f"ARGS=--registry_dir {tmp_path}"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0 and f"-m launch.models --registry_dir {tmp_path}" in done.stdout, done.stdout
