"""The runner's plumbing: selection, failures, no TensorFlow import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import __main__ as runner
from benchmarks import registry
from benchmarks.common import ROOT, load_results, make_result

MACHINE = {"cpu_count": 2, "cpu_model": "Test CPU", "python": "3.11", "tensorflow": "2.21.0", "gpu": None}


def test_run_writes_the_selected_results_and_their_table_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def e2e(work: Path, results_dir: Path) -> dict[str, Any]:
        return make_result(
            "e2e", inputs={}, figures={}, ratio=None, goal={}, goal_met=True, machine=MACHINE, summary="63s"
        )

    real = registry.module
    monkeypatch.setattr(
        registry, "module", lambda name: SimpleNamespace(run=e2e) if name == "e2e" else real(name)
    )
    markdown = tmp_path / "BENCHMARKS.md"
    rc = runner.main(
        ["run", "--bench", "e2e", "--results-dir", str(tmp_path / "r"), "--markdown", str(markdown)]
    )
    assert rc == 0
    assert list(load_results(tmp_path / "r")) == ["e2e"]
    rows = {
        line.split("`")[1]: line
        for line in markdown.read_text(encoding="utf-8").splitlines()
        if "| `" in line
    }
    assert "63s" in rows["e2e"] and "no result yet" in rows["input"]


@pytest.mark.parametrize("selection", [",", " "])
def test_a_selection_naming_no_benchmark_is_refused_not_taken_for_all(
    selection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "run", lambda names, *_: pytest.fail(f"ran {names}"))
    with pytest.raises(SystemExit) as exit_info:
        runner.main(["run", "--bench", selection])
    assert exit_info.value.code == 2


def test_unknown_benchmarks_are_refused_with_the_known_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        runner.main(["run", "--bench", "input,nope"])
    assert exit_info.value.code == 2
    assert (
        "unknown benchmark(s) nope; known: input, train, gpu, prepare, e2e, memory, tuning"
        in capsys.readouterr().err
    )


def test_list_names_every_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    assert runner.main(["list"]) == 0
    out = capsys.readouterr().out
    for name in registry.BENCHMARKS:
        assert name in out


def test_a_failing_benchmark_fails_the_run_after_the_others_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def ok(work: Path, results_dir: Path) -> dict[str, Any]:
        return make_result(
            "prepare", inputs={}, figures={}, ratio=None, goal={}, goal_met=None, machine=MACHINE
        )

    def broken(work: Path, results_dir: Path) -> dict[str, Any]:
        raise RuntimeError("boom")

    fakes = {"train": SimpleNamespace(run=broken), "prepare": SimpleNamespace(run=ok)}
    real = registry.module
    monkeypatch.setattr(registry, "module", lambda name: fakes.get(name) or real(name))
    results, markdown = tmp_path / "r", tmp_path / "B.md"
    rc = runner.run(["train", "prepare"], results, tmp_path / "work", markdown)
    assert rc == 1
    assert list(load_results(results)) == ["prepare"]
    assert "`prepare`" in markdown.read_text(encoding="utf-8")


def test_the_runner_never_imports_tensorflow() -> None:
    modules = ", ".join(sorted({module for module, _ in registry.BENCHMARKS.values()}))
    code = (
        "import sys, benchmarks.__main__, benchmarks.table, benchmarks.fixtures; "
        f"import {modules}; "
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


@pytest.mark.serial
def test_gpu_without_a_gpu_writes_a_skipped_result(tmp_path: Path) -> None:
    from benchmarks import gpu
    from local.gpus import local_gpus

    if local_gpus():
        pytest.skip("this machine has a GPU: the benchmark would really run")
    result = gpu.run(tmp_path / "work", tmp_path)
    assert result["skipped"] == "no GPU"
    assert result["ratio"] is None and result["goal_met"] is None
    assert result["figures"]["tensorflow_gpus"] == []
