"""The doc tables the code holds, made from it: `make docs` writes them between their markers,
and tests/test_docs.py fails while one is stale (as tests/test_pipeline.py does for compiled/).

- docs/contracts.md, `python -m trainer.task` and `python -m trainer.prepare`: every flag of
  the parser (`trainer.config.build_parser`, `trainer.prepare.build_parser`), its default and
  help, and whether the planning step sends it: what `components.plan.plan_jobs` really hands
  the training job, and `components.prepare.build_prepare_args` the preparation job, "(tunable)"
  where a tuning job's search space may declare the flag (`components.plan.TUNABLE`).
- docs/contracts.md, metrics.json's keys: `trainer.contract.METRICS`.
- docs/options.md, "Every parameter": each row of `pipeline.PARAMETERS`; "The rules": every rule
  that is not on a row (`pipeline.options.RULES`, each capability's module its own); the search
  space's rules (`pipeline.options.tuning.SEARCH_SPACE_RULES`).
- docs/vertex.md, the GPUs per N1 machine type and per region: `components.hardware`'s tables.
- docs/architecture.md, "Layout": each package and module, with its docstring's first sentence.
- docs/architecture.md, "Core and extras": every file that names each extra (its row's names).
- docs/guarantees.md, the barrage and the fault suite: each row's cases, as pytest collects them.

Run as `python -m tests.doctables` (what `make docs` does). No TensorFlow: the parsers and the
planning functions are built without it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def markers(name: str) -> tuple[str, str]:
    return f"<!-- BEGIN GENERATED {name}: make docs -->", f"<!-- END GENERATED {name} -->"


def cell(text: Any) -> str:
    """A table cell: one line, `|` escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(value: Any) -> str:
    if isinstance(value, bool):
        value = str(value).lower()
    return f"`{value}`"


# --- the commands' flags -----------------------------------------------------------------------


def _flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        action
        for action in parser._actions
        if action.option_strings and not isinstance(action, argparse._HelpAction)
    ]


# The sentence of a flag's help that gives a default argparse cannot hold (an environment
# variable, another flag's value): it goes into the Default column.
SAID_DEFAULT = re.compile(r"\s*Default: (.+?)\.(?:\s|$)")


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if action.default is None:
        said = SAID_DEFAULT.search(action.help or "")
        return cell(said.group(1)) if said else "none"
    text = _code(action.default)
    others = [c for c in action.choices or () if c != action.default]
    return f"{text} (also {', '.join(map(_code, others))})" if others else text


def _emitted(args: Iterable[str]) -> set[str]:
    return {a.split("=", 1)[0][2:] for a in args if a.startswith("--")}


def flag_table(
    parser: argparse.ArgumentParser,
    sent_always: set[str],
    sent_sometimes: set[str],
    sent_as: Callable[[str], str],
) -> str:
    """Flag | Default | Sent by the planning step | What it is."""
    lines = ["| Flag | Default | Sent by the planning step | What it is |", "|---|---|---|---|"]
    for action in _flags(parser):
        flag = action.option_strings[0][2:]
        if flag in sent_always:
            sent = sent_as(flag)
        elif flag in sent_sometimes:
            sent = f"{sent_as(flag)}, not always"
        else:
            sent = "no"
        help_ = SAID_DEFAULT.sub(" ", action.help or "").strip()
        lines.append(f"| `--{flag}` | {_default(action)} | {sent} | {cell(help_)} |")
    return "\n".join(lines) + "\n"


def planned(**overrides: Any) -> Any:
    """What the planning step (`components.plan.plan_jobs`) makes of the Vertex defaults, with
    `overrides`: every job's worker pools, as the jobs get them."""
    from kfp import dsl

    from components import plan
    from pipeline import dag

    values = {**_vertex_defaults(), **overrides}
    with contextlib.redirect_stdout(io.StringIO()):  # the step's log of its plan
        return plan.plan_jobs.python_func(
            image_uri="img",
            training_image_uri="img",
            cpu_image_uri="img",
            champion_class_names=[],
            champion_uri="",
            model_root="",
            pipeline_run="run",
            region="us-central1",
            dataflow_image_uri="",
            **{name: values[name] for name in dag.PLAN_PARAMETERS},
            **{
                name: dsl.Artifact(uri=f"gs://b/{name}")
                for name in ("prepare_job", "tuning_job", "training_job", "evaluation_job")
            },
        )


