"""One measurement in its own process: `python -m benchmarks.child MODULE:FUNCTION ARGS.json OUT.json`.

Calls FUNCTION(**ARGS) and writes the dict it returns, plus the process's own peak RSS, to
OUT.json. Started by `common.run_child`.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common import rss_self_mib


def main(argv: Sequence[str]) -> int:
    if len(argv) != 3:
        raise SystemExit("usage: python -m benchmarks.child MODULE:FUNCTION ARGS.json OUT.json")
    target, args_path, out_path = argv
    module_name, _, function_name = target.partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    figures = dict(function(**json.loads(Path(args_path).read_text(encoding="utf-8"))))
    figures.setdefault("peak_rss_mib_self", rss_self_mib(peak=True))
    Path(out_path).write_text(json.dumps(figures), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
