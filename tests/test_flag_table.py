"""docs/contracts.md's flag tables hold the truth: sections 1 (`python -m trainer.task`) and 5
(`python -m trainer.prepare`) list every flag of the trainer's own parser and no other, each with
its default, and say rightly which flags the pipeline hands the job. "Set by the pipeline" is
what the functions the planning step runs really emit (`build_trainer_args`,
`build_prepare_args`); "(tunable)" marks exactly the flags a tuning job's search space may
declare. Fast: no TensorFlow (the parsers are built without it; tests/test_contracts.py pins
that), no pipeline compilation."""

from __future__ import annotations

import argparse
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.model_flags import MODEL_FLAG_VALUES

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ROOT / "docs" / "contracts.md"
SET_BY = "Set by the pipeline"


# --- reading the tables ------------------------------------------------------------------------


def section(text: str, command: str) -> str:
    """The `## ...` section whose heading names `command` (e.g. `python -m trainer.task`)."""
    parts = re.split(r"(?m)^(?=## )", text)
    found = [p for p in parts if p.startswith("## ") and f"`{command}`" in p.splitlines()[0]]
    assert len(found) == 1, f"docs/contracts.md needs one '## ...' heading naming `{command}`"
    return found[0]


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def flag_table(text: str, command: str) -> dict[str, dict[str, str]]:
    """The first table of the command's section: {flag: {column header: cell}}. A row may name
    several flags (`--validation_fraction`, `--test_fraction`); each gets the row's cells."""
    lines = [line for line in section(text, command).splitlines()]
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    assert start is not None, f"the `{command}` section has no table"
    header = cells(lines[start])
    assert re.fullmatch(r"[|\s:-]+", lines[start + 1]), f"the `{command}` table has no separator row"
    rows: dict[str, dict[str, str]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        row = dict(zip(header, cells(line), strict=True))
        flags = re.findall(r"`--(\w+)`", row[header[0]])
        assert flags, f"a row of the `{command}` table names no flag: {line}"
        for flag in flags:
            assert flag not in rows, f"--{flag} has two rows in the `{command}` table"
            rows[flag] = row
    return rows


def column(row: dict[str, str], prefix: str) -> str:
    names = [name for name in row if name.startswith(prefix)]
    assert len(names) == 1, f"the table needs one column headed '{prefix}...', has {list(row)}"
    return row[names[0]]


def claims_set(cell: str) -> bool:
    """A "Set by the pipeline" cell says no by starting with "no"; anything else says yes."""
    return not re.match(r"no\b", cell.strip(), flags=re.I)


def first_value(cell: str) -> str:
    """The value a Default cell starts with: its first `code` span, else its first word."""
    cell = cell.strip()
    if cell.startswith("`"):
        return cell[1:].split("`", 1)[0]
    return re.split(r"[\s,(]", cell, maxsplit=1)[0]


def default_agrees(cell: str, action: argparse.Action) -> bool:
    """Does a Default cell state the parser's default? A default of None (taken from the
    environment or from other flags at parse time) is prose, and is not checked."""
    if action.required:
        return cell.strip().lower().startswith("required")
    default = action.default
    if default is None:
        return True
    value = first_value(cell).lower()
    if isinstance(default, bool):
        return value in (("true", "on") if default else ("false", "off"))
    if isinstance(default, int | float):
        try:
            return float(value) == float(default)
        except ValueError:
            return False
    return value == str(default).lower()


# --- the truth ---------------------------------------------------------------------------------


def parser_flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {
        option[2:]: action
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and not isinstance(action, argparse._HelpAction)
    }


def call(func: Callable[..., Any], values: dict[str, Any], **overrides: Any) -> Any:
    """Calls a component's Python function with `values` for its parameters without defaults
    (and any overrides); a new required parameter fails here, naming it."""
    params = inspect.signature(func).parameters
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty]
    missing = [n for n in required if n not in values and n not in overrides]
    assert not missing, f"{func.__name__} has new required parameters {missing}: give this test a value"
    return func(**{n: values[n] for n in required if n not in overrides}, **overrides)


def emitted(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0][2:] for a in args if a.startswith("--")}


TRAINER_VALUES: dict[str, Any] = MODEL_FLAG_VALUES


def trainer_emits() -> set[str]:
    """Every flag `build_trainer_args` can hand a training job: with and without a fine-tuning
    fraction (it omits the flag below 0), with no search space (a tuning job's trials add those)."""
    from components import plan

    assert set(TRAINER_VALUES) == set(plan.MODEL_FLAGS), "give this test a value for each model flag"
    out: set[str] = set()
    for fraction in (-1.0, 0.5):
        args, _ = plan.build_trainer_args(
            "/data/prepared", 64, {**TRAINER_VALUES, "fine_tune_fraction": fraction}, plan.TUNABLE
        )
        out |= emitted(args)
    return out


def tunable(flags: set[str]) -> set[str]:
    """The flags a tuning job's search space may declare: those `build_trainer_args` accepts in one."""
    from components import plan

    out = set()
    for flag in flags:
        try:
            plan.build_trainer_args(
                "/d", 64, TRAINER_VALUES, plan.TUNABLE, search_space=[{"parameter_id": flag}]
            )
        except ValueError:
            continue
        out.add(flag)
    return out