def trainer_flags() -> str:
    """`python -m trainer.task`'s flags as the planning step hands them to the training job;
    "(tunable)" on the flags a search space may declare."""
    from components import plan
    from trainer import config

    def sent(**overrides: Any) -> set[str]:
        return _emitted(planned(**overrides).training_pools[0]["container_spec"]["args"])

    always = sent()
    defaults = {p: v for p, v in _vertex_defaults().items() if p in plan.MODEL_FLAGS}
    # A flag sent for some values of its parameter only (`--fine_tune_fraction`, below 0 left to
    # the trainer): each model flag's parameter at other values.
    sometimes = set()
    for name, default in defaults.items():
        others = (
            [not default]
            if isinstance(default, bool)
            else [0, 0.5, 1]
            if isinstance(default, int | float)
            else []
        )
        for other in others:
            sometimes |= sent(**{name: other}) - always
    tunable = set(plan.TUNABLE)  # what build_trainer_args lets a search space declare

    def sent_as(flag: str) -> str:
        return _parameter(flag) + (" (tunable)" if flag in tunable else "")

    return flag_table(config.build_parser(), always, sometimes, sent_as)


def _vertex_defaults() -> dict[str, Any]:
    from pipeline import parameters_for

    return {q.name: q.default_for("vertex") for q in parameters_for("vertex")}


def _parameter(flag: str) -> str:
    """The pipeline parameter a sent flag carries, when it has the flag's name; else "yes"."""
    import pipeline

    return f"`{flag}`" if any(p.name == flag for p in pipeline.PARAMETERS) else "yes"


def prepare_flags() -> str:
    """`python -m trainer.prepare`'s flags, over the three kinds of source, with and without a
    champion, with either engine."""
    from components import prepare as step
    from trainer import prepare

    runs = [
        _emitted(step.build_prepare_args(source, 64, champion_class_names=champion, engine=engine))
        for source in ("synthetic", "tfds:cassava", "folder:gs://bucket/leaves")
        for champion in ([], ["a", "b"])
        for engine in ("job", "beam")
    ]
    always = set.intersection(*runs)
    return flag_table(prepare.build_parser(), always, set.union(*runs) - always, _parameter)


# --- the trainer's files -------------------------------------------------------------------------


def metrics_keys() -> str:
    """Key | Meaning: metrics.json's keys, as `trainer.contract.METRICS` declares them."""
    from trainer import contract

    lines = ["| Key | Meaning |", "|---|---|"]
    lines += [f"| `{key}` | {cell(meaning)} |" for key, meaning in contract.METRICS.items()]
    return "\n".join(lines) + "\n"


# --- the pipeline's parameters -----------------------------------------------------------------


def parameters() -> str:
    """Parameter | Type | Vertex default | Local default | Allowed | What it is."""
    import pipeline
    from pipeline.options import REQUIRED

    def shown(value: Any) -> str:
        if value is REQUIRED:
            return "from the settings"
        if isinstance(value, list | dict) and len(str(value)) > 40:
            return f"a {type(value).__name__} of {len(value)}"
        return cell(_code(value)) if value != "" else "`''`"

    lines = [
        "| Parameter | Type | Vertex default | Local default | Allowed | What it is |",
        "|---|---|---|---|---|---|",
    ]
    for p in pipeline.PARAMETERS:
        vertex = shown(p.default) if "vertex" in p.targets else "(local only)"
        local = shown(p.default_for("local")) if "local" in p.targets else "(Vertex only)"
        allowed = ", ".join(map(_code, p.choices))
        if p.bounds:
            low, high = p.bounds
            allowed = f"{low:g} to {high:g}" if high != float("inf") else f"{low:g} or more"
        lines.append(f"| `{p.name}` | {p.type.__name__} | {vertex} | {local} | {allowed} | {cell(p.help)} |")
    return "\n".join(lines) + "\n"


