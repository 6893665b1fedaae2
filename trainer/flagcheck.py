"""`python -m trainer.flagcheck`: the trainer's own flag rules, applied before any job starts.

The trainer's flags are checked by the trainer's parsers (`trainer.config`, `trainer.prepare`),
which is where they live; this entry point lets the front door (`make run`, `make schedule`)
apply those same parsers to the flags a run would hand the jobs, in milliseconds and before any
request, instead of the job failing on its first line hours later. It imports no TensorFlow.

    stdin:  {"trainer.task": ["--epochs=0", ...], "trainer.prepare": ["--shards=0", ...]}
    stdout: [{"program": "trainer.task", "flags": ["epochs"], "message": "..."}, ...]

Every flag is parsed on its own (so every bad flag is named, not only the first), then the whole
command line once, for the rules between flags (e.g. `--weights imagenet` with `--backbone
tiny`). The folders a job gets from Vertex (`--data_dir`, `AIP_MODEL_DIR`) are stood in for.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

# The flags a job's folders fill in (from the dataset artifact or Vertex's AIP_* variables).
STAND_INS = {
    "trainer.task": ["--data_dir=/check/dataset", "--model_dir=/check/model"],
    "trainer.prepare": ["--output_dir=/check/dataset"],
}


class _FlagError(Exception):
    pass


def _raise(self: argparse.ArgumentParser, message: str) -> NoReturn:
    raise _FlagError(message)


def _parsers() -> dict[str, tuple[Callable[[Sequence[str]], Any], Callable[[Sequence[str]], Any]]]:
    """Per program: its argparse parser alone (each flag's own rule) and its whole parse (the
    rules between flags too)."""
    from trainer import config, prepare

    return {
        "trainer.task": (
            lambda argv: config.build_parser().parse_args(argv),
            lambda argv: config.parse_args(argv, environ={}),
        ),
        "trainer.prepare": (
            lambda argv: prepare.build_parser().parse_args(argv),
            lambda argv: prepare.parse_args(argv, environ={}),
        ),
    }


def _flag_of(arg: str) -> str:
    return arg.split("=", 1)[0].removeprefix("--")


def problems(program: str, argv: Sequence[str]) -> list[dict[str, Any]]:
    """Every problem the program's own parser finds in `argv`, one per flag."""
    parse_one, parse_all = _parsers()[program]
    stand_ins = STAND_INS[program]
    original = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = _raise  # type: ignore[method-assign]
    found: list[dict[str, Any]] = []
    try:
        for arg in argv:
            try:
                parse_one([*stand_ins, arg])
            except _FlagError as err:
                found.append({"program": program, "flags": [_flag_of(arg)], "message": str(err)})
        if not found:
            try:
                parse_all([*stand_ins, *argv])
            except _FlagError as err:
                named = list(dict.fromkeys(re.findall(r"--([a-z_]+)", str(err))))
                found.append({"program": program, "flags": named, "message": str(err)})
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]
    return found


def main() -> int:
    request = json.load(sys.stdin)
    unknown = sorted(set(request) - set(STAND_INS))
    if unknown:
        sys.stderr.write(f"unknown programs {unknown}; allowed: {sorted(STAND_INS)}\n")
        return 2
    out = [p for program, argv in request.items() for p in problems(program, argv)]
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
