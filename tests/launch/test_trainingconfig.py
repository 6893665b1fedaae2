"""`--training_config`: AI Platform Training config files mapped to the hardware parameters, the
refusals (every problem of a file in one error), and explicit flags winning over the file.

The expected tables here are written from AI Platform's documentation
(docs/vertex.md#moving-from-ai-platform-training---training_config-file cites it), not copied
from `launch.trainingconfig`."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

import pipeline
from launch import aiplatformjob
from launch.flags import build_parser
from launch.trainingconfig import (
    TrainingConfigError,
    apply_training_config,
    describe_pools,
    load_training_config,
)

K80, P100, T4, V100 = "NVIDIA_TESLA_K80", "NVIDIA_TESLA_P100", "NVIDIA_TESLA_T4", "NVIDIA_TESLA_V100"

# AI Platform's legacy machine types and their Compute Engine equivalents (TrainingInput reference:
# which GPU and how many each includes; AI Platform's pricing: the machine each is priced as).
AI_PLATFORM_LEGACY = {
    "standard": ("n1-standard-4", "", 0),
    "large_model": ("n1-highmem-8", "", 0),
    "complex_model_s": ("n1-highcpu-8", "", 0),
    "complex_model_m": ("n1-highcpu-16", "", 0),
    "complex_model_l": ("n1-highcpu-32", "", 0),
    "standard_gpu": ("n1-standard-8", K80, 1),
    "complex_model_m_gpu": ("n1-standard-16", K80, 4),
    "complex_model_l_gpu": ("n1-standard-32", K80, 8),
    "standard_p100": ("n1-standard-8", P100, 1),
    "complex_model_m_p100": ("n1-standard-16", P100, 4),
    "standard_v100": ("n1-standard-8", V100, 1),
    "large_model_v100": ("n1-highmem-8", V100, 1),
    "complex_model_m_v100": ("n1-standard-16", V100, 4),
    "complex_model_l_v100": ("n1-standard-32", V100, 8),
}
# What the pipeline gets for each: the machine, GPU and count, or the refusal's words (K80: end of
# support and no TensorFlow kernels; n1-highcpu-8: not an N1 machine type listed for training).
EXPECTED_LEGACY: dict[str, tuple[str, str, int] | tuple[str, ...]] = {
    "standard": ("n1-standard-4", "", 0),
    "large_model": ("n1-highmem-8", "", 0),
    "complex_model_s": ("refused", "n1-highcpu-8", "n1-highcpu-16"),
    "complex_model_m": ("n1-highcpu-16", "", 0),
    "complex_model_l": ("n1-highcpu-32", "", 0),
    "standard_gpu": ("refused", K80, "standard_v100 (n1-standard-8 + 1 x NVIDIA_TESLA_V100)"),
    "complex_model_m_gpu": ("refused", K80, "complex_model_m_v100 (n1-standard-16 + 4 x NVIDIA_TESLA_V100)"),
    "complex_model_l_gpu": ("refused", K80, "complex_model_l_v100 (n1-standard-32 + 8 x NVIDIA_TESLA_V100)"),
    "standard_p100": ("n1-standard-8", P100, 1),
    "complex_model_m_p100": ("n1-standard-16", P100, 4),
    "standard_v100": ("n1-standard-8", V100, 1),
    "large_model_v100": ("n1-highmem-8", V100, 1),
    "complex_model_m_v100": ("n1-standard-16", V100, 4),
    "complex_model_l_v100": ("n1-standard-32", V100, 8),
}

# The two examples of Google's "Using GPUs" guide for AI Platform Training, verbatim.
DOC_EXAMPLE_COMPUTE_ENGINE = """\
trainingInput:
  scaleTier: CUSTOM
  # Configure a master worker with 4 K80 GPUs
  masterType: n1-highcpu-16
  masterConfig:
    acceleratorConfig:
      count: 4
      type: NVIDIA_TESLA_K80
  # Configure 9 workers, each with 4 K80 GPUs
  workerCount: 9
  workerType: n1-highcpu-16
  workerConfig:
    acceleratorConfig:
      count: 4
      type: NVIDIA_TESLA_K80
  # Configure 3 parameter servers with no GPUs
  parameterServerCount: 3
  parameterServerType: n1-highmem-8
"""
DOC_EXAMPLE_LEGACY = """\
trainingInput:
  scaleTier: CUSTOM
  masterType: complex_model_m_gpu
  workerCount: 9
  workerType: complex_model_m_gpu
  parameterServerCount: 3
  parameterServerType: large_model
