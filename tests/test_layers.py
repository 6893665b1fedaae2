"""Imports run downwards only: launch -> pipeline -> components and local; the trainer stands
alone (started as a process). Read from the source, every import (module level or inside a
function: component bodies import at run time). The `pipeline` layer is the `pipeline/` package
(parameters, rules, backends, the DAG) and the top-level `pipeline.py`, its compile script."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("launch", "pipeline", "local", "components", "trainer")
# What each layer may import of the project's own packages.
ALLOWED = {
    "launch": {"launch", "pipeline", "components", "local"},
    "pipeline": {"pipeline", "components", "local"},
    "local": {"local", "components"},
    "components": {"components"},
    "trainer": {"trainer"},
}


def layer_of(path: Path) -> str:
    """The top folder, or for a top-level file its stem (`pipeline.py`: the pipeline layer)."""
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def module_name(path: Path) -> str:
    """The module a file is imported as; `pipeline.py` is only ever run as a script (`import
    pipeline` finds the package), so it gets a name of its own."""
    rel = path.relative_to(ROOT)
    if rel == Path("pipeline.py"):
        return "pipeline.py"
    return ".".join(p for p in rel.with_suffix("").parts if p != "__init__")


def own_imports(path: Path) -> dict[str, set[str]]:
    """Top-level project package -> the modules of it imported, for one file."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            top = name.split(".")[0]
            if top in PACKAGES:
                out.setdefault(top, set()).add(name)
    return out


def sources() -> list[Path]:
    files = [ROOT / "pipeline.py"]
    for package in ("launch", "pipeline", "local", "components", "trainer"):
        files += sorted((ROOT / package).rglob("*.py"))
    return files


def test_every_import_runs_downwards() -> None:
    wrong = []
    for path in sources():
        layer = layer_of(path)
        for top, names in own_imports(path).items():
            if top not in ALLOWED[layer]:
                wrong.append(f"{path.relative_to(ROOT)} imports {sorted(names)}")
    assert not wrong, "imports that run upwards or sideways:\n" + "\n".join(wrong)


