"""The pipeline's parameters as command-line flags, for `make run` and `make schedule`.

Flags of list and dict parameters take JSON; `--search_space` also takes a file
(`parse_search_space`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

RUNS_DIR = "local_runs"
TARGETS = ("auto", "local", "vertex")


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _json_of(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        with contextlib.suppress(ValueError):
            if isinstance(value := json.loads(text), kind):
                return value
        raise argparse.ArgumentTypeError(f"expected a JSON {kind.__name__}, got {text!r}")

    return parse


def read_document(text: str) -> Any:
    """A flag's value: inline JSON, `@FILE`, or the path of a .json, .yaml or .yml file (YAML
    for .yaml and .yml, JSON otherwise)."""
    stripped = text.strip()
    named = stripped.lower().endswith((".json", ".yaml", ".yml")) and not stripped.startswith(("[", "{"))
    if not (stripped.startswith("@") or named):
        try:
            return json.loads(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(
                f"expected inline JSON, @FILE or a .json/.yaml/.yml file, got {text!r} ({err})"
            ) from err
    path = Path(stripped.removeprefix("@"))
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {path}")
    import yaml

    kind = "YAML" if path.suffix.lower() in (".yaml", ".yml") else "JSON"
    try:
        return yaml.safe_load(path.read_text()) if kind == "YAML" else json.loads(path.read_text())
    except (yaml.YAMLError, ValueError) as err:
        raise argparse.ArgumentTypeError(f"{path} is not valid {kind}: {err}") from err


def parse_search_space(text: str) -> Any:
    """`--search_space`: a list of Vertex `StudySpec.ParameterSpec`s (`read_document`), in the
    proto JSON form Vertex's launcher parses (`components.tuning.canonical_search_space`); else as
    given, for `pipeline.options.check` to name what is wrong."""
    value = read_document(text)
    if not isinstance(value, list):
        raise argparse.ArgumentTypeError(
            f"expected a list of parameter specs (Vertex StudySpec.ParameterSpec), got {type(value).__name__}"
        )
    from components import tuning

    try:
        return tuning.canonical_search_space(value)
    except ValueError:
        return value


def build_parser(parameters: Sequence[Any]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="make run ARGS=...",
        description="Run the pipeline: locally with no project configured, else on Vertex AI.",
    )
    p.add_argument("--target", choices=TARGETS, default="auto", help="Where to run (default: auto).")
    p.add_argument("--runs_dir", default=RUNS_DIR, help="Local runs folder (local target).")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="Local target: show every line of every step and replica (they always go to the step logs).",
    )
    p.add_argument(
        "--training_config",
        metavar="FILE",
        default=None,
        help="An AI Platform Training config.yaml (trainingInput: scaleTier, masterType, workerType, "
        "workerCount, acceleratorConfig): its machines and GPUs set the hardware parameters; flags "
        "given explicitly win (docs/vertex.md#moving-from-ai-platform-training---training_config-file).",
    )
    group = p.add_argument_group("pipeline parameters")
    for q in parameters:
        parse = {bool: parse_bool, list: _json_of(list), dict: _json_of(dict)}.get(q.type, q.type)
        metavar = q.type.__name__.upper()
        if q.name == "search_space":
            parse, metavar = parse_search_space, "JSON|@FILE"
        # argparse formats help with %: a parameter's help is text ("the paired 95% interval").
        group.add_argument(
            f"--{q.name}", type=parse, default=None, metavar=metavar, help=q.help.replace("%", "%%")
        )
    return p
