"""`python -m trainer.flagcheck`: the trainer's own parsers' verdict, with no argparse patch."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest

from tests.processes import ROOT
from trainer import config, flagcheck, prepare


def test_a_good_command_line_has_no_problem() -> None:
    assert flagcheck.problems("trainer.task", ["--epochs=3", "--backbone=tiny", "--weights=none"]) == []
    assert flagcheck.problems("trainer.prepare", ["--shards=4"]) == []


def _own_error(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str:
    """The message `parser` exits with on `argv`, got through a FlagParser built from it
    (argparse's public `parents`)."""
    copy = flagcheck.FlagParser(parents=[parser], add_help=False, prog=parser.prog)
    with pytest.raises(flagcheck.FlagError) as info:
        copy.parse_args(argv)
    return str(info.value)


@pytest.mark.parametrize(
    ("program", "arg", "flag"),
    [
        ("trainer.task", "--epochs=0", "epochs"),
        ("trainer.task", "--fine_tune_fraction=1.5", "fine_tune_fraction"),
        ("trainer.task", "--backbone=nope", "backbone"),
        ("trainer.task", "--no_such_flag=1", "no_such_flag"),
        ("trainer.prepare", "--shards=0", "shards"),
    ],
)
def test_every_bad_flag_is_named_with_its_parsers_own_message(program: str, arg: str, flag: str) -> None:
    builder = {"trainer.task": config.build_parser, "trainer.prepare": prepare.build_parser}[program]
    stand_ins = flagcheck.STAND_INS[program]
    [found] = flagcheck.problems(program, [arg])
    assert found == {
        "program": program,
        "flags": [flag],
        "message": _own_error(builder(), [*stand_ins, arg]),
    }


def test_each_flag_is_judged_alone_so_every_bad_one_is_named() -> None:
    found = flagcheck.problems("trainer.task", ["--epochs=0", "--batch_size=0", "--epochs=2"])
    assert [p["flags"] for p in found] == [["epochs"], ["batch_size"]]


def test_the_rules_between_flags_come_from_the_whole_parse() -> None:
    [found] = flagcheck.problems("trainer.task", ["--backbone=tiny", "--weights=imagenet"])
    assert found == {
        "program": "trainer.task",
        "flags": ["weights", "backbone"],
        "message": "--weights imagenet is not available for --backbone tiny; use --weights none or a weights file",
    }


def test_argparse_itself_is_left_alone() -> None:
    before = dict(vars(argparse.ArgumentParser))
    flagcheck.problems("trainer.task", ["--epochs=0", "--backbone=tiny", "--weights=imagenet"])
    flagcheck.problems("trainer.task", ["--backbone=tiny", "--weights=imagenet"])
    assert dict(vars(argparse.ArgumentParser)) == before
    with pytest.raises(SystemExit):  # a job's parser still exits
        config.build_parser().parse_args(["--epochs=0"])


def test_the_flag_parser_raises_where_argparse_exits() -> None:
    parser = flagcheck.FlagParser(prog="p")
    parser.add_argument("--n", type=int)
    with pytest.raises(flagcheck.FlagError, match="argument --n: invalid int value: 'x'"):
        parser.parse_args(["--n=x"])
    with pytest.raises(flagcheck.FlagError, match="p exits with status 0"):
        parser.exit()
    with pytest.raises(flagcheck.FlagError, match=r"^bye$"):
        parser.exit(1, "bye\n")


def _builder(
    parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser,
) -> argparse.ArgumentParser:
    parser = parser_class(prog="python -m example")
    parser.add_argument("--n", type=int, required=True)
    return parser


def _parse(argv: Sequence[str], parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> Any:
    parser = _builder(parser_class)
    ns = parser.parse_args(argv)
    if ns.n < 0:
        parser.error("--n must not be negative")
    return ns


def test_a_parse_given_the_flag_parser_raises_instead_of_exiting() -> None:
    with pytest.raises(flagcheck.FlagError) as info:
        _parse(["--n=-1"], flagcheck.FlagParser)
    assert str(info.value) == "--n must not be negative"
    with pytest.raises(flagcheck.FlagError) as info:
        _parse(["--n=x"], flagcheck.FlagParser)
    assert str(info.value) == "argument --n: invalid int value: 'x'"
    assert _parse(["--n=2"], flagcheck.FlagParser).n == 2
    with pytest.raises(SystemExit):  # a job's parse, without the flag parser, still exits
        _parse(["--n=x"])


@pytest.mark.process
def test_the_entry_point_answers_in_json() -> None:
    request = {"trainer.task": ["--epochs=0"], "trainer.prepare": []}
    out = subprocess.run(
        [sys.executable, "-m", "trainer.flagcheck"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    [found] = json.loads(out.stdout)
    assert (found["program"], found["flags"]) == ("trainer.task", ["epochs"])
