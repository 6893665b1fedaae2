"""The dataset's parameters and rules: the source each target can read, the Beam engine on
Dataflow (an extra) and its subnetwork, the shards per replica, a weights file."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.options.common import Parameter as _p
from pipeline.options.common import Problem, replicas, whole

PARAMETERS: tuple[_p, ...] = (
    _p("dataset_source", str, "tfds:cassava", "tfds:NAME, folder:PATH or synthetic.", "synthetic"),
    _p("image_size", int, 300, "Image side in pixels (the codelab resizes to 300).", 64),
    _p("dataset_shards", int, 32, "TFRecord shards per split (>= workers, for FILE sharding).", 8),
    _p(
        "prepare_engine",
        str,
        "job",
        "How the dataset is prepared: job (one process on one machine) or beam (an Apache Beam "
        "pipeline: on Dataflow on Vertex, in Beam's local worker processes locally; resumable; the "
        "same bytes). docs/training.md#preparing-on-apache-beam.",
    ),
    _p(
        "dataflow_max_workers",
        int,
        8,
        "prepare_engine=beam: the most Dataflow workers the preparation may scale to.",
        targets=("vertex",),
        # dataflow_v1beta3 FlexTemplateRuntimeEnvironment.max_workers: "from 1 to 1000". GCPC's
        # launcher drops a 0 from the request (json_util.recursive_remove_empty), so Dataflow
        # would choose the count.
        bounds=(1, 1000),
    ),
    _p(
        "dataflow_machine_type",
        str,
        "n1-standard-4",
        "prepare_engine=beam: the Dataflow workers' machine type.",
        targets=("vertex",),
    ),
    _p(
        "dataflow_subnetwork",
        str,
        "",
        "prepare_engine=beam: the Dataflow workers' subnetwork, regions/REGION/subnetworks/NAME or "
        "(Shared VPC) https://www.googleapis.com/compute/v1/projects/HOST/regions/REGION/subnetworks/NAME; "
        "needed with a custom-mode network ('': the network alone, taken as auto-mode).",
        targets=("vertex",),
    ),
    _p("synthetic_per_class", int, 60, "Training images per class of the synthetic source."),
    _p("seed", int, 42, "Seed of the split carving and of training."),
)

# This capability's rows of docs/options.md#the-rules (`make docs`): parameters | rule | source.
RULES = """
| `dataset_shards`, `worker_count` | at least one shard per training replica (each reads whole files: FILE auto-sharding) | `trainer/data.py` |
| `dataflow_machine_type` (prepare_engine=beam, Vertex) | a Compute Engine machine type name, custom ones too (`n1-standard-4`, `n2-custom-4-16384`) | "Customizing worker VMs" (Dataflow docs) |
| `dataset_source` | `tfds:NAME`, `folder:PATH` or `synthetic`; on Vertex a folder must be in Cloud Storage (`folder:gs://...`); locally it must exist | the preparation job runs on Vertex |
"""


# The first bytes of an HDF5 file (the HDF5 format specification, "Format Signature"): the one
# weights-file format `--weights PATH` loads (tf_keras `load_weights` of a single local file).
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def data_problems(v: Mapping[str, Any], target: str) -> list[Problem]:
    problems = []

    def add(parameters: tuple[str, ...], message: str) -> None:
        problems.append(Problem(parameters, message))

    source = str(v["dataset_source"])
    # A local folder is judged by the preparation's own rules (trainer_flags.source_problems), which
    # leave a Cloud Storage one to the job: a local run has no Cloud Storage.
    path = source.removeprefix("folder:")
    remote = path.startswith(("gs://", "/gcs/"))
    if target == "vertex" and source.startswith("folder:") and not remote:
        add(
            ("dataset_source",),
            f"{source}: the preparation job runs on Vertex, where only Cloud Storage is "
            "reachable: give folder:gs://<bucket>/<path> (or folder:/gcs/<bucket>/<path>)",
        )
    elif target == "local" and source.startswith("folder:") and remote and not Path(path).is_dir():
        add(("dataset_source",), f"{source}: no such folder (a local run reads a folder on this machine)")
    if target == "vertex" and v.get("prepare_engine") == "beam" and not source.startswith("folder:"):
        # The Flex Template's launcher lists the source and plans the shards before any worker, in a
        # time Dataflow bounds ("Timeout in polling result file", docs/training.md#preparing-on-apache-beam).
        # TFDS runs a builder on Beam only when its _generate_examples returns a Beam transform
        # (tensorflow_datasets/core/split_builder.py), and cassava's is a generator.
        why = (
            "the synthetic source is made in a temporary folder of the Flex Template's launcher, which "
            "Dataflow's workers cannot read"
            if source == "synthetic"
            else "TFDS builds it in one process before Beam starts (its generator is no Beam transform), "
            "and on Dataflow that process is the Flex Template's launcher, whose time Dataflow bounds"
        )
        add(
            ("dataset_source", "prepare_engine"),
            f"{source}: prepare_engine=beam on Vertex prepares a folder of images on Cloud Storage "
            f"(folder:gs://<bucket>/<path>): {why}; use prepare_engine=job for this source",
        )
    if problem := _weights_problem(str(v["weights"]), target):
        add(("weights",), problem)
    fraction = v["fine_tune_fraction"]
    if isinstance(fraction, int | float) and fraction < 0 and fraction != -1:
        add(("fine_tune_fraction",), f"must be -1 (the trainer's default) or from 0 to 1, got {fraction}")
    shards, count = v["dataset_shards"], replicas(v)
    if whole(shards) and shards < count:
        add(
            ("dataset_shards", "worker_count"),
            f"{shards} shards per split for {count} training replicas: each replica reads whole "
            f"files (FILE auto-sharding), so give at least {count}",
        )
    return problems


def _weights_problem(weights: str, target: str) -> str:
    """Why `weights` names no weights file the training job can read ("" when it does): on Vertex
    a Cloud Storage path, locally a regular HDF5 file."""
    if weights.lower() in ("imagenet", "none") or not weights.strip():
        return ""  # the trainer's own parser names an empty value (trainer_flag_problems)
    if weights.startswith(("gs://", "/gcs/")):
        if target == "vertex" or os.path.isdir("/gcs"):
            return ""
        return f"{weights}: Cloud Storage is not reachable from a local run; give a local file"
    if target == "vertex":
        return (
            f"{weights}: the training job runs on Vertex, where only Cloud Storage is reachable: "
            "give gs://<bucket>/<file>.h5 (or /gcs/<bucket>/<file>.h5)"
        )
    path = Path(weights)
    if not path.is_file():
        what = "not a regular file" if path.exists() else "no such file"
        return f"{weights}: {what} (imagenet, none, or an HDF5 weights file)"
    try:
        with path.open("rb") as handle:
            head = handle.read(len(HDF5_SIGNATURE))
    except OSError as err:
        return f"{weights}: cannot be read ({err.strerror or err})"
    if head != HDF5_SIGNATURE:
        return (
            f"{weights}: not an HDF5 weights file (saved by Keras `model.save_weights('x.h5')`); "
            "a .keras archive or a TF checkpoint is not loaded by --weights"
        )
    return ""


# A Dataflow job's subnetwork, as GCPC's DataflowFlexTemplateJobOp documents it
# (v1/dataflow/flex_template/component.py, `subnetwork`): an abbreviated path, or the complete URL
# a Shared VPC's subnetwork needs.
_SUBNETWORK = re.compile(
    r"(?:https://www\.googleapis\.com/compute/v1/projects/[a-z][-a-z0-9:.]{4,61}[a-z0-9]/)?"
    r"regions/(?P<region>[a-z]+-[a-z]+[0-9]+)/subnetworks/[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
)


# Dataflow takes any Compute Engine machine type, custom ones too ("Customizing worker VMs",
# https://cloud.google.com/dataflow/docs/guides/configure-worker-vm): the name's form is checked
# here (lowercase words joined by hyphens, n1-standard-4, n2-custom-4-16384); whether the region
# has it, only the Dataflow launch says.
_MACHINE_TYPE = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)+")
_MACHINE_TYPE_WHY = (
    "is not a Compute Engine machine type name (lowercase words joined by hyphens: n1-standard-4)"
)


def dataflow_problems(v: Mapping[str, Any], region: str, warnings: list[str]) -> list[Problem]:
    """prepare_engine=beam on Vertex: the Dataflow workers' subnetwork. Dataflow takes a network
    given alone as an auto-mode network of the job's project ("Specify a network and subnetwork",
    https://cloud.google.com/dataflow/docs/guides/specifying-networks); a custom-mode network, or a
    Shared VPC's, needs the subnetwork, in the job's region."""
    problems = []
    machine = v.get("dataflow_machine_type")
    if v.get("prepare_engine") == "beam" and not (
        isinstance(machine, str) and _MACHINE_TYPE.fullmatch(machine)
    ):
        problems.append(Problem(("dataflow_machine_type",), f"{machine!r} {_MACHINE_TYPE_WHY}"))
    subnetwork = str(v.get("dataflow_subnetwork") or "")
    if not subnetwork:
        if v.get("prepare_engine") == "beam" and v.get("network"):
            warnings.append(
                "prepare_engine=beam with a network and no dataflow_subnetwork: Dataflow takes the network "
                "by name as an auto-mode network of the job's project; for a custom-mode or Shared VPC "
                "network give dataflow_subnetwork (regions/<region>/subnetworks/<name>)"
            )
        return problems
    match = _SUBNETWORK.fullmatch(subnetwork)
    if not match:
        why = (
            "is not regions/REGION/subnetworks/NAME nor "
            "https://www.googleapis.com/compute/v1/projects/PROJECT/regions/REGION/subnetworks/NAME"
        )
    elif region and match.group("region") != region:
        why = (
            f"is in {match.group('region')}; the Dataflow job runs in {region}, its workers in a "
            "subnetwork of that region"
        )
    else:
        return problems
    return [*problems, Problem(("dataflow_subnetwork",), f"{subnetwork!r} {why}")]
