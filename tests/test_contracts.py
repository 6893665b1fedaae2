"""The contracts between the pipeline and the trainer (docs/contracts.md), checked in seconds:
no TensorFlow, no training. What the trainer really writes is checked where it really runs:
tests/trainer/test_task.py (metrics.json) and tests/trainer/test_data.py (metadata.json).

- every key of metrics.json / metadata.json that a component, the local backend or the launcher
  reads is one the trainer declares in `trainer.contract`, and each reading module's own list
  (`METRICS_READ`, `METADATA_READ`: components cannot import the trainer) is what its code reads;
- the study's parameter ids are trainer flags, and a trial's command line parses;
- every flag `components.plan.trainer_args` emits parses with the trainer's own parser;
- `components.prepare.prepare_args` emits `python -m trainer.prepare` flags.
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.model_flags import MODEL_FLAG_VALUES
from trainer import config as trainer_config
from trainer import contract

ROOT = Path(__file__).resolve().parents[1]


# --- reading the keys a function reads from a JSON document, from its source -----------------


def function_node(path: str, name: str) -> ast.FunctionDef:
    found = [
        node
        for node in ast.walk(ast.parse((ROOT / path).read_text()))
        if isinstance(node, ast.FunctionDef) and node.name == name
    ]
    assert len(found) == 1, f"{path}: expected one function {name}, found {len(found)}"
    return found[0]


def _is_json_load(node: ast.AST) -> bool:
    """`json.load(...)` or `json.loads(...)`."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("load", "loads")
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "json"
    )