"""
V100_CUSTOM = """\
trainingInput:
  scaleTier: CUSTOM
  masterType: n1-standard-8
  masterConfig:
    acceleratorConfig:
      count: 1
      type: NVIDIA_TESLA_V100
  workerCount: 9
  workerType: n1-standard-8
  workerConfig:
    acceleratorConfig:
      count: 1
      type: NVIDIA_TESLA_V100
"""


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def fields(error: TrainingConfigError) -> list[str]:
    """The field each listed problem names, in order (empty for a one-line error)."""
    return re.findall(r"^  - (line \d+|[^\s:(]+)", str(error), re.MULTILINE)


def refusal(path: Path) -> TrainingConfigError:
    """The error; tests assert the fields it names (`fields`), and what it suggests, not its
    wording: test_the_compute_engine_example_is_refused_naming_every_problem holds that."""
    with pytest.raises(TrainingConfigError) as info:
        load_training_config(path)
    return info.value


def test_the_legacy_table_is_ai_platforms_whole() -> None:
    assert aiplatformjob.LEGACY_MACHINE_TYPES == AI_PLATFORM_LEGACY
    assert set(EXPECTED_LEGACY) == set(AI_PLATFORM_LEGACY)


@pytest.mark.parametrize("role", ["master", "worker"])
@pytest.mark.parametrize("legacy", sorted(EXPECTED_LEGACY))
def test_every_legacy_machine_type(tmp_path: Path, legacy: str, role: str) -> None:
    pool = {"master": "chief", "worker": "worker"}[role]
    master = "n1-standard-4" if role == "worker" else legacy
    path = write(
        tmp_path,
        f"trainingInput:\n  scaleTier: CUSTOM\n  masterType: {master}\n"
        + (f"  workerType: {legacy}\n  workerCount: 2\n" if role == "worker" else ""),
    )
    expected = EXPECTED_LEGACY[legacy]
    if expected[0] == "refused":
        error = refusal(path)
        assert fields(error) == [f"trainingInput.{role}Type"]
        for words in expected[1:]:
            assert str(words) in str(error)
        return
    machine, gpu, count = expected
    values = load_training_config(path).values
    assert (
        values[f"{pool}_machine_type"],
        values[f"{pool}_accelerator_type"],
        values[f"{pool}_accelerator_count"],
    ) == (machine, gpu, count)


def test_the_compute_engine_example_is_refused_naming_every_problem(tmp_path: Path) -> None:
    lines = str(refusal(write(tmp_path, DOC_EXAMPLE_COMPUTE_ENGINE))).splitlines()
    assert lines[0] == f"{tmp_path / 'config.yaml'}: 3 problems:"
    assert lines[1].startswith("  - trainingInput.masterConfig.acceleratorConfig.type: NVIDIA_TESLA_K80")
    assert lines[2].startswith("  - trainingInput.workerConfig.acceleratorConfig.type: NVIDIA_TESLA_K80")
    assert lines[3].startswith("  - trainingInput.parameterServerCount is 3: parameter servers have no role")
    assert "end of support" in lines[1] and "compute capability" in lines[1]
    # n1-highcpu-16 takes 1, 2 or 4 T4s and 2, 4 or 8 V100s
    # (docs/vertex.md#gpus-per-n1-machine-type): 4 of either.
    assert "masterConfig.acceleratorConfig {count: 4, type: NVIDIA_TESLA_T4}" in lines[1]
    assert "masterConfig.acceleratorConfig {count: 4, type: NVIDIA_TESLA_V100}" in lines[1]
    assert "--reduction_server_count" in lines[3]


def test_the_legacy_example_is_refused_naming_every_problem(tmp_path: Path) -> None:
    error = refusal(write(tmp_path, DOC_EXAMPLE_LEGACY))
    assert fields(error) == [
        "trainingInput.masterType",
        "trainingInput.workerType",
        "trainingInput.parameterServerCount",
    ]
    # Each K80 type with the V100 type of the same machine and count in its place.
    master, worker = str(error).splitlines()[1:3]
    assert "complex_model_m_v100" in master and "complex_model_m_v100" in worker


def test_a_v100_custom_config_is_mapped_exactly(tmp_path: Path) -> None:
    config = load_training_config(write(tmp_path, V100_CUSTOM))
    assert config.values == {
        "chief_machine_type": "n1-standard-8",
        "chief_accelerator_type": V100,
        "chief_accelerator_count": 1,
        "worker_count": 9,
        "worker_machine_type": "n1-standard-8",
        "worker_accelerator_type": V100,
        "worker_accelerator_count": 1,
    }
    assert config.notes == ()
    assert describe_pools(config.values) == [
        "pool 0: 1 x n1-standard-8 + 1 x NVIDIA_TESLA_V100 (chief)",
        "pool 1: 9 x n1-standard-8 + 1 x NVIDIA_TESLA_V100 (workers)",
    ]


def test_basic_is_one_n1_standard_4(tmp_path: Path) -> None:
    config = load_training_config(write(tmp_path, "trainingInput:\n  scaleTier: BASIC\n"))
    assert config.values == {
        "chief_machine_type": "n1-standard-4",
        "chief_accelerator_type": "",
        "chief_accelerator_count": 0,
        "worker_count": 0,
        "worker_machine_type": "",
        "worker_accelerator_type": "",
        "worker_accelerator_count": 0,
    }
    assert describe_pools(config.values) == ["pool 0: 1 x n1-standard-4 (chief)"]


@pytest.mark.parametrize(
    ("tier", "suggested"),
    [
        ("BASIC_GPU", ["standard_v100"]),
        ("BASIC_TPU", ["standard_v100"]),
        ("STANDARD_1", ["CUSTOM", "masterType", "workerType", "workerCount"]),
        ("PREMIUM_1", ["CUSTOM", "masterType", "workerType", "workerCount"]),
        ("PREMIUM", ["PREMIUM_1"]),
    ],
)
def test_scale_tiers_without_a_vertex_equivalent_are_refused(
    tmp_path: Path, tier: str, suggested: list[str]
) -> None:
    error = refusal(write(tmp_path, f"trainingInput:\n  scaleTier: {tier}\n"))
    assert fields(error) == ["trainingInput.scaleTier"]
    assert all(word in str(error) for word in suggested)


def test_a_missing_scale_tier_is_custom_when_a_master_type_is_set(tmp_path: Path) -> None:
    config = load_training_config(write(tmp_path, "trainingInput:\n  masterType: standard_v100\n"))
    assert config.values["chief_machine_type"] == "n1-standard-8"
    assert "trainingInput.scaleTier not set: CUSTOM, since trainingInput.masterType is set" in config.notes
    assert fields(refusal(write(tmp_path, "trainingInput:\n  region: x\n"))) == ["trainingInput.scaleTier"]


def test_the_bare_training_input_mapping_is_read_too(tmp_path: Path) -> None:
    path = write(tmp_path, "scaleTier: CUSTOM\nmasterType: large_model_v100\n")
    config = load_training_config(path)
    assert (config.values["chief_machine_type"], config.values["chief_accelerator_type"]) == (
        "n1-highmem-8",
        V100,
    )
    assert any("no top-level trainingInput" in note for note in config.notes)
    # Fields are named as written: no trainingInput. prefix in a bare file.
    assert fields(refusal(write(tmp_path, "scaleTier: CUSTOM\nmasterType: standard_gpu\n"))) == ["masterType"]


def test_explicit_flags_win_over_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        trainingInput:
          scaleTier: CUSTOM
          masterType: standard_v100
          workerType: standard_v100
          workerCount: 9
        """,
    )
    given: dict[str, Any] = {
        "worker_count": 2,
        "chief_accelerator_type": T4,
        "worker_machine_type": "n1-standard-8",  # the file's value: nothing wins
        "chief_machine_type": None,  # not given
        "reduction_server_count": 1,  # not in the file: taken as given
        "epochs": 5,  # not a hardware parameter
    }
    values, lines = apply_training_config(path, given)
    assert values == {
        "chief_machine_type": "n1-standard-8",
        "chief_accelerator_type": T4,
        "chief_accelerator_count": 1,
        "worker_count": 2,
        "worker_machine_type": "n1-standard-8",
        "worker_accelerator_type": V100,
        "worker_accelerator_count": 1,
        "reduction_server_count": 1,
    }
    assert lines == [
        "trainingInput.masterType standard_v100 -> n1-standard-8 + 1 x NVIDIA_TESLA_V100",
        "trainingInput.workerType standard_v100 -> n1-standard-8 + 1 x NVIDIA_TESLA_V100",
        "--chief_accelerator_type NVIDIA_TESLA_T4 wins over trainingInput.masterType (standard_v100 -> NVIDIA_TESLA_V100)",
        "--worker_count 2 wins over trainingInput.workerCount (9)",
    ]
    assert describe_pools(values) == [
        "pool 0: 1 x n1-standard-8 + 1 x NVIDIA_TESLA_T4 (chief)",
        "pool 1: 2 x n1-standard-8 + 1 x NVIDIA_TESLA_V100 (workers)",
        "pool 2: 1 x n1-highcpu-16 (Reduction Server)",
    ]


