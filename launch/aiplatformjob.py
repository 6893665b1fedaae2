"""AI Platform Training's job fields and legacy machine types as `--training_config` reads them
(`launch.trainingconfig`), and the nearest Vertex AI choice for what has no equivalent.

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

import re

from components import hardware

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
    *(f"{r}{p}" for r in ("worker", "parameterServer", "evaluator") for p in ("Type", "Config", "Count")),
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