def prepare_emits() -> set[str]:
    """Every flag `build_prepare_args` can hand the preparation job, over the three kinds of
    source, with and without a champion, with either engine."""
    from components import prepare as prepare_step

    func = prepare_step.build_prepare_args
    out: set[str] = set()
    for source in ("synthetic", "tfds:cassava", "folder:gs://bucket/leaves"):
        for champion in ([], ["a", "b"]):
            for engine in ("job", "beam"):
                out |= emitted(
                    list(
                        call(
                            func,
                            {"source": source, "image_size": 64},
                            champion_class_names=champion,
                            engine=engine,
                        )
                    )
                )
    return out


def trainer_parser() -> argparse.ArgumentParser:
    from trainer import config

    return config.build_parser()


def prepare_parser() -> argparse.ArgumentParser:
    from trainer import prepare

    return prepare.build_parser()


TABLES = {
    "python -m trainer.task": (trainer_parser, trainer_emits),
    "python -m trainer.prepare": (prepare_parser, prepare_emits),
}


# --- the tests ---------------------------------------------------------------------------------


def test_the_table_reader_reads_rows_claims_and_defaults() -> None:
    text = (
        "## 1. Run: `python -m x`\n\nIntro.\n\n| Flag | Default | Set by the pipeline (`f`) |\n|---|---|---|\n"
        "| `--a` | `auto` (or `none`) | `a` (tunable) |\n| `--b`, `--c` | 0.1 each | no: Vertex's |\n\n"
        "| `--z` | 1 | no |\n## 2. Next `python -m x`\n"
    )
    rows = flag_table(text.split("## 2.")[0], "python -m x")
    assert sorted(rows) == ["a", "b", "c"]
    assert claims_set(column(rows["a"], SET_BY)) and not claims_set(column(rows["b"], SET_BY))
    assert not claims_set("No") and claims_set("only when the parameter is >= 0")
    assert claims_set("`none`") and not claims_set("no: the default is the study's metric")
    assert [first_value(c) for c in ("`auto` (or `none`)", "0.1 each", "0 (off)", "2")] == [
        "auto",
        "0.1",
        "0",
        "2",
    ]
    parser = argparse.ArgumentParser()
    a = parser.add_argument("--a", default="auto")
    n = parser.add_argument("--n", type=float, default=1e-4)
    f = parser.add_argument("--f", action="store_true")
    r = parser.add_argument("--r", required=True)
    assert default_agrees("`auto`", a) and not default_agrees("true", a)
    assert default_agrees("0.0001", n) and not default_agrees("0.001", n)
    assert default_agrees("off", f) and not default_agrees("on", f)
    assert default_agrees("required", r) and not default_agrees("`x`", r)


@pytest.mark.parametrize("command", list(TABLES))
def test_the_table_lists_every_flag_of_the_parser_and_no_other(command: str) -> None:
    parser, _ = TABLES[command]
    rows = flag_table(CONTRACTS.read_text(), command)
    flags = parser_flags(parser())
    assert not (missing := sorted(set(flags) - set(rows))), (
        f"`{command}` flags missing from the table: {missing}"
    )
    assert not (extra := sorted(set(rows) - set(flags))), (
        f"the `{command}` table lists flags it lacks: {extra}"
    )


@pytest.mark.parametrize("command", list(TABLES))
def test_each_rows_default_is_the_parsers(command: str) -> None:
    parser, _ = TABLES[command]
    rows = flag_table(CONTRACTS.read_text(), command)
    flags = parser_flags(parser())
    wrong = [
        f"--{flag}: table {column(row, 'Default')!r}, parser {flags[flag].default!r}"
        for flag, row in rows.items()
        if flag in flags and not default_agrees(column(row, "Default"), flags[flag])
    ]
    assert not wrong, f"the `{command}` table's defaults are not the parser's: {wrong}"


@pytest.mark.parametrize("command", list(TABLES))
def test_set_by_the_pipeline_is_what_the_component_emits(command: str) -> None:
    _, emits = TABLES[command]
    rows = flag_table(CONTRACTS.read_text(), command)
    sent = emits()
    claimed = {flag for flag, row in rows.items() if claims_set(column(row, SET_BY))}
    assert not (said := sorted(claimed - sent)), (
        f"the `{command}` table says the pipeline sets {said}; it does not"
    )
    assert not (unsaid := sorted(sent - claimed)), (
        f"the `{command}` table says the pipeline does not set {unsaid}; it does"
    )


def test_tunable_marks_the_flags_a_search_space_may_declare() -> None:
    rows = flag_table(CONTRACTS.read_text(), "python -m trainer.task")
    marked = {flag for flag, row in rows.items() if "(tunable)" in column(row, SET_BY)}
    truth = tunable(set(parser_flags(trainer_parser())))
    assert truth, "no flag is tunable: the probe no longer reaches build_trainer_args' search-space check"
    assert marked == truth, f"marked (tunable): {sorted(marked)}; a search space may declare {sorted(truth)}"