def test_a_flag_adding_workers_to_a_file_without_them_copies_the_chief(tmp_path: Path) -> None:
    path = write(tmp_path, "trainingInput:\n  scaleTier: CUSTOM\n  masterType: complex_model_m_v100\n")
    values, lines = apply_training_config(path, {"worker_count": 3})
    assert lines[-1] == "--worker_count 3 wins over trainingInput.workerCount (0)"
    assert describe_pools(values)[1] == "pool 1: 3 x n1-standard-16 + 4 x NVIDIA_TESLA_V100 (workers)"


def test_unknown_fields_are_refused_with_a_suggestion(tmp_path: Path) -> None:
    error = refusal(
        write(
            tmp_path,
            """\
            trainingInput:
              scaleTier: CUSTOM
              masterType: standard_v100
              workerCont: 2
              masterConfig:
                acceleratorConfig: {count: 1, type: NVIDIA_TESLA_V100, kind: gpu}
            labels: {team: ml}
            """,
        )
    )
    # A legacy type carries its GPUs: an acceleratorConfig with it is refused too.
    assert fields(error) == [
        "trainingInput.workerCont",
        "trainingInput.masterConfig.acceleratorConfig.kind",
        "trainingInput.masterConfig.acceleratorConfig",
    ]
    assert "workerCount?" in str(error).splitlines()[1]  # the close match
    misnamed = refusal(write(tmp_path, "trainingInputs:\n  scaleTier: BASIC\n"))
    assert fields(misnamed) == ["trainingInputs"] and "trainingInput?" in str(misnamed)
    assert fields(refusal(write(tmp_path, "trainingInput:\n  scaleTier: BASIC\nworkerCount: 2\n"))) == [
        "workerCount"  # a trainingInput field at the top level
    ]


