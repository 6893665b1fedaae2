"""`--training_config FILE`: an AI Platform Training job config (YAML) read as the pipeline's hardware
parameters (docs/vertex.md#moving-from-ai-platform-training---training_config-file).

Only what has a faithful Vertex AI equivalent is mapped; the rest is refused, every problem of the
file in one `TrainingConfigError`, each naming the YAML field and the nearest choice that works.

Sources (AI Platform Training is shut down; its pages are archived):
- TrainingInput and ReplicaConfig, the fields and the legacy machine types with the GPUs each
  includes ("A machine equivalent to standard that also includes a single NVIDIA Tesla K80 GPU",
  ...): https://cloud.google.com/ai-platform/training/docs/reference/rest/v1/projects.jobs#TrainingInput
- The scale tiers (ScaleTier: BASIC "a single worker instance", STANDARD_1 "many workers and a few
  parameter servers", PREMIUM_1 "a large number of workers with many parameter servers", BASIC_GPU
  "a single worker instance with a K80 GPU", BASIC_TPU, CUSTOM), same page; and "Specifying
  machine types or scale tiers": https://cloud.google.com/ai-platform/training/docs/machine-types
- The GPU-enabled legacy machine types: https://cloud.google.com/ai-platform/training/docs/using-gpus
- The Compute Engine machine of each legacy type (`LEGACY_MACHINE_TYPES`): AI Platform's pricing
  page lists each at the price of its equivalent (the figures: docs/vertex.md#sources):
  https://cloud.google.com/ml-engine/docs/pricing (the 2019 version, archived).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import yaml

from components import hardware
from launch import settings

K80, P100, T4, V100 = hardware.K80, hardware.P100, hardware.T4, hardware.V100

# AI Platform's legacy machine type -> (Compute Engine machine type, GPU type, GPUs per machine).
# AI Platform's table, whole: the K80 rows and complex_model_s are refused when read (see above).
LEGACY_MACHINE_TYPES: dict[str, tuple[str, str, int]] = {
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
SCALE_TIERS = ("BASIC", "STANDARD_1", "PREMIUM_1", "BASIC_GPU", "BASIC_TPU", "CUSTOM")
BASIC_MACHINE = "n1-standard-4"  # BASIC: one machine, priced as `standard`

# The fields this module reads: the mapped ones, and those ignored with a note (not hardware: the
# pipeline has its own flag, or builds its own trainer image).
MAPPED_FIELDS = (
    "scaleTier",
    "masterType",
    "masterConfig",
    "workerType",
    "workerConfig",
    "workerCount",
    "parameterServerType",
    "parameterServerConfig",
    "parameterServerCount",
    "evaluatorType",
    "evaluatorConfig",
    "evaluatorCount",
)
OWN_IMAGE = "the pipeline builds and runs its own trainer image"
IGNORED_FIELDS = {
    "region": "give --location",
    "serviceAccount": "give --service_account",
    "network": "give --network",
    "encryptionConfig": "give --encryption_spec_key_name",
    "scheduling": "give --timeout (maxRunningTime) and --scheduling_strategy",
    "hyperparameters": "give --tune true (the pipeline's own study)",
    **dict.fromkeys(("args", "packageUris", "pythonModule", "runtimeVersion", "pythonVersion"), OWN_IMAGE),
    "jobDir": "the pipeline gives every job its own base output directory",
    "useChiefInTfConfig": "Vertex AI's TF_CONFIG names pool 0 chief",
    "enableWebAccess": "the pipeline does not open interactive shells",
}
JOB_FIELDS = {"jobId": "the pipeline names its jobs", "labels": "give --labels"}
ACCELERATOR_FIELDS = ("count", "type")
DISK_FIELDS = {"bootDiskType": "boot_disk_type", "bootDiskSizeGb": "boot_disk_size_gb"}  # -> parameter

K80_WHY = (
    f"{K80} is end of support on Vertex AI (aiplatform_v1 AcceleratorType marks it deprecated) and "
    "TensorFlow 2.21 ships CUDA kernels for compute capability 6.0 and newer only (the K80 is 3.7)"
)
TPU_WHY = "the trainer runs MultiWorkerMirroredStrategy on CPUs and NVIDIA GPUs and the pipeline takes no TPU"

PARAMETER_SERVERS_WHY = (
    "parameter servers have no role under MultiWorkerMirroredStrategy, which this trainer uses (the "
    "workers all-reduce the gradients among themselves); nearest: drop parameterServerCount and "
    "parameterServerType (all-reduce needs none), or offload the all-reduce with "
    "--reduction_server_count N (Reduction Server; needs GPU workers)"
)
EVALUATORS_WHY = (
    "this trainer has no evaluator task (the chief evaluates on the test split after training); "
    "nearest: drop evaluatorCount and evaluatorType"
)


def v100_nearest(type_key: str = "masterType") -> str:
    return f"{type_key}: standard_v100 (n1-standard-8 + 1 x {V100})"


def shape(machine: str, gpu: str, count: int) -> str:
    return f"{machine} + {count} x {gpu}" if gpu and count else f"{machine}, no GPU"


def n1_nearest(machine: str) -> str | None:
    """For an N1 name outside the N1 table, its nearest machines there; None for a non-N1 name."""
    found = re.fullmatch(r"n1-(standard|highmem|highcpu)-(\d+)", machine)
    if not found or machine in hardware.N1_GPU_COUNTS:
        return None
    family, vcpus = found.group(1), int(found.group(2))
    sizes = sorted(int(m.rsplit("-", 1)[1]) for m in hardware.N1_GPU_COUNTS if m.startswith(f"n1-{family}-"))
    bigger = [s for s in sizes if s >= vcpus]
    options = [f"n1-{family}-{bigger[0] if bigger else sizes[-1]}"]
    if f"n1-standard-{vcpus}" in hardware.N1_GPU_COUNTS and family != "standard":
        options.append(f"n1-standard-{vcpus} ({vcpus} vCPUs, more memory)")
    return " or ".join(options)


def k80_nearest(machine: str, count: int, type_key: str, config_key: str, legacy: bool) -> str:
    """The V100 / T4 choices on the same machine that the N1 table allows (K80's count, or the
    closest allowed); `legacy`: the K80 came from a legacy machine type, so name the machine too."""
    options = [
        f"{type_key}: {name} ({shape(m, g, c)})"
        for name, (m, g, c) in LEGACY_MACHINE_TYPES.items()
        if legacy and (m, g, c) == (machine, V100, count)
    ]
    has_legacy_v100 = bool(options)
    for gpu in (T4, V100):
        counts = hardware.allowed_counts(machine, gpu)
        if not counts or (gpu == V100 and has_legacy_v100):
            continue
        n = count if count in counts else max((c for c in counts if c <= count), default=min(counts))
        accelerator = f"{config_key}.acceleratorConfig {{count: {n}, type: {gpu}}}"
        options.append(f"{type_key}: {machine} with {accelerator}" if legacy else accelerator)
    return " or ".join(options) or v100_nearest(type_key)


TRAINING_CONFIG_MAX_BYTES = 1 << 20  # a config of a few dozen lines; anything larger is not one


class TrainingConfigError(ValueError):
    """A --training_config file that cannot be read or mapped; the message lists every problem,
    one per line, each starting with the YAML field it is about (`line N` for a key given twice)."""

    @property
    def fields(self) -> list[str]:
        """The field each listed problem names, in order (empty for a one-line error)."""
        return re.findall(r"^  - (line \d+|[^\s:(]+)", str(self), re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """The hardware parameters a file maps to. `sources[name]` is (the YAML field, the value as
    shown) the parameter came from; `notes` the lines to print (mappings, ignored fields)."""

    values: dict[str, Any]
    sources: dict[str, tuple[str, str]]
    notes: tuple[str, ...]


class _Loader(yaml.SafeLoader):
    """SafeLoader that records keys given twice in one mapping (YAML would keep the last)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[str] = []