def _string(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def keys_read(
    func: ast.FunctionDef, names: set[str], constants: dict[str, tuple[str, ...]] | None = None
) -> set[str]:
    """The top-level keys `func` reads from the documents held in the variables `names`, or
    straight from a `json.load(...)` call: `doc["k"]`, `doc.get("k")`, and `doc[k]` /
    `doc.get(k)` with `k` looping over a literal tuple of strings or over one of the module's
    `constants` (a tuple of strings named at module level)."""

    def is_doc(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id in names) or _is_json_load(node)

    def key_node(node: ast.AST) -> ast.AST | None:
        if isinstance(node, ast.Subscript) and is_doc(node.value):
            return node.slice
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and is_doc(node.func.value)
            and node.args
        ):
            return node.args[0]
        return None

    keys: set[str] = set()
    loops: list[tuple[str, list[str], ast.AST]] = []  # (loop variable, its literal values, scope)
    for node in ast.walk(func):
        pairs: list[tuple[ast.AST, ast.AST]] = []
        if isinstance(node, ast.For):
            pairs = [(node.target, node.iter)]
        elif isinstance(node, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
            pairs = [(g.target, g.iter) for g in node.generators]
        for target, iterable in pairs:
            if isinstance(target, ast.Name) and isinstance(iterable, ast.Tuple | ast.List):
                strings = [_string(e) for e in iterable.elts]
                if strings and all(v is not None for v in strings):
                    loops.append((target.id, [str(v) for v in strings], node))
            elif (
                isinstance(target, ast.Name)
                and isinstance(iterable, ast.Name)
                and iterable.id in (constants or {})
            ):
                loops.append((target.id, list((constants or {})[iterable.id]), node))
        key = key_node(node)
        if key is not None and _string(key) is not None:
            keys.add(str(_string(key)))
    for variable, values, scope in loops:
        for node in ast.walk(scope):
            key = key_node(node)
            if isinstance(key, ast.Name) and key.id == variable:
                keys.update(values)
    return keys


# (file, function, the variables holding the parsed document)
Reader = tuple[str, str, set[str]]
METRICS_READERS: dict[str, list[Reader]] = {
    "components.evaluation": [("components/evaluation.py", "evaluate_model", {"m"})],
    "components.registry": [("components/registry.py", "find_champion", {"champion_metrics"})],
    "local.steps": [
        ("local/steps.py", "champion_record", {"metrics"}),
        ("local/steps.py", "register_version", {"metrics"}),
    ],
    "launch.report": [("launch/report.py", "_metrics_sections", {"metrics"})],
}
# Modules that read the keys named in their METRICS_READ through that very list alone (the run
# summary of `launch.cli`; `launch.report` reads its table's rows so, and the rest by name): the list
# itself is checked against the trainer's declaration.
METRICS_LISTS_ONLY = ("launch.cli",)
METADATA_READERS: dict[str, list[Reader]] = {
    "components.prepare": [("components/prepare.py", "dataset_record", {"meta"})]
}
TRAINER_METADATA_READERS: list[Reader] = [("trainer/datasetinfo.py", "from_json", {"data"})]


def test_the_key_reader_finds_every_form_of_read() -> None:
    source = (
        "def f(path):\n"
        "    doc = json.load(open(path))\n"
        "    a = doc['one'] + doc.get('two') + json.loads('{}')['three']\n"
        "    b = {k: doc[k] for k in ('four', 'five')}\n"
        "    for key in ('six',):\n"
        "        doc.get(key)\n"
        "    other = {'seven': 1}['seven']\n"
        "    [doc[k] for k in KEYS]\n"
        "    return other\n"
    )
    func = ast.parse(source).body[0]
    assert isinstance(func, ast.FunctionDef)
    assert keys_read(func, {"doc"}) == {"one", "two", "three", "four", "five", "six"}
    assert keys_read(func, {"doc"}, {"KEYS": ("eight",)}) == {
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "eight",
    }


@pytest.mark.parametrize("module_name", sorted(METRICS_READERS))
def test_each_metrics_reader_lists_what_its_code_reads(module_name: str) -> None:
    import importlib

    module = importlib.import_module(module_name)
    constants = {
        k: v for k, v in vars(module).items() if isinstance(v, tuple) and all(isinstance(x, str) for x in v)
    }
    read: set[str] = set()
    for path, function, names in METRICS_READERS[module_name]:
        found = keys_read(function_node(path, function), names, constants)
        assert found, f"{path}:{function} reads no metrics.json key: has the reading code changed?"
        read |= found
    assert sorted(read) == sorted(module.METRICS_READ), (
        f"{module_name}.METRICS_READ must list exactly the metrics.json keys its code reads"
    )


def test_every_metrics_key_read_anywhere_is_one_the_trainer_writes() -> None:
    import importlib

    declared = set(contract.METRICS_KEYS)
    wrong = {}
    for module_name in (*METRICS_READERS, *METRICS_LISTS_ONLY):
        listed = set(importlib.import_module(module_name).METRICS_READ)
        if listed - declared:
            wrong[module_name] = sorted(listed - declared)
    assert not wrong, f"metrics.json keys read but not in trainer.contract.METRICS_KEYS: {wrong}"


EVALUATION_READERS: dict[str, list[Reader]] = {
    # `models` maps roles (challenger, champion) to entries: only the documents and entries count.
    "components.evaluation": [("components/evaluation.py", "evaluate_model", {"evaluated", "new", "old"})],
    "local.steps": [("local/steps.py", "local_upload_model", {"evaluated", "m"})],
}


@pytest.mark.parametrize("module_name", sorted(EVALUATION_READERS))
def test_each_evaluation_reader_reads_keys_trainer_evaluate_writes(module_name: str) -> None:
    import importlib

    module = importlib.import_module(module_name)
    read: set[str] = set()
    for path, function, names in EVALUATION_READERS[module_name]:
        read |= keys_read(function_node(path, function), names)
    assert sorted(read) == sorted(module.EVALUATION_READ), f"{module_name}.EVALUATION_READ is out of date"
    declared = {
        *contract.EVALUATION_KEYS,
        *contract.EVALUATION_MODEL_KEYS,
        # `comparison` and the entries inside it (the gate's paired statistics)
        *contract.EVALUATION_COMPARISON_KEYS,
        *contract.EVALUATION_DIFFERENCE_KEYS,
        *contract.EVALUATION_MCNEMAR_KEYS,
        *contract.EVALUATION_BOOTSTRAP_KEYS,
    }
    assert set(module.EVALUATION_READ) <= declared, sorted(set(module.EVALUATION_READ) - declared)


def test_every_metadata_key_read_is_one_preparation_writes() -> None:
    import importlib

    declared = set(contract.METADATA_KEYS)
    for module_name, readers in METADATA_READERS.items():
        module = importlib.import_module(module_name)
        read: set[str] = set()
        for path, function, names in readers:
            read |= keys_read(function_node(path, function), names)
        assert sorted(read) == sorted(module.METADATA_READ), f"{module_name}.METADATA_READ is out of date"
        assert set(module.METADATA_READ) <= declared, sorted(set(module.METADATA_READ) - declared)
    for path, function, names in TRAINER_METADATA_READERS:
        found = keys_read(function_node(path, function), names)
        assert found and found <= declared, sorted(found - declared)


def test_the_contract_is_importable_without_tensorflow() -> None:
    """Components, tests and tools read `trainer.contract` (and the flag parsers) cheaply."""
    imports = [
        n
        for n in ast.walk(ast.parse((ROOT / "trainer" / "contract.py").read_text()))
        if isinstance(n, ast.Import | ast.ImportFrom)
    ]
    assert all(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in imports)
    probe = (
        "import sys, trainer.contract, trainer.config, trainer.prepare, trainer.task\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tf_keras', 'keras'))\n"
        "print(heavy)\n"
        "sys.exit(1 if heavy else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"importing the trainer's parsers loads {done.stdout}{done.stderr}"


def test_the_trainer_task_keeps_its_file_names() -> None:
    from trainer import task

    assert (task.METRICS_FILE, task.CONFIG_FILE, task.HISTORY_FILE, task.STATE_FILE) == (
        contract.METRICS_FILE,
        contract.CONFIG_FILE,
        contract.HISTORY_FILE,
        contract.STATE_FILE,
    )


# --- the trainer's command line --------------------------------------------------------------


def trainer_flags() -> set[str]:
    return {
        option[2:]
        for action in trainer_config.build_parser()._actions
        for option in action.option_strings
        if option.startswith("--")
    }


def study_parameter_ids() -> list[str]:
    """The parameter ids of the Vertex template's search space (`components.tuning`)."""
    from components import tuning

    return [str(s["parameter_id"]) for s in tuning.VERTEX_SEARCH_SPACE]


def trainer_args(**overrides: Any) -> list[str]:
    """The final training's flags as the plan builds them (`plan.build_trainer_args`), with
    a best trial's `hyperparameters` written over them as its step does (`apply_hyperparameters`)."""
    from components import plan

    best = overrides.pop("hyperparameters", None)
    leave_out = overrides.pop("leave_out", ())
    values: dict[str, Any] = {**MODEL_FLAG_VALUES, "xla": True, "fine_tune_fraction": 0.5}
    values.update(overrides)
    args, _ = plan.build_trainer_args("/data/prepared", 64.0, values, plan.TUNABLE, leave_out=leave_out)
    if best:
        [pool], _ = plan.apply_hyperparameters([{"container_spec": {"args": args}}], best, plan.TUNABLE)
        args = pool["container_spec"]["args"]
    return list(args)


def test_the_study_parameter_ids_are_trainer_flags() -> None:
    ids = study_parameter_ids()
    assert set(ids) <= trainer_flags(), sorted(set(ids) - trainer_flags())
    assert "per_replica_batch_size" in ids  # the reader above found the real search space


def test_a_trials_command_line_parses_with_the_trainers_flags() -> None:
    """The tuning job's args leave the study's parameters out; each trial appends them as
    `--<parameter_id>=<double>` (docs/facts.md): the whole line must parse."""
    from local.tuner import trial_flag

    ids = study_parameter_ids()
    base = trainer_args(leave_out=ids)
    assert not [a for a in base if a.split("=")[0][2:] in ids]
    defaults = {f.name: f.default for f in dataclasses.fields(trainer_config.TrainConfig)}
    flags = [trial_flag(i, defaults[i]) for i in ids]
    config = trainer_config.parse_args([*base, *flags], {"AIP_MODEL_DIR": "gs://b/job/1/model/"})
    for i in ids:
        assert getattr(config, i) == defaults[i], i
    assert config.model_dir == "gs://b/job/1/model"


def test_every_flag_trainer_args_emits_is_a_trainer_flag() -> None:
    args = trainer_args()
    emitted = {a.split("=", 1)[0][2:] for a in args}
    assert emitted <= trainer_flags(), sorted(emitted - trainer_flags())
    assert {"model_dir", "checkpoint_dir", "tensorboard_dir"}.isdisjoint(emitted)  # Vertex's AIP_*
    config = trainer_config.parse_args(args, {"AIP_MODEL_DIR": "/jobs/train/model/"})
    assert (config.data_dir, config.image_size, config.fine_tune_fraction, config.xla) == (
        "/data/prepared",
        64,
        0.5,
        True,
    )


def test_the_best_trials_values_reach_the_trainer_as_its_flags() -> None:
    """The best trial's step takes its parameters (doubles, as Vertex returns them) for the
    final training: every study parameter must be one it accepts, and the result must parse."""
    ids = study_parameter_ids()
    best = {i: 32.0 if i in ("per_replica_batch_size", "dense_units") else 0.25 for i in ids}
    config = trainer_config.parse_args(trainer_args(hyperparameters=best), {"AIP_MODEL_DIR": "/m"})
    for i in ids:
        assert getattr(config, i) == best[i], i


def test_the_study_metric_is_what_the_trainer_reports_by_default() -> None:
    """The plan never passes `--hp_metric`: the trainer's default tag must be the study's
    metric id, or every trial would report a metric the tuning service never reads."""
    from components import tuning

    args = trainer_args()
    assert "hp_metric" not in {a.split("=", 1)[0][2:] for a in args}
    assert trainer_config.parse_args(args, {"AIP_MODEL_DIR": "/m"}).hp_metric == tuning.METRIC_ID
    assert tuning.METRIC_ID in trainer_config.HP_METRICS


# --- trainer.prepare's command line ----------------------------------------------------------


@pytest.mark.parametrize(
    "source", ["synthetic", "tfds:cassava", "folder:gs://bucket/leaves"], ids=["synthetic", "tfds", "folder"]
)
def test_prepare_args_are_trainer_prepare_flags(source: str) -> None:
    from components import prepare as prepare_step
    from trainer import prepare

    args = list(
        prepare_step.build_prepare_args(
            source=source,
            image_size=64,
            shards=8,
            seed=7,
            synthetic_per_class=20,
            champion_class_names=["a", "b,c"],
        )
    )
    known, unknown = prepare.build_parser().parse_known_args(args)
    assert not unknown, f"build_prepare_args emits flags trainer.prepare does not know: {unknown}"
    assert known.output_dir is None  # left to $AIP_MODEL_DIR, the job's model/ folder
    config = prepare.parse_args(args, {"AIP_MODEL_DIR": "gs://b/prep/model/"})
    assert (config.source, config.image_size, config.shards, config.seed, config.output_dir) == (
        source,
        64,
        8,
        7,
        "gs://b/prep/model",
    )
    assert config.overwrite  # a retried job replaces its own half-written output
    assert config.champion_class_names == ("a", "b,c")
