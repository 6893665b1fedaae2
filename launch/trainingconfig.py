"""`--training_config FILE`: an AI Platform Training job config (YAML) read as the pipeline's hardware
parameters (docs/vertex.md#moving-from-ai-platform-training---training_config-file).

Only what has a faithful Vertex AI equivalent is mapped; the rest is refused, every problem of the
file in one `TrainingConfigError`, each naming the YAML field and the nearest choice that works.
AI Platform's fields, legacy machine types and scale tiers, with their sources: `launch.aiplatformjob`.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from components import hardware
from launch import aiplatformjob as aip
from launch import settings
from pipeline.options import jobs

TRAINING_CONFIG_MAX_BYTES = 1 << 20  # a config of a few dozen lines; anything larger is not one


class TrainingConfigError(ValueError):
    """A --training_config file that cannot be read or mapped: the path (callers name the flag), then
    every problem, one per line, each starting with its YAML field (`line N` for a key given twice)."""


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
            if key in ignored:
                self.notes.append(f"{where}{key} ignored: {ignored[key]}")
            elif key not in known:
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
        self.keys(
            body,
            self.prefix,
            aip.MAPPED_FIELDS,
            {**aip.IGNORED_FIELDS, **({} if self.prefix else aip.JOB_FIELDS)},
        )
        tier = self.tier(body)
        if tier is None:
            return
        if tier == "BASIC":
            for key in aip.MAPPED_FIELDS:
                if key in body and key != "scaleTier" and not key.endswith("Config"):
                    self.problems.append(
                        f"{self.field(key)}: only read with scaleTier CUSTOM (AI Platform's rule); "
                        f"set {self.field('scaleTier')} to CUSTOM or drop it"
                    )
            self.notes.append(
                f"{self.field('scaleTier')} BASIC -> one {aip.BASIC_MACHINE}, no GPU, no workers"
            )
            for role in ("master", "worker"):
                if role + "Config" in body:
                    self.replica(body[role + "Config"], role + "Config", gpus_allowed=False)
            field = self.field("scaleTier")
            shown = (f"BASIC -> {aip.BASIC_MACHINE}", "BASIC -> no GPU", "BASIC -> 0")
            self.role_values("chief", (aip.BASIC_MACHINE, "", 0), (field,) * 3, shown)
            self.set("worker_count", 0, field, "BASIC -> no workers")
            self.no_workers()
        else:
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
                f"{field}: missing; set BASIC (one {aip.BASIC_MACHINE}) or CUSTOM with {self.field('masterType')}"
            )
            return None
        if not isinstance(raw, str) or raw.upper() not in aip.SCALE_TIERS:
            self.problems.append(
                f"{field}: {raw!r} is not a scale tier; {_close(str(raw), list(aip.SCALE_TIERS))}"
                f"AI Platform's: {', '.join(aip.SCALE_TIERS)}"
            )
            return None
        tier = raw.upper()
        if tier in ("STANDARD_1", "PREMIUM_1"):
            what = "many workers and a few" if tier == "STANDARD_1" else "a large number of workers with many"
            self.problems.append(
                f"{field}: {tier} is AI Platform's fixed cluster of {what} parameter servers: parameter servers "
                "have no role under MultiWorkerMirroredStrategy, which this trainer uses (the workers all-reduce "
                "the gradients among themselves), and Vertex AI has no scale tiers; nearest: set "
                f"{field} to CUSTOM with masterType, workerType and workerCount"
            )
        elif tier == "BASIC_GPU":
            self.problems.append(
                f"{field}: BASIC_GPU is one machine with one {aip.K80} (priced as standard_gpu: n1-standard-8 + "
                f"1 x {aip.K80}); {aip.K80_WHY}; nearest: set {field} to CUSTOM with masterType standard_v100 "
                f"(n1-standard-8 + 1 x {aip.V100}), or masterType n1-standard-8 with "
                f"masterConfig.acceleratorConfig {{count: 1, type: {aip.T4}}}"
            )
        elif tier == "BASIC_TPU":
            self.problems.append(
                f"{field}: BASIC_TPU is one machine with a Cloud TPU; {aip.TPU_WHY}; nearest: set {field} to "
                f"CUSTOM with masterType standard_v100 (n1-standard-8 + 1 x {aip.V100})"
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
        for role, why in (("parameterServer", aip.PARAMETER_SERVERS_WHY), ("evaluator", aip.EVALUATORS_WHY)):
            key = role + "Count"
            if n := self.count(body.get(key, 0), self.field(key)):
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
                f"{field}: cloud_tpu is a Cloud TPU; {aip.TPU_WHY}; nearest: {aip.v100_nearest(type_key)}"
            )
            return
        legacy = raw in aip.LEGACY_MACHINE_TYPES
        if legacy:
            machine, gpu, count = aip.LEGACY_MACHINE_TYPES[raw]
            if accelerator is not None:
                self.problems.append(
                    f"{accelerator_field}: given with the legacy machine type {raw} ({aip.shape(machine, gpu, count)}), "
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
        if gpu == aip.K80:
            what = (
                f"{field}: {raw} is {aip.shape(machine, gpu, count)} (AI Platform's legacy machine type)"
                if legacy
                else f"{accelerator_field}.type: {aip.K80} ({count} on {machine})"
            )
            choices = aip.k80_nearest(machine, count, type_key, config_key, legacy=legacy)
            self.problems.append(f"{what}; {aip.K80_WHY}; nearest: {choices}")
            return
        if nearest := aip.n1_nearest(machine):
            what = f"{raw} is {machine}, which" if legacy else machine
            self.problems.append(
                f"{field}: {what} is not one of the N1 machine types AI Platform and Vertex AI list for "
                f"training; nearest: {nearest}"
            )
            return
        if legacy:
            self.notes.append(f"{field} {raw} -> {aip.shape(machine, gpu, count)}")
        try:
            hardware.validate_machine(machine, gpu, count)
        except ValueError as err:
            with_gpu = f" with {accelerator_field} ({count} x {gpu})" if accelerator is not None else ""
            hint = _close(raw, [*aip.LEGACY_MACHINE_TYPES, "cloud_tpu"]) if "_" in raw else ""
            self.problems.append(f"{field} ({raw}){with_gpu}: {err}{'; ' + hint.strip() if hint else ''}")
            return
        self.role_values(pool, (machine, gpu, count), fields, shown)

    def role_values(
        self, pool: str, values: tuple[str, str, int], fields: tuple[str, ...], shown: tuple[str, ...]
    ) -> None:
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
        ignored = dict.fromkeys(("imageUri", "containerCommand", "containerArgs"), aip.OWN_IMAGE)
        self.keys(config, where + ".", ("acceleratorConfig", "diskConfig", "tpuTfVersion"), ignored)
        if "tpuTfVersion" in config:
            self.problems.append(
                f"{where}.tpuTfVersion: set for a Cloud TPU; {aip.TPU_WHY}; nearest: drop it, and "
                f"{aip.v100_nearest(key.replace('Config', 'Type'))}"
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
        self.keys(accelerator, where + ".", aip.ACCELERATOR_FIELDS, {})
        gpu, count = accelerator.get("type"), accelerator.get("count")
        problems = len(self.problems)
        if not isinstance(gpu, str) or not gpu:
            self.problems.append(f"{where}.type: expected an accelerator type (e.g. {aip.V100}), got {gpu!r}")
        elif gpu.startswith("TPU_"):
            self.problems.append(
                f"{where}.type: {gpu} is a Cloud TPU; {aip.TPU_WHY}; nearest: {aip.V100} or {aip.T4}"
            )
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
        self.keys(config, where + ".", tuple(aip.DISK_FIELDS), {})
        for key, name in aip.DISK_FIELDS.items():
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
    try:
        text = settings.read_user_text(
            Path(path),
            TRAINING_CONFIG_MAX_BYTES,
            "a training config is a YAML file with trainingInput",
            "give the YAML file itself",
            "it is not a training config",
        )
    except settings.SettingsError as err:
        raise TrainingConfigError(str(err)) from None
    if text is None:
        raise TrainingConfigError(f"{path}: no such file") from None
    loader = _Loader(text)
    try:
        doc = loader.get_single_data()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise TrainingConfigError(f"{path}: not valid YAML: {what}{where}") from None
    finally:
        loader.dispose()
    return doc, loader.duplicates


def load_training_config(path: str | Path) -> TrainingConfig:
    """Reads an AI Platform Training config file (a Job with `trainingInput`, as `gcloud
    ai-platform jobs submit training --config` took it, or the bare mapping) into the hardware
    parameters. Raises TrainingConfigError listing every problem, each naming its YAML field."""
    doc, duplicates = _read_yaml(path)
    if doc is None:
        raise TrainingConfigError(f"{path}: empty; expected a trainingInput mapping")
    if not isinstance(doc, Mapping):
        raise TrainingConfigError(f"{path}: expected a mapping with trainingInput, got {type(doc).__name__}")
    reader = _Reader("trainingInput." if "trainingInput" in doc else "")
    reader.problems += duplicates
    if reader.prefix:
        for key in doc:
            if key in aip.MAPPED_FIELDS or key in aip.IGNORED_FIELDS:
                reader.problems.append(
                    f"{key}: a trainingInput field at the top level; indent it under trainingInput"
                )
            else:
                reader.keys({key: None}, "", ("trainingInput",), aip.JOB_FIELDS)
        body = doc["trainingInput"]
        if not isinstance(body, Mapping):
            reader.problems.append(f"trainingInput: expected a mapping, got {body!r}")
            body = {}
    else:
        near = [k for k in doc if _close(str(k), ["trainingInput"])]
        if near and not any(k in aip.MAPPED_FIELDS for k in doc):
            raise TrainingConfigError(
                f"{path}: 1 problem:\n  - {near[0]}: unknown field; did you mean trainingInput?"
            )
        reader.notes.append(f"{path}: no top-level trainingInput; read as the trainingInput mapping itself")
        body = doc
    reader.read(body)
    try:  # the real builder's checks (worker count range, boot disk), each line naming its YAML field
        if not reader.problems:
            describe_pools(reader.values)
    except ValueError as err:
        for line in str(err).splitlines():
            name = next((n for n in sorted(reader.sources, key=len, reverse=True) if line.startswith(n)), "")
            reader.problems.append(f"{reader.sources[name][0]} ({name}){line[len(name) :]}" if name else line)
    if reader.problems:
        count = len(reader.problems)
        raise TrainingConfigError(
            f"{path}: {count} problem{'s' if count > 1 else ''}:\n"
            + "\n".join(f"  - {p}" for p in reader.problems)
        )
    return TrainingConfig(reader.values, reader.sources, tuple(reader.notes))


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
    if not values.get("chief_machine_type"):
        raise ValueError("chief_machine_type: required (the chief's machine type)")
    roles = ("chief", "workers", "Reduction Server")
    return [
        f"pool {i}: {spec['replica_count']} x {jobs.pool_shape(spec['machine_spec'])} ({roles[i]})"
        for i, spec in enumerate(jobs.build_pools(values))
    ]


def apply_to_namespace(ns: argparse.Namespace, target: str) -> None:
    """`--training_config FILE`: sets its hardware parameters on `ns` (flags win) and prints the
    mapping and the worker pools; the local target drops the file's GPUs, saying so (GPU flags
    given are kept: the local pre-flight judges them as it judges them without a file)."""
    if not getattr(ns, "training_config", None):
        return
    values, lines = apply_training_config(ns.training_config, vars(ns))  # flags given: not None
    print(f"training config {ns.training_config}:")
    print("".join(f"  {line}\n" for line in [*lines, *describe_pools(values)]), end="")
    if target == "local":
        count = "{}_accelerator_count"
        roles = [
            r
            for r in ("chief", "worker")
            if values.get(count.format(r)) and getattr(ns, count.format(r)) is None
        ]
        if roles:
            dropped = ", ".join(f"{count.format(r)} {values[count.format(r)]} -> 0" for r in roles)
            print(f"  the local target runs the file's GPU pools here on CPU ({dropped})")
            for role in roles:
                values[f"{role}_accelerator_type"], values[f"{role}_accelerator_count"] = "", 0
    sys.stdout.flush()
    for name, value in values.items():
        setattr(ns, name, value)
