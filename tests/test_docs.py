"""The docs name only what exists: every repository path and every project module (and its
top-level name) written in backticks in README.md and docs/*.md, so a rename breaks this test
instead of leaving the docs behind. Fast: reads files, imports nothing of the project."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = ("trainer", "components", "local", "launch", "pipeline", "tests", "benchmarks")
# Top-level files that are named without a folder; other names without one (metrics.json,
# task.py, pipeline_jobs.py of another package) are not this repository's paths.
TOP_LEVEL_SUFFIXES = (".md", ".toml", ".lock", ".yaml", ".yml", ".example")
TOP_LEVEL_PREFIXES = ("Dockerfile", "Makefile", ".dockerignore", ".gitignore")


def generated_top_level() -> set[str]:
    """Top-level names .gitignore ignores (made by runs or by the user: local_runs/, env.sh, ...)."""
    names = set()
    for line in (ROOT / ".gitignore").read_text().splitlines():
        name = line.strip().strip("/")
        if name and not name.startswith("#") and "/" not in name and "*" not in name:
            names.add(name)
    return names


def code_spans(text: str) -> list[str]:
    """Inline `code` spans, outside fenced code blocks."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", prose)


def repo_paths(span: str) -> list[str]:
    """The repository paths a code span names: `a/b.py`, `docs/`, `Dockerfile.serving`, ...
    Anything with a placeholder, a wildcard, a scheme or an absolute path is not one."""
    out = []
    for token in span.split():
        token = token.strip("(),;:'\"")
        if (
            not token
            or re.search(r"[<>*{}$=@]|://|^/|^\.\.?/", token)
            or not re.fullmatch(r"[\w./-]+", token)
        ):
            continue
        if "/" in token:
            first = token.split("/")[0]
            if first in generated_top_level() or not (ROOT / first).exists():
                continue  # a folder of a run, of a job or of another package (model/, backup/)
            out.append(token)
        elif (
            token.endswith(TOP_LEVEL_SUFFIXES) or token.startswith(TOP_LEVEL_PREFIXES)
        ) and token not in generated_top_level():
            out.append(token)
    return out


def dotted_names(span: str) -> list[str]:
    """Project modules and names a code span names: `trainer.task`, `pipeline.BACKENDS`,
    `local.tuner.trial_flag`, `python -m launch.cli` (not `kfp.local`, not `pipeline.json`)."""
    pattern = rf"(?<![\w.])(?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+"
    return [
        name
        for name in re.findall(pattern, span)
        if not re.search(r"\.(json|py|md|toml|yaml|yml|txt|html|lock)$", name)
    ]


@cache
def top_level_names(path: Path) -> frozenset[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


def resolve(dotted: str) -> str | None:
    """None when `dotted` names a module of this repository (and, after it, a top-level name of
    that module); else what is missing."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        # A package wins over a module of the same name beside it, as in Python's own finder.
        module = next((p for p in (base / "__init__.py", base.with_suffix(".py")) if p.is_file()), None)
        if module is None:
            continue
        rest = parts[i:]
        if rest and rest[0] not in top_level_names(module):
            return f"{module.relative_to(ROOT)} defines no {rest[0]}"
        return None
    return "no such module"


def test_the_readers_find_paths_and_names() -> None:
    spans = code_spans(
        "a `docs/facts.md` b `python -m trainer.task --x` c `<base>/model/` `kfp.local`\n```\n`x/y`\n```"
    )
    assert [p for s in spans for p in repo_paths(s)] == ["docs/facts.md"]
    assert [n for s in spans for n in dotted_names(s)] == ["trainer.task"]
    assert resolve("pipeline.BACKENDS") is None and resolve("trainer.task.run") is None
    assert resolve("pipeline.NO_SUCH_NAME") and resolve("components.no_such_module")
    assert repo_paths("local_runs/latest env.sh") == []  # made by runs and users, not the repository


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_path_and_module_named_in_the_docs_exists(doc: Path) -> None:
    missing = []
    for span in code_spans(doc.read_text()):
        missing += [f"{p} (no such path)" for p in repo_paths(span) if not (ROOT / p).exists()]
        missing += [f"{n} ({why})" for n in dotted_names(span) if (why := resolve(n))]
    assert not missing, f"{doc.relative_to(ROOT)} names what does not exist: {sorted(set(missing))}"


def test_the_readme_lists_every_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    unlisted = [d.name for d in DOCS[1:] if f"`docs/{d.name}`" not in readme]
    assert not unlisted, f"README.md's 'Read more' list does not name {unlisted}"


README_MAX_LINES = 150


def test_the_readme_stays_short() -> None:
    """The README says what the project is, the two commands, what a run leaves, how to go to
    Vertex, the exit codes and where to read more; the rest belongs in docs/ (docs/running.md,
    docs/vertex.md, ...)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, at most {README_MAX_LINES}: move detail to a docs/ page"
    )


def test_the_readme_keeps_what_others_read_from_it() -> None:
    """.ci/run runs the README's test command, `make test`; code and Makefile comments point to
    its "Exit codes" section."""
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make test" in (ROOT / ".ci" / "run").read_text()
    assert "\n## Exit codes\n" in readme


def test_the_generated_tables_are_what_the_code_makes() -> None:
    """The flag tables of docs/contracts.md and the parameters of docs/options.md are
    `make docs`'s (tests/doctables.py), like compiled/ is `make compile`'s."""
    from tests import doctables

    assert not (stale := doctables.stale()), f"stale doc tables, run `make docs`: {stale}"


def test_a_table_is_written_between_its_markers_and_nowhere_else() -> None:
    from tests import doctables

    begin, end = doctables.markers("t")
    text = f"intro\n{begin}\n| old |\n{end}\nrest\n"
    assert doctables.written(text, "t", "| new |\n") == f"intro\n{begin}\n| new |\n{end}\nrest\n"
    for broken in (f"intro\n{begin}\n", f"{begin}\n{end}\n{begin}\n{end}\n", "no markers\n"):
        with pytest.raises(ValueError):
            doctables.written(broken, "t", "| new |\n")