def test_fields_that_are_not_hardware_are_ignored_with_a_note(tmp_path: Path) -> None:
    config = load_training_config(
        write(
            tmp_path, "jobId: j1\ntrainingInput:\n  scaleTier: BASIC\n  region: europe-west4\n  args: [--x]\n"
        )
    )
    assert "trainingInput.region ignored: give --location" in config.notes
    assert "jobId ignored: the pipeline names its jobs" in config.notes
    assert any(note.startswith("trainingInput.args ignored:") for note in config.notes)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("workerCount: nine\n  workerType: standard", "trainingInput.workerCount"),
        ("workerCount: -1\n  workerType: standard", "trainingInput.workerCount"),
        ("workerCount: true\n  workerType: standard", "trainingInput.workerCount"),
        ("workerCount: 2", "trainingInput.workerType"),  # required with workerCount > 0
        ("evaluatorCount: 1", "trainingInput.evaluatorCount"),  # this trainer has no evaluator task
        (
            "masterConfig: {acceleratorConfig: {count: four, type: NVIDIA_TESLA_V100}}",
            "trainingInput.masterConfig.acceleratorConfig.count",
        ),
        (
            "masterConfig: {acceleratorConfig: {type: NVIDIA_TESLA_V100}}",
            "trainingInput.masterConfig.acceleratorConfig.count",
        ),
        (
            "masterConfig: {acceleratorConfig: {count: 1, type: TPU_V2}}",
            "trainingInput.masterConfig.acceleratorConfig.type",
        ),
        ("masterConfig: [1, 2]", "trainingInput.masterConfig"),
    ],
)
def test_wrong_values_are_named(tmp_path: Path, body: str, field: str) -> None:
    path = write(tmp_path, f"trainingInput:\n  scaleTier: CUSTOM\n  masterType: n1-standard-8\n  {body}\n")
    assert fields(refusal(path)) == [field]