def _mapping(loader: _Loader, node: Any, deep: bool = False) -> Any:
    seen: set[tuple[str, str]] = set()
    for key_node, _ in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
            if (key_node.tag, key_node.value) in seen:
                loader.duplicates.append(
                    f"line {key_node.start_mark.line + 1}: {key_node.value!r} given twice in one mapping "
                    "(YAML would keep the last)"
                )
            seen.add((key_node.tag, key_node.value))
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def _close(key: str, known: list[str]) -> str:
    by_lower = {k.lower(): k for k in known}
    match = difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=0.6)
    return f"did you mean {by_lower[match[0]]}? " if match else ""


class _Reader:
    """Reads one trainingInput mapping, collecting every problem instead of stopping at the first."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.values: dict[str, Any] = {}
        self.sources: dict[str, tuple[str, str]] = {}
        self.disks: dict[str, tuple[str, Any]] = {}  # pipeline parameter -> (field, value)

    def field(self, *parts: str) -> str:
        return self.prefix + ".".join(parts)

    def set(self, name: str, value: Any, field: str, shown: str) -> None:
        self.values[name] = value
        self.sources[name] = (field, shown)

    def keys(
        self, mapping: Mapping[Any, Any], where: str, known: tuple[str, ...], ignored: Mapping[str, str]
    ) -> None:
        """Unknown keys are problems (with a close match when there is one); ignored ones notes."""
        names = [*known, *ignored]
        for key in mapping:
            if key in known:
                continue
            if key in ignored:
                self.notes.append(f"{where}{key} ignored: {ignored[key]}")
                continue
            self.problems.append(
                f"{where}{key}: unknown field; {_close(str(key), names)}known: {', '.join(names)}"
            )

    def count(self, value: Any, field: str) -> int | None:
        """A whole number >= 0 (the API's int64 fields also come as digit strings)."""
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.problems.append(f"{field}: expected a whole number >= 0, got {value!r}")
            return None
        return value

    def read(self, body: Mapping[Any, Any]) -> None:
        self.keys(body, self.prefix, MAPPED_FIELDS, {**IGNORED_FIELDS, **({} if self.prefix else JOB_FIELDS)})
        tier = self.tier(body)
        if tier is None:
            return
        if tier != "CUSTOM":
            for key in MAPPED_FIELDS:
                if key in body and key != "scaleTier" and not key.endswith("Config"):
                    self.problems.append(
                        f"{self.field(key)}: only read with scaleTier CUSTOM (AI Platform's rule); "
                        f"set {self.field('scaleTier')} to CUSTOM or drop it"
                    )
        if tier == "BASIC":
            self.notes.append(f"{self.field('scaleTier')} BASIC -> one {BASIC_MACHINE}, no GPU, no workers")
            for role in ("master", "worker"):
                if role + "Config" in body:
                    self.replica(body[role + "Config"], role + "Config", gpus_allowed=False)
            field = self.field("scaleTier")
            shown = (f"BASIC -> {BASIC_MACHINE}", "BASIC -> no GPU", "BASIC -> 0")
            self.role_values("chief", (BASIC_MACHINE, "", 0), (field,) * 3, shown)
            self.set("worker_count", 0, self.field("scaleTier"), "BASIC -> no workers")
            self.no_workers()
        elif tier == "CUSTOM":
            self.custom(body)
        for name, (field, value) in self.disks.items():
            self.set(name, value, field, str(value))

    def tier(self, body: Mapping[Any, Any]) -> str | None:
        raw = body.get("scaleTier")
        field = self.field("scaleTier")
        if raw is None:
            if "masterType" in body:
                self.notes.append(f"{field} not set: CUSTOM, since {self.field('masterType')} is set")
                return "CUSTOM"
            self.problems.append(
                f"{field}: missing; set BASIC (one {BASIC_MACHINE}) or CUSTOM with {self.field('masterType')}"
            )
            return None
        if not isinstance(raw, str) or raw.upper() not in SCALE_TIERS:
            self.problems.append(
                f"{field}: {raw!r} is not a scale tier; {_close(str(raw), list(SCALE_TIERS))}"
                f"AI Platform's: {', '.join(SCALE_TIERS)}"
            )
            return None
        tier = raw.upper()
        custom = f"set {field} to CUSTOM with masterType, workerType and workerCount"
        if tier in ("STANDARD_1", "PREMIUM_1"):
            what = {
                "STANDARD_1": "many workers and a few parameter servers",
                "PREMIUM_1": "a large number of workers with many parameter servers",
            }[tier]
            self.problems.append(
                f"{field}: {tier} is AI Platform's fixed cluster of {what}: parameter servers have no role "
                "under MultiWorkerMirroredStrategy, which this trainer uses (the workers all-reduce the "
                f"gradients among themselves), and Vertex AI has no scale tiers; nearest: {custom}"
            )
        elif tier == "BASIC_GPU":
            self.problems.append(
                f"{field}: BASIC_GPU is one machine with one {K80} (priced as standard_gpu: n1-standard-8 + "
                f"1 x {K80}); {K80_WHY}; nearest: set {field} to CUSTOM with masterType standard_v100 "
                f"(n1-standard-8 + 1 x {V100}), or masterType n1-standard-8 with "
                f"masterConfig.acceleratorConfig {{count: 1, type: {T4}}}"
            )
        elif tier == "BASIC_TPU":
            self.problems.append(
                f"{field}: BASIC_TPU is one machine with a Cloud TPU; {TPU_WHY}; nearest: set {field} to "
                f"CUSTOM with masterType standard_v100 (n1-standard-8 + 1 x {V100})"
            )
        else:
            return tier
        return None

    def custom(self, body: Mapping[Any, Any]) -> None:
        workers = self.count(body.get("workerCount", 0), self.field("workerCount"))
        self.machine("master", "chief", body, required="scaleTier CUSTOM")
        if workers is not None:
            self.set("worker_count", workers, self.field("workerCount"), str(workers))
        needs = f"{self.field('workerCount')} > 0" if workers else ""
        if "workerType" in body or needs:
            self.machine("worker", "worker", body, required=needs)
        else:
            if "workerConfig" in body:
                self.replica(body["workerConfig"], "workerConfig", gpus_allowed=False)
            self.no_workers()
        for role, why in (("parameterServer", PARAMETER_SERVERS_WHY), ("evaluator", EVALUATORS_WHY)):
            key = role + "Count"
            n = self.count(body.get(key, 0), self.field(key))
            if n:
                self.problems.append(f"{self.field(key)} is {n}: {why}")
            elif n == 0:
                for other in (role + "Type", role + "Config"):
                    if other in body:
                        self.notes.append(f"{self.field(other)} ignored: {self.field(key)} is 0")

    def machine(self, role: str, pool: str, body: Mapping[Any, Any], required: str) -> None:
        """masterType/workerType and its config -> the pool's three parameters, or a problem."""
        type_key, config_key = role + "Type", role + "Config"
        field = self.field(type_key)
        accelerator = self.replica(body.get(config_key), config_key, gpus_allowed=True)
        raw = body.get(type_key)
        if raw is None:
            self.problems.append(f"{field}: missing; required with {required}")
            return
        if not isinstance(raw, str) or not raw:
            self.problems.append(f"{field}: expected a machine type name, got {raw!r}")
            return
        accelerator_field = self.field(config_key, "acceleratorConfig")
        if raw == "cloud_tpu":
            self.problems.append(
                f"{field}: cloud_tpu is a Cloud TPU; {TPU_WHY}; nearest: {v100_nearest(type_key)}"
            )
            return
        legacy = raw in LEGACY_MACHINE_TYPES
        if legacy:
            machine, gpu, count = LEGACY_MACHINE_TYPES[raw]
            if accelerator is not None:
                self.problems.append(
                    f"{accelerator_field}: given with the legacy machine type {raw} ({shape(machine, gpu, count)}), "
                    f"whose GPUs are fixed; drop it, or set {field} to a Compute Engine machine type"
                )
                return
            shown = (f"{raw} -> {machine}", f"{raw} -> {gpu or 'no GPU'}", f"{raw} -> {count}")
            fields = (field, field, field)
        else:
            machine, (gpu, count) = raw, accelerator or ("", 0)
            if accelerator is None:
                shown = (machine, f"{accelerator_field} not set: no GPU", "not set: 0")
                fields = (field, accelerator_field, accelerator_field)
            else:
                shown = (machine, gpu, str(count))
                fields = (field, accelerator_field + ".type", accelerator_field + ".count")
        if gpu == K80:
            what = (
                f"{field}: {raw} is {shape(machine, gpu, count)} (AI Platform's legacy machine type)"
                if legacy
                else f"{accelerator_field}.type: {K80} ({count} on {machine})"
            )
            choices = k80_nearest(machine, count, type_key, config_key, legacy=legacy)
            self.problems.append(f"{what}; {K80_WHY}; nearest: {choices}")
            return
        nearest = n1_nearest(machine)
        if nearest:
            what = f"{raw} is {machine}, which" if legacy else machine
            self.problems.append(
                f"{field}: {what} is not one of the N1 machine types AI Platform and Vertex AI list for "
                f"training; nearest: {nearest}"
            )
            return
        if legacy:
            self.notes.append(f"{field} {raw} -> {shape(machine, gpu, count)}")
        try:
            hardware.validate_machine(machine, gpu, count)
        except ValueError as err:
            with_gpu = f" with {accelerator_field} ({count} x {gpu})" if accelerator is not None else ""
            hint = _close(raw, [*LEGACY_MACHINE_TYPES, "cloud_tpu"]) if "_" in raw else ""
            self.problems.append(f"{field} ({raw}){with_gpu}: {err}{'; ' + hint.strip() if hint else ''}")
            return
        self.role_values(pool, (machine, gpu, count), fields, shown)

    def role_values(
        self, pool: str, values: tuple[str, str, int], fields: tuple[str, ...], shown: tuple[str, ...]
    ) -> None:
        """The pool's machine type, accelerator type and count, with the fields they come from."""
        suffixes = ("machine_type", "accelerator_type", "accelerator_count")
        for suffix, value, field, text in zip(suffixes, values, fields, shown, strict=True):
            self.set(f"{pool}_{suffix}", value, field, text)

    def no_workers(self) -> None:
        """No workerType: empty worker settings, which copy the chief's if a flag adds workers."""
        field, shown = self.field("workerType"), "not set: workers copy the chief"
        self.role_values("worker", ("", "", 0), (field,) * 3, (shown,) * 3)

    def replica(self, config: Any, key: str, gpus_allowed: bool) -> tuple[str, int] | None:
        """A ReplicaConfig: its acceleratorConfig as (type, count), None when absent; its
        diskConfig into `disks`."""
        if config is None:
            return None
        where = self.field(key)
        if not isinstance(config, Mapping):
            self.problems.append(f"{where}: expected a mapping, got {config!r}")
            return None
        ignored = dict.fromkeys(("imageUri", "containerCommand", "containerArgs"), OWN_IMAGE)
        self.keys(config, where + ".", ("acceleratorConfig", "diskConfig", "tpuTfVersion"), ignored)
        if "tpuTfVersion" in config:
            self.problems.append(
                f"{where}.tpuTfVersion: set for a Cloud TPU; {TPU_WHY}; nearest: drop it, and "
                f"{v100_nearest(key.replace('Config', 'Type'))}"
            )
        if "diskConfig" in config:
            self.disk(config["diskConfig"], where + ".diskConfig")
        accelerator = config.get("acceleratorConfig")
        if accelerator is None:
            return None
        where += ".acceleratorConfig"
        if not gpus_allowed:
            self.problems.append(
                f"{where}: GPUs are attached only with scaleTier CUSTOM and a Compute Engine machine type "
                f"(AI Platform's rule); set {self.field('scaleTier')} to CUSTOM with {self.field('masterType')}"
            )
            return None
        if not isinstance(accelerator, Mapping):
            self.problems.append(f"{where}: expected a mapping with count and type, got {accelerator!r}")
            return None
        self.keys(accelerator, where + ".", ACCELERATOR_FIELDS, {})
        gpu, count = accelerator.get("type"), accelerator.get("count")
        problems = len(self.problems)
        if not isinstance(gpu, str) or not gpu:
            self.problems.append(f"{where}.type: expected an accelerator type (e.g. {V100}), got {gpu!r}")
        elif gpu.startswith("TPU_"):
            self.problems.append(f"{where}.type: {gpu} is a Cloud TPU; {TPU_WHY}; nearest: {V100} or {T4}")
        if count is None:
            self.problems.append(f"{where}.count: missing (the GPUs per machine)")
        else:
            count = self.count(count, where + ".count")
        if len(self.problems) > problems or count is None:
            return None
        return str(gpu), count

    def disk(self, config: Any, where: str) -> None:
        if not isinstance(config, Mapping):
            self.problems.append(f"{where}: expected a mapping, got {config!r}")
            return
        self.keys(config, where + ".", tuple(DISK_FIELDS), {})
        for key, name in DISK_FIELDS.items():
            if key not in config:
                continue
            value = config[key]
            if name == "boot_disk_size_gb":
                value = self.count(value, f"{where}.{key}")
            elif not isinstance(value, str):
                self.problems.append(f"{where}.{key}: expected a disk type (e.g. pd-ssd), got {value!r}")
                value = None
            if value is None:
                continue
            if name in self.disks and self.disks[name][1] != value:
                first, before = self.disks[name]
                self.problems.append(
                    f"{where}.{key}: {value!r}, but {first} is {before!r}: the pipeline has one boot disk "
                    "setting for every replica; give both the same"
                )
                continue
            self.disks.setdefault(name, (f"{where}.{key}", value))


def _read_yaml(path: str | Path) -> tuple[Any, list[str]]:
    # Looked at before it is read: /dev/zero would fill memory, a FIFO block forever.
    try:
        text = settings.read_user_text(
            Path(path),
            TRAINING_CONFIG_MAX_BYTES,
            "a training config is a YAML file with trainingInput",
            "give the YAML file itself",
            "it is not a training config",
        )
    except settings.SettingsError as err:
        raise TrainingConfigError(f"--training_config {err}") from None
    if text is None:
        raise TrainingConfigError(f"--training_config {path}: no such file") from None
    loader = _Loader(text)
    try:
        doc = loader.get_single_data()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise TrainingConfigError(f"--training_config {path}: not valid YAML: {what}{where}") from None
    finally:
        loader.dispose()
    return doc, loader.duplicates


def load_training_config(path: str | Path) -> TrainingConfig:
    """Reads an AI Platform Training config file (a Job with `trainingInput`, as `gcloud
    ai-platform jobs submit training --config` took it, or the bare mapping) into the hardware
    parameters. Raises TrainingConfigError listing every problem, each naming its YAML field."""
    doc, duplicates = _read_yaml(path)
    if doc is None:
        raise TrainingConfigError(f"--training_config {path}: empty; expected a trainingInput mapping")
    if not isinstance(doc, Mapping):
        raise TrainingConfigError(
            f"--training_config {path}: expected a mapping with trainingInput, got {type(doc).__name__}"
        )
    reader = _Reader("trainingInput." if "trainingInput" in doc else "")
    reader.problems += duplicates
    if reader.prefix:
        for key in doc:
            if key in MAPPED_FIELDS or key in IGNORED_FIELDS:
                reader.problems.append(
                    f"{key}: a trainingInput field at the top level; indent it under trainingInput"
                )
            else:
                reader.keys({key: None}, "", ("trainingInput",), JOB_FIELDS)
        body = doc["trainingInput"]
        if not isinstance(body, Mapping):
            reader.problems.append(f"trainingInput: expected a mapping, got {body!r}")
            body = {}
    else:
        near = [k for k in doc if _close(str(k), ["trainingInput"])]
        if near and not any(k in MAPPED_FIELDS for k in doc):
            raise TrainingConfigError(
                f"--training_config {path}: 1 problem:\n  - {near[0]}: unknown field; did you mean trainingInput?"
            )
        reader.notes.append(f"{path}: no top-level trainingInput; read as the trainingInput mapping itself")
        body = doc
    reader.read(body)
    if not reader.problems:
        _check_pools(reader)
    if reader.problems:
        count = len(reader.problems)
        raise TrainingConfigError(
            f"--training_config {path}: {count} problem{'s' if count > 1 else ''}:\n"
            + "\n".join(f"  - {p}" for p in reader.problems)
        )
    return TrainingConfig(reader.values, reader.sources, tuple(reader.notes))


def _check_pools(reader: _Reader) -> None:
    """The real builder's checks (worker count range, boot disk), each line naming the YAML field."""
    try:
        describe_pools(reader.values)
    except ValueError as err:
        for line in str(err).splitlines():
            name = next((n for n in sorted(reader.sources, key=len, reverse=True) if line.startswith(n)), "")
            reader.problems.append(f"{reader.sources[name][0]} ({name}){line[len(name) :]}" if name else line)


def apply_training_config(path: str | Path, given: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The file's hardware parameters with the flags in `given` (values not None) over them, and
    the lines to print: the notes, then one per parameter where a flag won over the file."""
    from components.worker_pools import HARDWARE_PARAMETERS

    config = load_training_config(path)
    values = dict(config.values)
    lines = list(config.notes)
    for name in HARDWARE_PARAMETERS:
        flag = given.get(name)
        if flag is None:
            continue
        if name in values and flag != values[name]:
            field, shown = config.sources[name]
            lines.append(f"--{name} {repr(flag) if flag == '' else flag} wins over {field} ({shown})")
        values[name] = flag
    return values, lines


def describe_pools(values: Mapping[str, Any]) -> list[str]:
    """The worker pools `values` make, one line each, by `build_worker_pool_specs` (its checks
    apply, its ValueError propagates; no region is checked)."""
    from components.worker_pools import HARDWARE_PARAMETERS, build_worker_pool_specs

    if not values.get("chief_machine_type"):
        raise ValueError("chief_machine_type: required (the chief's machine type)")
    hardware_values = {k: values[k] for k in HARDWARE_PARAMETERS if k in values}
    specs = build_worker_pool_specs(image_uri="check", command=["python"], args=[], **hardware_values)
    roles = ("chief", "workers", "Reduction Server")
    lines = []
    for index, spec in enumerate(specs):
        m = spec["machine_spec"]
        gpus = f" + {m['accelerator_count']} x {m['accelerator_type']}" if "accelerator_type" in m else ""
        lines.append(f"pool {index}: {spec['replica_count']} x {m['machine_type']}{gpus} ({roles[index]})")
    return lines


def apply_to_namespace(ns: argparse.Namespace, target: str, out: TextIO | None = None) -> None:
    """`--training_config FILE`: sets its hardware parameters on `ns` (flags win) and prints the
    mapping and the worker pools; the local target has no GPUs, so it drops them, saying so."""
    if not getattr(ns, "training_config", None):
        return
    out = out or sys.stdout
    values, lines = apply_training_config(ns.training_config, vars(ns))  # flags given: not None
    out.write(f"training config {ns.training_config}:\n")
    for line in [*lines, *describe_pools(values)]:
        out.write(f"  {line}\n")
    if target == "local":
        dropped = {
            k: values[k] for k in ("chief_accelerator_count", "worker_accelerator_count") if values.get(k)
        }
        if dropped:
            out.write(
                "  the local target has no GPUs: these pools run here on CPU "
                f"({', '.join(f'{k} {v} -> 0' for k, v in dropped.items())})\n"
            )
            for role in ("chief", "worker"):
                values[f"{role}_accelerator_type"], values[f"{role}_accelerator_count"] = "", 0
    out.flush()
    for name, value in values.items():
        setattr(ns, name, value)