def rules() -> str:
    """Parameters | Rule | Source: each capability's `RULES` (`pipeline.options.RULES`)."""
    from pipeline.options import RULES

    return "| Parameters | Rule | Source |\n|---|---|---|\n" + RULES


def search_space_rules() -> str:
    """Rule | Source: what `search_space_problems` checks (`pipeline.options.tuning`)."""
    from pipeline.options.tuning import SEARCH_SPACE_RULES

    return "| Rule | Source |\n|---|---|" + SEARCH_SPACE_RULES


# --- the GPU tables ------------------------------------------------------------------------------


def gpus_n1() -> str:
    """Machine type | each N1 GPU: the counts `components.hardware` allows (`-`: none)."""
    from components import hardware

    columns = hardware.gpu_tables()["n1_columns"]
    lines = [
        "| Machine type | " + " | ".join(c.removeprefix("NVIDIA_TESLA_") for c in columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for machine in hardware.N1_GPU_COUNTS:
        counts = [",".join(map(str, hardware.allowed_counts(machine, gpu))) or "-" for gpu in columns]
        lines.append(f"| {machine} | " + " | ".join(counts) + " |")
    return "\n".join(lines) + "\n"


def gpus_regions() -> str:
    """Region | the GPUs `components.hardware.REGION_GPUS` says it offers for training."""
    from components import hardware

    order = hardware.gpu_tables()["gpus"]
    lines = ["| Region | GPUs |", "|---|---|"]
    for region, gpus in hardware.REGION_GPUS.items():
        lines.append(f"| {region} | {', '.join(f'`{g}`' for g in order if g in gpus)} |")
    return "\n".join(lines) + "\n"


# --- the layout ---------------------------------------------------------------------------------

LAYOUT_PACKAGES = ("trainer", "launch", "pipeline", "components", "local")


def summary(path: Path) -> str:
    """What a module says it is: its docstring's first sentence (a module without one is refused)."""
    import ast

    doc = ast.get_docstring(ast.parse(path.read_text()))
    if not doc:
        raise ValueError(f"{path.relative_to(ROOT)} has no docstring: say in one sentence what it is")
    paragraph = " ".join(doc.split("\n\n")[0].split())
    sentence = re.match(r"(.+?(?<!e\.g)(?<!i\.e)(?<!\.)\.)(?:\s|$)", paragraph)  # not at "..."
    return sentence.group(1) if sentence else paragraph


def layout() -> str:
    """Path | What it is: each package of `LAYOUT_PACKAGES`, its subpackages and its modules."""
    lines = ["| Path | What it is |", "|---|---|"]
    for package in LAYOUT_PACKAGES:
        for init in sorted((ROOT / package).rglob("__init__.py")):
            folder = init.parent
            lines.append(f"| `{folder.relative_to(ROOT)}/` | {cell(summary(init))} |")
            for module in sorted(folder.glob("*.py")):
                if module.name != "__init__.py":
                    lines.append(f"| `{module.relative_to(ROOT)}` | {cell(summary(module))} |")
    lines.append(f"| `pipeline.py` | {cell(summary(ROOT / 'pipeline.py'))} |")
    return "\n".join(lines) + "\n"


# --- what names each extra, and how many cases each suite holds ------------------------------------

NOT_GREPPED = ("compiled/", "uv.lock", "benchmarks/results/")
"""Written by `make compile`, `uv lock` and `make bench`, never by hand."""


def extras() -> dict[str, list[str]]:
    """docs/architecture.md's "Core and extras" table: each extra's name -> its names (the code
    spans of its last column)."""
    section = (ROOT / "docs" / "architecture.md").read_text().split("\n## Core and extras\n", 1)[1]
    table = section.split(markers("extras-files")[0], 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()]
    rows = [row for row in rows if len(row) > 1 and not set(row[0]) <= set("-: ")][1:]  # less the header
    names = {row[0].split(" (")[0]: re.findall(r"`([^`]+)`", row[-1]) for row in rows}
    if not all(names.values()):
        raise ValueError(f"docs/architecture.md: an extra without names in its last column: {names}")
    return names


def extras_files() -> str:
    """Extra | Code | Tests | Docs, build and settings: every committed file holding one of its names."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    texts = {}
    for name in listed.stdout.splitlines():
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if not name.startswith(NOT_GREPPED):
                texts[name] = (ROOT / name).read_text()
    lines = ["| Extra | Code | Tests | Docs, build and settings |", "|---|---|---|---|"]
    for extra, names in extras().items():
        naming = sorted(path for path, text in texts.items() if any(n in text for n in names))
        tests = [p for p in naming if p.startswith("tests/")]
        code = [p for p in naming if p.endswith(".py") and p not in tests]
        rest = [p for p in naming if p not in code and p not in tests]
        spans = (", ".join(f"`{p}`" for p in group) or "none" for group in (code, tests, rest))
        lines.append(f"| {extra} | {' | '.join(spans)} |")
    return "\n".join(lines) + "\n"


def suite_cases() -> str:
    """Suite | Cases: each row of docs/guarantees.md's table keeps its first cell; its cases are
    the tests `pytest --collect-only` finds in the files that cell names."""
    begin, end = markers("suite-cases")
    rows = (ROOT / "docs" / "guarantees.md").read_text().split(begin, 1)[1].split(end, 1)[0].splitlines()
    cells = [row.strip("|").split("|")[0].strip() for row in rows if row.startswith("| ")]
    suites = cells[1:]  # less the header
    files = {suite: re.findall(r"`(tests/[\w/]+\.py)`", suite) for suite in suites}
    named = sorted({f for group in files.values() for f in group})
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *named],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    count = {f: sum(line.startswith(f"{f}::") for line in collected) for f in named}
    lines = ["| Suite | Cases |", "|---|---|"]
    lines += [f"| {suite} | {sum(count[f] for f in group)} |" for suite, group in files.items()]
    return "\n".join(lines) + "\n"


TABLES: dict[str, tuple[str, Callable[[], str]]] = {
    "trainer-flags": ("docs/contracts.md", trainer_flags),
    "prepare-flags": ("docs/contracts.md", prepare_flags),
    "metrics-keys": ("docs/contracts.md", metrics_keys),
    "parameters": ("docs/options.md", parameters),
    "rules": ("docs/options.md", rules),
    "search-space-rules": ("docs/options.md", search_space_rules),
    "layout": ("docs/architecture.md", layout),
    "extras-files": ("docs/architecture.md", extras_files),
    "suite-cases": ("docs/guarantees.md", suite_cases),
    "gpus-n1": ("docs/vertex.md", gpus_n1),
    "gpus-regions": ("docs/vertex.md", gpus_regions),
}


def written(text: str, name: str, table: str) -> str:
    """`text` with the table between the markers of `name` (each exactly once)."""
    begin, end = markers(name)
    if text.count(begin) != 1 or text.count(end) != 1:
        raise ValueError(f"the doc needs each of {begin} and {end} exactly once")
    head, rest = text.split(begin)
    return f"{head}{begin}\n{table}{end}{rest.split(end)[1]}"


def stale() -> list[str]:
    """The tables whose doc does not hold what the code makes, as `name (doc)`."""
    out = []
    for name, (doc, make) in TABLES.items():
        text = (ROOT / doc).read_text()
        if written(text, name, make()) != text:
            out.append(f"{name} ({doc})")
    return out


def main() -> int:
    for name, (doc, make) in TABLES.items():
        path = ROOT / doc
        text = path.read_text()
        new = written(text, name, make())
        if new != text:
            path.write_text(new)
            print(f"make docs: wrote {name} into {doc}")
    from launch import settings  # env.sh.example is the settings' own text, whole

    if (ROOT / "env.sh.example").read_text() != settings.example():
        (ROOT / "env.sh.example").write_text(settings.example())
        print("make docs: wrote env.sh.example")
    return 0


if __name__ == "__main__":
    sys.exit(main())