def test_a_count_may_be_a_digit_string_as_in_the_apis_json(tmp_path: Path) -> None:
    path = write(
        tmp_path, "trainingInput:\n  masterType: standard\n  workerType: standard\n  workerCount: '3'\n"
    )
    assert load_training_config(path).values["worker_count"] == 3


def test_a_machine_and_gpu_pair_vertex_refuses_names_the_fields(tmp_path: Path) -> None:
    # n1-standard-32 takes 4 or 8 V100s (docs/vertex.md#gpus-per-n1-machine-type), not 1.
    path = write(
        tmp_path,
        "trainingInput:\n  masterType: n1-standard-32\n  masterConfig:\n    acceleratorConfig: {count: 1, type: NVIDIA_TESLA_V100}\n",
    )
    error = refusal(path)
    assert fields(error) == ["trainingInput.masterType"]
    assert "trainingInput.masterConfig.acceleratorConfig" in str(error) and "4 or 8" in str(error)


def test_k80_suggestions_follow_the_n1_table(tmp_path: Path) -> None:
    # n1-standard-32: T4 2 or 4, V100 4 or 8 (docs/vertex.md#gpus-per-n1-machine-type): 8 K80s
    # become 4 T4s or 8 V100s.
    path = write(
        tmp_path,
        "trainingInput:\n  masterType: n1-standard-32\n  masterConfig:\n    acceleratorConfig: {count: 8, type: NVIDIA_TESLA_K80}\n",
    )
    message = str(refusal(path))
    assert "{count: 4, type: NVIDIA_TESLA_T4}" in message
    assert "{count: 8, type: NVIDIA_TESLA_V100}" in message


def test_tpu_machine_type_is_refused(tmp_path: Path) -> None:
    assert fields(refusal(write(tmp_path, "trainingInput:\n  masterType: cloud_tpu\n"))) == [
        "trainingInput.masterType"
    ]


def test_parameter_server_settings_without_servers_are_ignored(tmp_path: Path) -> None:
    path = write(tmp_path, "trainingInput:\n  masterType: standard\n  parameterServerType: large_model\n")
    notes = load_training_config(path).notes
    assert "trainingInput.parameterServerType ignored: trainingInput.parameterServerCount is 0" in notes


def test_custom_only_fields_with_basic_are_refused(tmp_path: Path) -> None:
    error = refusal(write(tmp_path, "trainingInput:\n  scaleTier: BASIC\n  workerCount: 2\n"))
    assert fields(error) == ["trainingInput.workerCount"]  # only read with scaleTier CUSTOM


def test_disk_config_maps_to_the_boot_disk_and_must_agree(tmp_path: Path) -> None:
    disk = "diskConfig: {bootDiskType: pd-standard, bootDiskSizeGb: 200}"
    path = write(
        tmp_path,
        f"trainingInput:\n  masterType: standard\n  masterConfig: {{{disk}}}\n"
        f"  workerType: standard\n  workerCount: 1\n  workerConfig: {{{disk}}}\n",
    )
    values = load_training_config(path).values
    assert (values["boot_disk_type"], values["boot_disk_size_gb"]) == ("pd-standard", 200)
    path.write_text(
        path.read_text().replace("bootDiskSizeGb: 200}}\n  workerType", "bootDiskSizeGb: 300}}\n  workerType")
    )
    assert fields(refusal(path)) == ["trainingInput.workerConfig.diskConfig.bootDiskSizeGb"]


def test_what_the_pool_builder_refuses_names_the_field(tmp_path: Path) -> None:
    path = write(
        tmp_path, "trainingInput:\n  masterType: standard\n  workerType: standard\n  workerCount: 600\n"
    )
    assert fields(refusal(path)) == ["trainingInput.workerCount"]  # as the pool builder says worker_count


def test_a_key_given_twice_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "trainingInput:\n  masterType: standard\n  workerCount: 1\n  workerCount: 2\n")
    error = refusal(path)
    # and the count YAML would keep (2) wants a workerType
    assert fields(error) == ["line 4", "trainingInput.workerType"] and "'workerCount'" in str(error)


def test_malformed_yaml_is_one_line_naming_the_path(tmp_path: Path) -> None:
    path = write(tmp_path, "trainingInput:\n  scaleTier: [CUSTOM\n")
    error = refusal(path)
    assert fields(error) == [] and str(error).startswith(f"{path}: ")
    assert "line 3" in str(error) and "\n" not in str(error)


