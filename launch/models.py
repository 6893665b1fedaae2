"""`make models`: the local registry's models, each version with its figures, the dataset it was
evaluated on and which one is the champion.

Each version's record is its version.json (`local.steps.register_version`), read through
`local.registry` (no link followed, every document checked); a damaged version is listed as
damaged, with what is wrong, never skipped silently. On Vertex the same record is on each model
version (`components.registry.record_on_version`), as the console's Model Registry lists it.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Sequence
from typing import Any

from local import registry

VERSION_FIX = "restore {path} from a copy, or remove the version's folder"


def _row(version: str, record: dict[str, Any], champion: str) -> list[str]:
    evaluation = record.get("evaluation") or {}
    new = (evaluation.get("models") or {}).get("challenger") or {}
    comparison = evaluation.get("comparison") or {}
    gate = record.get("gate") or {}

    def figure(value: Any) -> str:
        return f"{value:.4f}" if isinstance(value, int | float) else "-"

    paired = ""
    figures = comparison.get("accuracy") if isinstance(comparison, dict) else None
    if isinstance(figures, dict) and "ci95" in figures:
        low, high = figures["ci95"]
        paired = f"{figures['difference']:+.4f} [{low:+.4f}, {high:+.4f}]"
    return [
        version + (" *" if version == champion else ""),
        str(record.get("created", "-")),
        figure(record.get("test_accuracy")),
        figure(new.get("accuracy")),
        figure(new.get("macro_f1")),
        str(evaluation.get("dataset_fingerprint", "-"))[:19],
        "promoted" if gate.get("promote") else "held" if gate else "-",
        paired or "-",
    ]


def model_table(registry_dir: str) -> list[tuple[str, list[list[str]]]]:
    """[(model display name, its rows)] of the registry at `registry_dir`, versions in order."""
    registry_fd = registry.open_registry(registry_dir, create=False)
    if registry_fd is None:
        return []
    out = []
    try:
        for folder in sorted(os.listdir(registry_fd)):
            if folder.startswith(".") or stat.S_ISREG(os.lstat(folder, dir_fd=registry_fd).st_mode):
                continue  # a plain file (a README) is no model's folder: the registry writes folders here
            where = os.path.join(os.path.abspath(registry_dir), folder)
            model_fd = None
            try:  # one damaged model is named in its row; the others are still listed
                model_fd = registry.open_model(registry_fd, registry_dir, folder, create=False)
                aliases = (registry.read_aliases(model_fd, where) or {}) if model_fd is not None else {}
            except registry.Damaged as err:
                if model_fd is not None:
                    os.close(model_fd)
                out.append((folder, [["-", f"damaged: {err.path} {err.problem}", *["-"] * 6]]))
                continue
            if model_fd is None:
                continue
            try:
                versions = sorted((v for v in os.listdir(model_fd) if registry.VERSION.fullmatch(v)), key=int)
                name, rows = folder, []
                for version in versions:
                    root = os.path.join(where, version)
                    try:
                        vfd = registry.open_folder(model_fd, version, root, VERSION_FIX)
                        if vfd is None:
                            continue
                        try:
                            record = registry.load(vfd, "version.json", root, "version", VERSION_FIX)
                        finally:
                            os.close(vfd)
                        name = str(record.get("model", name))
                        rows.append(_row(version, record, aliases.get("champion", "")))
                    except registry.Damaged as err:
                        rows.append([version, f"damaged: {err.path} {err.problem}", *["-"] * 6])
                    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
                        # Hand-edited: named in its row, never a traceback for the whole table.
                        problem = f"{type(err).__name__}: {err}"
                        rows.append([version, f"damaged: {root}/version.json ({problem})", *["-"] * 6])
                out.append((name, rows))
            finally:
                os.close(model_fd)
    finally:
        os.close(registry_fd)
    return out


HEADER = [
    "version",
    "registered",
    "test acc (own)",
    "accuracy",
    "macro F1",
    "dataset",
    "gate",
    "vs champion (accuracy, 95%)",
]


def _shown(text: str) -> str:
    """`text` with every character a terminal would act on (escape sequences, carriage returns)
    written as its escape: a registry's files are read as data, never as terminal commands."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def render(models: list[tuple[str, list[list[str]]]]) -> str:
    if not models:
        return "no models yet"
    lines = []
    for name, rows in [(_shown(n), [[_shown(c) for c in r] for r in rs]) for n, rs in models]:
        widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
        lines.append(f"{name}  (* = champion; accuracy and macro F1 on its run's test split)")
        for row in [HEADER, *rows]:
            lines.append("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make models", description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry_dir", default="local_runs/registry", help="The local registry's folder.")
    ns = parser.parse_args(argv)
    try:
        models = model_table(ns.registry_dir)
    except registry.RegistryError as err:
        print(f"make models: {err}", file=sys.stderr)
        return 1
    print(render(models))
    return 0


if __name__ == "__main__":
    sys.exit(main())