def test_the_trainer_never_imports_kfp_or_google_cloud() -> None:
    for path in sorted((ROOT / "trainer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(n.startswith(("kfp", "google.cloud", "google_cloud")) for n in names), path


def test_no_module_imports_one_that_imports_it() -> None:
    """No circles between the project's modules (module-level and in-function imports)."""
    modules: dict[str, set[str]] = {}
    for path in sources():
        name = module_name(path)
        deps = set()
        for names in own_imports(path).values():
            deps |= names
        modules[name] = deps

    def resolve(dep: str) -> str | None:
        while dep and dep not in modules:
            dep = dep.rpartition(".")[0]
        return dep or None

    graph = {m: {r for d in deps if (r := resolve(d)) and r != m} for m, deps in modules.items()}
    cycles = [(a, b) for a, deps in graph.items() for b in deps if a in graph.get(b, set())]
    assert not cycles, f"modules importing each other: {cycles}"


def test_the_pipeline_layer_is_the_package_and_its_compile_script() -> None:
    """`import pipeline` is the package (a package wins over the module beside it), which
    re-exports what callers use; `pipeline.py` stays, as `make compile`'s script, and is read as
    part of the layer; the components hold no parameter rules any more."""
    import pipeline

    assert Path(pipeline.__file__) == ROOT / "pipeline" / "__init__.py"
    assert {"create_pipeline", "PARAMETERS", "parameters_for", "BACKENDS", "PIPELINE_NAME"} <= set(
        dir(pipeline)
    )
    layers = {
        layer_of(path) for path in sources() if path.parts[len(ROOT.parts)] in ("pipeline", "pipeline.py")
    }
    assert layers == {"pipeline"}
    # Each capability's parameter rows and rules in one module of pipeline/options/, nowhere else.
    assert (ROOT / "pipeline" / "options" / "__init__.py").is_file()
    assert not any(
        (ROOT / p).exists() for p in ("components/options.py", "pipeline/parameters.py", "pipeline/rules")
    )


def seams_table(heading: str) -> dict[str, tuple[set[str], set[str]]]:
    """The table of docs/architecture.md's section `heading` (the extras', the trainer's parts'):
    first column -> (the modules of the second, the seams of the third), as paths."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))[1:]  # the first table
    rows = [line for line in rows if line.startswith("| ")]  # less the header's separator
    table = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if set(cells[0]) <= set("-: "):
            continue  # the separator
        modules, seams = ({p for p in re.findall(r"`([\w/]+\.py)`", cell)} for cell in cells[1:3])
        table[cells[0]] = (modules, seams)
    return table


def seam_problems(table: dict[str, tuple[set[str], set[str]]]) -> list[str]:
    """A module of a row imported from outside the row and its seams; a seam that imports none."""
    by_path = {str(path.relative_to(ROOT)): path for path in sources()}
    names = {module_name(path): rel for rel, path in by_path.items()}

    def imported(rel: str) -> set[str]:
        """The project modules one file imports (a name resolved to its module)."""
        out = set()
        for dotted in set().union(*own_imports(by_path[rel]).values()):
            while dotted and dotted not in names:
                dotted = dotted.rpartition(".")[0]
            if dotted:
                out.add(names[dotted])
        return out

    wrong = []
    for row, (modules, seams) in table.items():
        assert modules | seams <= set(by_path), (
            f"{row}: {sorted((modules | seams) - set(by_path))} do not exist"
        )
        for rel in by_path:
            if imported(rel) & modules and rel not in modules | seams:
                wrong.append(
                    f"{rel} imports {sorted(imported(rel) & modules)} ({row}), and is not a seam of it"
                )
        for seam in seams:
            if not imported(seam) & modules:
                wrong.append(f"{seam} is listed as a seam of {row} and imports none of {sorted(modules)}")
    return wrong


def test_each_extra_is_named_by_the_core_only_at_its_seams() -> None:
    table = seams_table("Core and extras")
    assert len(table) >= 5 and all(modules for modules, _ in table.values()), table
    wrong = seam_problems(table)
    assert not wrong, "docs/architecture.md's Core and extras table:\n" + "\n".join(wrong)


def test_the_training_core_names_the_trainers_parts_only_at_their_seams() -> None:
    """An adopter who replaces the preparation keeps a core that never imports it."""
    table = seams_table("The trainer's parts")
    assert len(table) == 2 and all(modules for modules, _ in table.values()), table
    assert all(path.startswith("trainer/") for modules, seams in table.values() for path in modules | seams)
    wrong = seam_problems(table)
    assert not wrong, "docs/architecture.md's trainer's parts table:\n" + "\n".join(wrong)
    # The preparation part is its folder (and its entry point, trainer/prepare.py): whole.
    [preparation] = [modules for part, (modules, _) in table.items() if part.startswith("Preparation")]
    folder = {str(p.relative_to(ROOT)) for p in (ROOT / "trainer" / "preparation").glob("*.py")}
    assert preparation == (folder - {"trainer/preparation/__init__.py"}) | {"trainer/prepare.py"}


def test_what_component_bodies_import_loads_under_kfps_runtime() -> None:
    """A step runs its component's shipped source with kfp's runtime (`_KFP_RUNTIME=true`), whose
    `kfp.dsl` has no `component`: a project module a body imports must not load one that declares
    components (local.tuner importing components.tuning failed every local tuning run this way)."""
    import os
    import subprocess
    import sys

    imported = set()
    for path in sorted((ROOT / "local").glob("*.py")) + sorted((ROOT / "components").glob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef):
                for node in ast.walk(fn):
                    if isinstance(node, ast.ImportFrom) and node.module in ("local", "components"):
                        imported |= {f"{node.module}.{a.name}" for a in node.names}
                    elif isinstance(node, ast.ImportFrom) and str(node.module).startswith(PACKAGES):
                        imported.add(str(node.module))
    assert {"local.tuner", "local.jobs", "components.buildcontext"} <= imported
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)"
    env = {**os.environ, "_KFP_RUNTIME": "true"}
    done = subprocess.run(
        [sys.executable, "-c", code, *sorted(imported)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
