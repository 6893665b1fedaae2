"""The trainer image's Dockerfile and build context: hadolint-clean, everything from the lock
(TensorFlow and its CUDA libraries), Reduction Server's plugin in its own stage."""

from __future__ import annotations

import itertools
import json
import posixpath
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ci.tools import ROOT, run, tool

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
# What the image needs, and all it may see.
CONTEXT = {"Dockerfile", "Dockerfile.serving", "trainer", "pyproject.toml", "uv.lock"}


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def instructions(text: str) -> list[Instruction]:
    """Dockerfile instructions, with line continuations joined and comments dropped."""
    result: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        result.append(Instruction(keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return result


def final_stage(items: list[Instruction]) -> list[Instruction]:
    starts = [i for i, item in enumerate(items) if item.keyword == "FROM"]
    assert starts, "no FROM"
    return items[starts[-1] :]


def named_stage(items: list[Instruction], name: str) -> list[Instruction]:
    """The instructions of the stage `FROM ... AS name`, its FROM first."""
    starts = [i for i, item in enumerate(items) if item.keyword == "FROM"] + [len(items)]
    for begin, end in itertools.pairwise(starts):
        words = items[begin].args.split()
        if len(words) == 3 and words[1].upper() == "AS" and words[2] == name:
            return items[begin:end]
    raise AssertionError(f"no stage named {name!r}")


def lineage(items: list[Instruction], name: str) -> list[Instruction]:
    """Every instruction that makes the image of stage `name`: its parent stage's first (a stage
    `FROM <another stage> AS name` inherits that stage's layers, ENV, USER and ENTRYPOINT)."""
    own = named_stage(items, name)
    parent = own[0].args.split()[0]
    try:
        return [*lineage(items, parent), *own[1:]]
    except AssertionError:  # an image, not a stage of this file
        return own


@pytest.fixture(scope="module")
def stage() -> list[Instruction]:
    """The `trainer` stage with what it inherits: the image of the GPU jobs (training, tuning)."""
    return lineage(instructions(DOCKERFILE.read_text()), "trainer")


@pytest.fixture(scope="module")
def cpu_stage() -> list[Instruction]:
    """The `cpu` stage with what it inherits: the preparation and evaluation jobs' image."""
    return lineage(instructions(DOCKERFILE.read_text()), "cpu")


@pytest.fixture(scope="module")
def reduction_stage() -> list[Instruction]:
    return named_stage(instructions(DOCKERFILE.read_text()), "reduction-server")


def locked_version(name: str) -> str:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    versions = {p["version"] for p in lock["package"] if p["name"] == name}
    assert len(versions) == 1, f"uv.lock locks {name} at {sorted(versions) or 'no version'}"
    return versions.pop()


# --- hadolint ---------------------------------------------------------------------------------


def hadolint(path: Path, home: Path) -> tuple[int, str]:
    return run([tool("hadolint"), "--no-color", "--format", "tty", path], cwd=path.parent, home=home)


def test_hadolint_reports_nothing(tmp_path: Path) -> None:
    code, output = hadolint(DOCKERFILE, tmp_path)
    assert (code, output) == (0, ""), f"hadolint findings:\n{output}"


def test_hadolint_does_report_a_bad_dockerfile(tmp_path: Path) -> None:
    """The check above is only worth something if this hadolint does find things."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN pip install requests\nUSER root\n")
    code, output = hadolint(bad, tmp_path)
    assert code != 0
    for rule in ("DL3006", "DL3013", "DL3002"):  # untagged image, unpinned pip, root last
        assert rule in output, output


# --- the base image and the lock ----------------------------------------------------------------

BASE = re.compile(
    r"^python:(?P<version>3\.\d+)(?:\.\d+)?-slim-(?P<debian>\w+)(?:@sha256:(?P<digest>[0-9a-f]{64}))?$"
)


def lock_python_minor() -> str:
    """The one Python minor pyproject.toml allows (`>=3.11,<3.12`): the lock's."""
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    match = re.fullmatch(r">=(3\.\d+),<3\.(\d+)", spec.replace(" ", ""))
    assert match and int(match[2]) == int(match[1].split(".")[1]) + 1, spec
    return match[1]


def test_base_is_plain_python_of_the_locked_version(stage: list[Instruction]) -> None:
    """No TensorFlow, CUDA or cuDNN from the base: all of them come from the lock (the `gpu`
    group), so the image's TF finds exactly the CUDA libraries its RUNPATHs name."""
    image = stage[0].args.split()[0]
    match = BASE.match(image)
    assert match, f"trainer stage FROM {image!r}: want python:<3.N>[.P]-slim-<debian>[@sha256:...]"
    assert match["version"] == lock_python_minor(), (
        f"the base image carries Python {match['version']} but the lock is for {lock_python_minor()}"
    )


def test_only_the_drivers_folders_are_on_the_library_path(stage: list[Instruction]) -> None:
    """The host's driver (libcuda.so.1) is mounted under /usr/local/nvidia on Vertex's and GKE's
    GPU machines; a CUDA toolkit folder on LD_LIBRARY_PATH would win over TF's RUNPATHs (the
    loader searches LD_LIBRARY_PATH first) and could load another CUDA than the locked one."""
    env: dict[str, str] = {}
    for item in stage:
        if item.keyword == "ENV":
            env.update(dict(word.split("=", 1) for word in shlex.split(item.args)))
    folders = env.get("LD_LIBRARY_PATH", "").split(":")
    assert "/usr/local/nvidia/lib64" in folders, env
    assert not [f for f in folders if "cuda" in f], folders
    assert env.get("NVIDIA_DRIVER_CAPABILITIES") == "compute,utility"
    assert env.get("PATH", "").split(":")[0] == "/usr/local/nvidia/bin", "nvidia-smi for make gpu-check"


def test_tf_keras_is_locked_to_tensorflows_minor() -> None:
    """tf-keras must track TensorFlow's minor version (see trainer/_tf.py)."""
    minor = locked_version("tensorflow").split(".")[:2]
    assert locked_version("tf-keras").split(".")[:2] == minor


def test_uv_stage_is_pinned() -> None:
    froms = [i.args.split() for i in instructions(DOCKERFILE.read_text()) if i.keyword == "FROM"]
    uv_images = [f[0] for f in froms if f[0].startswith("ghcr.io/astral-sh/uv")]
    assert len(uv_images) == 1, froms
    assert re.fullmatch(r"ghcr\.io/astral-sh/uv:\d+\.\d+\.\d+(@sha256:[0-9a-f]{64})?", uv_images[0])


def installs(items: list[Instruction]) -> list[tuple[int, str]]:
    """(position, RUN) of each install from the lock."""
    return [(n, i.args) for n, i in enumerate(items) if i.keyword == "RUN" and "uv pip install" in i.args]


def test_dependencies_come_from_the_lock_before_the_code(stage: list[Instruction]) -> None:
    keywords = [(i.keyword, i.args) for i in stage]
    copy_lock = next(n for n, (k, a) in enumerate(keywords) if k == "COPY" and "uv.lock" in a.split())
    runs = installs(stage)
    copy_code = next(n for n, (k, a) in enumerate(keywords) if k == "COPY" and a.split()[0] == "trainer/")
    assert runs and copy_lock < runs[0][0] and runs[-1][0] < copy_code, "COPY lock, install, COPY trainer/"
    for _, run_args in runs:
        assert "uv export" in run_args and "--frozen" in run_args, run_args
        assert "--require-hashes --compile-bytecode -r /tmp/requirements.txt" in run_args, run_args
    gpu = [a for _, a in runs if "--only-group trainer --only-group gpu" in a]
    assert gpu, "the GPU jobs' image installs the gpu group"
    # The build fails, not the first GPU job, when TF is not a CUDA build.
    assert "is_cuda_build" in gpu[-1], gpu[-1]


def test_the_cpu_image_has_no_cuda_wheels(cpu_stage: list[Instruction], stage: list[Instruction]) -> None:
    """The CPU jobs' image installs the trainer group alone (the gpu group's nvidia-* wheels are
    most of the GPU image's download: docs/vertex.md#the-trainer-image), imports it, and has
    the trainer's code and entry point; the dataflow image is built on it."""
    runs = installs(cpu_stage)
    assert runs and not [a for _, a in runs if "gpu" in a.split()], runs
    assert "--only-group trainer" in runs[0][1] and "import tensorflow" in runs[0][1], runs
    assert [i for i in cpu_stage if i.keyword == "COPY" and i.args.split()[0] == "trainer/"]
    assert [i.args for i in cpu_stage if i.keyword == "ENTRYPOINT"] == [
        i.args for i in stage if i.keyword == "ENTRYPOINT"
    ]
    assert stage[0] == cpu_stage[0], "both on the same base"
    dataflow = named_stage(instructions(DOCKERFILE.read_text()), "dataflow")
    assert dataflow[0].args.split()[0] == "cpu", dataflow[0]


def test_environment(stage: list[Instruction]) -> None:
    env: dict[str, str] = {}
    for item in stage:
        if item.keyword == "ENV":
            env.update(dict(word.split("=", 1) for word in shlex.split(item.args)))
    for key in ("PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "TF_USE_LEGACY_KERAS"):
        assert env.get(key) == "1", f"ENV {key}=1 missing ({env})"
    # `python -m trainer.task` resolves from any working directory the platform picks.
    assert env.get("PYTHONPATH") == "/app"


def test_entry_point_runs_the_trainer_and_can_be_replaced(stage: list[Instruction]) -> None:
    entrypoints = [i.args for i in stage if i.keyword == "ENTRYPOINT"]
    assert len(entrypoints) == 1, entrypoints
    # Exec form: signals reach python directly, and Vertex's containerSpec.command replaces it
    # whole (the pipeline runs `python -m trainer.prepare` that way).
    assert json.loads(entrypoints[0]) == ["python", "-m", "trainer.task"]
    assert not [i for i in stage if i.keyword == "CMD"], "containerSpec.args are the only flags"


def test_runs_as_root_explicitly_so_the_tuning_metric_can_be_written(stage: list[Instruction]) -> None:
    """Root, on purpose: Vertex's metric folder is reported root-only (cloudml-hypertune#6), and
    a trial that cannot write its metric ends INFEASIBLE. Explicit, so that a base image which
    switched to another user could not silently change it, and justified in the Dockerfile."""
    users = [i.args for i in stage if i.keyword == "USER"]
    assert users, "no USER: write the decision down (USER 0:0)"
    user, _, group = users[-1].partition(":")
    assert user in ("root", "0") and group in ("", "root", "0"), users[-1]
    text = DOCKERFILE.read_text()
    # hadolint's DL3002 (last USER is root) is silenced for that line alone, with the reason.
    assert re.search(r"^# hadolint ignore=DL3002\nUSER ", text, re.MULTILINE), (
        "ignore DL3002 on the USER line"
    )
    assert "cloudml-hypertune#6" in text, "the Dockerfile must say why the image runs as root"
    # No unprivileged user left half set up: nothing creates one the image does not run as.
    assert not [i for i in stage if i.keyword == "RUN" and "useradd" in i.args]


def test_hadolint_ignores_nothing_but_root_as_the_last_user_and_the_unpinned_plugin() -> None:
    """DL3002 for the USER line (above); DL3008 (unpinned apt package) only while Reduction
    Server's plugin waits for its version to be read from a build (the section below)."""
    text = DOCKERFILE.read_text()
    ignored = re.findall(r"#\s*hadolint\s+(?:global\s+)?ignore=(\S+)", text)
    assert sorted(ignored) in (["DL3002", "DL3008"], ["DL3002"]), ignored
    if "DL3008" in ignored:
        # On the plugin's RUN alone, with the way to pin it.
        assert re.search(r"^# hadolint ignore=DL3008\nRUN apt-get update", text, re.MULTILINE)
        assert (
            "TODO(pin)" in text and "dpkg-query trainer-reduction-server -W google-reduction-server" in text
        )


# --- Reduction Server's NCCL plugin (docs/architecture.md#reduction-server) -----------------------

# Google's prerequisite for a custom container (Vertex AI, "Distributed training", Reduction Server):
# the google-reduction-server package from this apt repository, signed by this key.
REDUCTION_SERVER_DOCS = (
    "https://cloud.google.com/vertex-ai/docs/training/distributed-training"
    "#reduce_training_time_with_reduction_server"
)
PLUGIN_REPOSITORY = "https://packages.cloud.google.com/apt google-fast-socket main"
PLUGIN_KEY = "https://packages.cloud.google.com/apt/doc/apt-key.gpg"
PLUGIN_PACKAGE = "google-reduction-server"


def plugin_steps(stage: list[Instruction]) -> tuple[int, list[str]]:
    """The position of the RUN that installs the plugin, and its `&&`-separated commands."""
    runs = [(n, i.args) for n, i in enumerate(stage) if i.keyword == "RUN" and PLUGIN_PACKAGE in i.args]
    assert len(runs) == 1, f"want one RUN installing {PLUGIN_PACKAGE}, got {runs}"
    n, args = runs[0]
    return n, [" ".join(step.split()) for step in args.split("&&")]


def test_reduction_server_plugin_comes_from_googles_repository_with_its_key(
    reduction_stage: list[Instruction],
) -> None:
    _, steps = plugin_steps(reduction_stage)
    fetch_key = [s for s in steps if PLUGIN_KEY in s]
    assert len(fetch_key) == 1, steps
    keyring = re.search(r"\|\s*gpg .*--dearmor -o (\S+)$", fetch_key[0])
    assert keyring, f"the key is stored as a keyring by gpg --dearmor: {fetch_key[0]}"
    assert fetch_key[0].startswith("curl -fsSL "), "curl fails the build on an HTTP error (-f)"
    source = [s for s in steps if PLUGIN_REPOSITORY in s]
    assert len(source) == 1, steps
    assert f"deb [signed-by={keyring[1]}] {PLUGIN_REPOSITORY}" in source[0], source[0]
    assert re.search(r"> /etc/apt/sources\.list\.d/[\w.-]+\.list$", source[0]), source[0]
    # apt-key would trust the key for every repository (and is gone from newer apt).
    assert not [s for s in steps if re.search(r"(^|[\s|])apt-key\s", s)], steps


def test_reduction_server_plugin_is_installed_after_its_repository_and_lists_are_dropped(
    reduction_stage: list[Instruction],
) -> None:
    _, steps = plugin_steps(reduction_stage)
    source = next(n for n, s in enumerate(steps) if PLUGIN_REPOSITORY in s)
    install = next(n for n, s in enumerate(steps) if re.search(rf"\b{PLUGIN_PACKAGE}\b", s))
    assert "apt-get update" in steps[source + 1 : install], "the repository's lists are read first"
    assert re.fullmatch(
        rf"apt-get install -y --no-install-recommends {PLUGIN_PACKAGE}(=\S+)?", steps[install]
    ), steps[install]
    assert "rm -rf /var/lib/apt/lists/*" in steps[install + 1 :], steps
    # An NCCL plugin is a shared library: a package without one fails the build.
    assert steps[-1] == f"dpkg -L {PLUGIN_PACKAGE} | grep '\\.so'", steps[-1]


def test_reduction_server_plugin_is_only_in_its_own_stage_under_pipefail(
    stage: list[Instruction], reduction_stage: list[Instruction]
) -> None:
    """The unpinned package from a repository the project cannot read goes only into the image
    of a training job that asked for reducers (components.image builds it then), on top of the
    trainer stage, never into the image every other job runs."""
    assert not [i for i in stage if i.keyword == "RUN" and PLUGIN_PACKAGE in i.args]
    assert reduction_stage[0].args.split()[0] == "trainer", reduction_stage[0]
    n, _ = plugin_steps(reduction_stage)
    shells = [json.loads(i.args) for i in reduction_stage[:n] if i.keyword == "SHELL"]
    assert shells and "pipefail" in shells[-1] and shells[-1][0] == "/bin/bash", shells
    # Nothing in that stage changes what the trainer runs.
    assert not [i for i in reduction_stage if i.keyword in ("ENTRYPOINT", "CMD", "USER", "COPY")]


def test_dockerfile_cites_googles_reduction_server_prerequisite() -> None:
    text = DOCKERFILE.read_text()
    assert REDUCTION_SERVER_DOCS in text
    assert "docs/architecture.md#reduction-server" in text


# --- the build context ----------------------------------------------------------------------------


def dockerignore_patterns(text: str) -> list[tuple[re.Pattern[str], bool]]:
    """(regex, is_exception) per rule, as Docker's patternmatcher reads .dockerignore."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        line = posixpath.normpath(line[1:].strip() if exception else line).lstrip("/")
        rules.append((re.compile("^" + glob_to_regex(line) + "$"), exception))
    return rules


def glob_to_regex(pattern: str) -> str:
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out, i = out + "(.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif c == "*":
            out, i = out + "[^/]*", i + 1
        elif c == "?":
            out, i = out + "[^/]", i + 1
        elif c == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(c), i + 1
    return out


def sent(path: str, rules: list[tuple[re.Pattern[str], bool]]) -> bool:
    """Whether Docker sends `path` to the builder: the last rule matching it or a parent wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for regex, exception in rules:
        if any(regex.match(p) for p in prefixes):
            excluded = not exception
    return not excluded


@pytest.fixture(scope="module")
def rules() -> list[tuple[re.Pattern[str], bool]]:
    return dockerignore_patterns(DOCKERIGNORE.read_text())


def test_matcher_follows_docker_semantics() -> None:
    rules = dockerignore_patterns("*\n!keep/\n**/__pycache__\n")
    assert not sent("a.txt", rules) and not sent("dir/a.txt", rules)
    assert sent("keep/a.py", rules) and sent("keep/deep/b.py", rules)
    assert not sent("keep/__pycache__/a.pyc", rules)


def test_context_is_exactly_the_dockerfile_trainer_and_the_lock(rules: list) -> None:
    top_level = {p.name for p in ROOT.iterdir()}
    assert top_level >= CONTEXT
    assert {name for name in top_level if sent(name, rules)} == CONTEXT
    # Folders: nothing below any of them is let back in, except below trainer/.
    folders = {p.name for p in ROOT.iterdir() if p.is_dir()}
    assert {name for name in folders if sent(f"{name}/any/file.py", rules)} == {"trainer"}


@pytest.mark.parametrize(
    "path",
    [
        "tests/ci/test_dockerfile.py",
        ".venv/bin/python",
        "compiled/pipeline.json",
        "local_runs/run-1/report.html",
        "components/hardware.py",
        "pipeline.py",
        "README.md",
        ".git/HEAD",
        "env.sh",
        "trainer/__pycache__/task.cpython-311.pyc",
        "trainer/task.pyc",
    ],
)
def test_kept_out_of_the_context(path: str, rules: list) -> None:
    assert not sent(path, rules)


def test_every_trainer_source_file_is_in_the_context(rules: list) -> None:
    sources = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "trainer").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]
    assert "trainer/task.py" in sources
    assert [s for s in sources if not sent(s, rules)] == []


def test_everything_the_dockerfile_copies_is_in_the_context(stage: list[Instruction], rules: list) -> None:
    copies = [i.args.split() for i in stage if i.keyword in ("COPY", "ADD")]
    sources = [s for c in copies if not c[0].startswith("--from") for s in c[:-1]]
    assert {"pyproject.toml", "uv.lock", "trainer/"} <= set(sources)
    assert [s for s in sources if not sent(s.rstrip("/"), rules)] == []