@pytest.mark.parametrize("text", ["", "- a\n- b\n"])
def test_a_file_without_a_mapping_is_refused(tmp_path: Path, text: str) -> None:
    error = refusal(write(tmp_path, text))
    assert fields(error) == [] and str(error).startswith(f"{tmp_path / 'config.yaml'}: ")


def test_a_missing_file_is_one_line_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    assert str(refusal(path)) == f"{path}: no such file"


def test_describe_pools_lets_the_builders_error_through() -> None:
    with pytest.raises(ValueError, match="worker_count"):
        describe_pools({"chief_machine_type": "n1-standard-8", "worker_count": 600})


def test_the_flag_takes_a_file() -> None:
    parser = build_parser(pipeline.parameters_for("vertex"))
    assert parser.parse_args(["--training_config", "config.yaml"]).training_config == "config.yaml"
    assert parser.parse_args([]).training_config is None
    assert "--training_config FILE" in parser.format_help()


# --- through the front door: `make run ARGS="--training_config FILE"` and `make schedule` ---------


def test_make_run_refuses_the_docs_examples_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from launch import cli

    monkeypatch.chdir(tmp_path)  # no env.sh: the local target
    for text in (DOC_EXAMPLE_COMPUTE_ENGINE, DOC_EXAMPLE_LEGACY):
        path = tmp_path / "config.yaml"
        path.write_text(text)
        with pytest.raises(SystemExit) as exit_:
            cli.main(["run", "--training_config", str(path), "--runs_dir", str(tmp_path / "runs")], {})
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "parameterServerCount" in err and "K80" in err and "Traceback" not in err
        assert f": error: --training_config: {path}: " in err  # the prefix said once
        assert not (tmp_path / "runs").exists()


def test_make_run_runs_a_v100_file_locally_on_cpu_with_its_pools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from launch import cli

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "config.yaml"
    path.write_text(
        "trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard_v100\n  workerCount: 2\n"
        "  workerType: standard_v100\n"
    )
    seen: dict[str, object] = {}
    monkeypatch.setattr(cli, "run_local", lambda args, *a, **k: seen.update(args) or 0)
    code = cli.main(["run", "--training_config", str(path), "--worker_count", "1"], {})
    assert code == 0
    out = capsys.readouterr().out
    assert "--worker_count 1 wins over trainingInput.workerCount (2)" in out
    assert "pool 0: 1 x n1-standard-8 + 1 x NVIDIA_TESLA_V100 (chief)" in out
    assert "the local target runs the file's GPU pools here on CPU" in out
    assert seen["chief_machine_type"] == "n1-standard-8" and seen["worker_count"] == 1
    assert seen["chief_accelerator_count"] == 0 and seen["worker_accelerator_type"] == ""


def test_make_run_keeps_gpu_flags_given_beside_a_file_and_judges_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flag wins over the file, locally too: the pre-flight then refuses GPUs this machine
    lacks, as it does without a file (never a silent run on CPU)."""
    from launch import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("local.gpus.local_gpus", lambda *a, **k: [])
    path = tmp_path / "config.yaml"
    path.write_text("trainingInput:\n  scaleTier: CUSTOM\n  masterType: n1-standard-8\n")
    monkeypatch.setattr(cli, "run_local", lambda args, *a, **k: 0)
    flags = ["--chief_accelerator_type", "NVIDIA_TESLA_T4", "--chief_accelerator_count", "1"]
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--training_config", str(path), *flags], {})
    assert exit_.value.code == 2
    assert "chief_accelerator_count" in capsys.readouterr().err


def test_make_schedule_refuses_a_bad_file_before_any_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from launch import schedules

    path = tmp_path / "config.yaml"
    path.write_text(DOC_EXAMPLE_LEGACY)
    environ = {
        "PROJECT_ID": "p-proj",
        "REGION": "us-central1",
        "PIPELINE_ROOT": "gs://p-proj-b/root",
        "ARTIFACT_REPOSITORY": "us-central1-docker.pkg.dev/p-proj/training",
        "TEMPLATE_REPOSITORY": "https://us-central1-kfp.pkg.dev/p-proj/pipelines",
        "API_ENDPOINT": "http://127.0.0.1:1",
        "CRON": "0 6 * * 1",
    }
    code = schedules.schedule_command(["schedule", "--training_config", str(path)], environ)
    assert code == 2
    err = capsys.readouterr().err
    assert f"make schedule: --training_config: {path}: " in err and "parameterServerCount" in err
