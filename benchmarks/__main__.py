"""`python -m benchmarks run [--bench NAME]`, `python -m benchmarks table`, `python -m benchmarks list`."""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from benchmarks import registry, table
from benchmarks.common import BENCHMARKS_MD, RESULTS_DIR, WORK_DIR, load_results, say, write_result


def regenerate_table(results_dir: Path, markdown: Path) -> None:
    table.update_markdown(markdown, table.render_table(load_results(results_dir), registry.TITLES))
    say(f"table regenerated in {markdown}")


def run(names: Sequence[str], results_dir: Path, work: Path, markdown: Path) -> int:
    failed = []
    for name in names:
        say(f"{name}: running")
        started = time.perf_counter()
        try:
            result = registry.module(name).run(work, results_dir)
        except Exception:  # noqa: BLE001 - report it, run the others, fail at the end
            failed.append(name)
            say(f"{name}: FAILED\n{traceback.format_exc()}")
            continue
        path = write_result(result, results_dir)
        say(f"{name}: {result.get('summary', '')} -> {path} ({time.perf_counter() - started:.0f}s)")
    regenerate_table(results_dir, markdown)
    if failed:
        say(f"failed: {', '.join(failed)}")
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="run benchmarks, write their results, regenerate the table")
    run_parser.add_argument(
        "--bench",
        action="append",
        metavar="NAME",
        help=f"a benchmark to run (repeatable or comma-separated; default: all of {', '.join(registry.BENCHMARKS)})",
    )
    run_parser.add_argument("--work-dir", type=Path, default=WORK_DIR, help="cached datasets and logs")
    table_parser = sub.add_parser("table", help="regenerate the BENCHMARKS.md table from the results")
    for p in (run_parser, table_parser):
        p.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
        p.add_argument("--markdown", type=Path, default=BENCHMARKS_MD)
    sub.add_parser("list", help="list the benchmarks")
    args = parser.parse_args(argv)

    if args.command == "list":
        for name, title in registry.TITLES.items():
            print(f"{name:10} {title}")  # noqa: T201
        return 0
    if args.command == "table":
        regenerate_table(args.results_dir, args.markdown)
        return 0
    names = [n.strip() for value in args.bench or [] for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in registry.BENCHMARKS]
    if unknown or (args.bench is not None and not names):  # `--bench ,` runs nothing, not all
        parser.error(
            f"unknown benchmark(s) {', '.join(unknown) or '(none named)'}; known: {', '.join(registry.BENCHMARKS)}"
        )
    return run(names or list(registry.BENCHMARKS), args.results_dir, args.work_dir, args.markdown)


if __name__ == "__main__":
    sys.exit(main())
