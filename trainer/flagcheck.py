"""`python -m trainer.flagcheck`: the trainer's own flag rules, applied before any job starts.

The parsers of `trainer.config` and `trainer.prepare`, no TensorFlow:

    stdin:  {"trainer.task": ["--epochs=0", ...], "trainer.prepare": ["--shards=0", ...]}
    stdout: [{"program": "trainer.task", "flags": ["epochs"], "message": "..."}, ...]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

# The flags a job's folders fill in (from the dataset artifact or Vertex's AIP_* variables).
STAND_INS = {
    "trainer.task": ["--data_dir=/check/dataset", "--model_dir=/check/model"],
    "trainer.prepare": ["--output_dir=/check/dataset"],
}


class FlagError(Exception):
    """A parser refused the flags; the message is the one the job would exit with."""


class FlagParser(argparse.ArgumentParser):
    """An `ArgumentParser` that raises FlagError where a job's parser would exit (`--help` too)."""

    def error(self, message: str) -> NoReturn:
        raise FlagError(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise FlagError((message or f"{self.prog} exits with status {status}").strip())


def problems(program: str, argv: Sequence[str]) -> list[dict[str, Any]]:
    """Every problem the program's own parser finds in `argv`: each flag alone (so every bad flag
    is named), then (if all pass) the whole parse, for the rules between flags (e.g. `--weights
    imagenet` with `--backbone tiny`)."""
    from trainer import config, prepare

    module: Any = config if program == "trainer.task" else prepare
    stand_ins = STAND_INS[program]
    found: list[dict[str, Any]] = []
    for arg in argv:
        try:
            module.build_parser(FlagParser).parse_args([*stand_ins, arg])
        except FlagError as err:
            flag = arg.split("=", 1)[0].removeprefix("--")
            found.append({"program": program, "flags": [flag], "message": str(err)})
    if not found:
        try:
            module.parse_args([*stand_ins, *argv], environ={}, parser_class=FlagParser)
        except FlagError as err:
            named = list(dict.fromkeys(re.findall(r"--([a-z_]+)", str(err))))
            found.append({"program": program, "flags": named, "message": str(err)})
    return found


def main() -> int:
    request = json.load(sys.stdin)
    unknown = sorted(set(request) - set(STAND_INS))
    if unknown:
        sys.stderr.write(f"unknown programs {unknown}; allowed: {sorted(STAND_INS)}\n")
        return 2
    json.dump([p for program, argv in request.items() for p in problems(program, argv)], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
