"""The local target's own parameter (`registry_dir`) and rules: this machine's GPUs and processes,
its serving environments, a TFDS source it can prepare, a registry folder it can write."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components import servingimage, worker_pools
from pipeline.options.common import Parameter as _p
from pipeline.options.common import Problem

PARAMETERS: tuple[_p, ...] = (
    _p("registry_dir", str, "local_runs/registry", "Folder of the local model registry.", targets=("local",)),
)

# The most trainer processes a local run starts at once: one job's chief and 8 workers, or the
# replicas of all the tuning trials running at the same time.
MAX_LOCAL_WORKERS = 8


MAX_LOCAL_REPLICAS = 1 + MAX_LOCAL_WORKERS


def local_problems(args: Mapping[str, Any]) -> list[Problem]:
    """The module's rules; at most MAX_LOCAL_WORKERS workers, and parallel trials within the same bound."""
    from local import gpus, servingenv

    problems: list[Problem] = []

    def add(parameters: tuple[str, ...], message: str) -> None:
        problems.append(Problem(parameters, message))

    # GPUs asked of a machine without them: refused before any step, in the line the local job
    # runner and every replica would give (local.gpus.gpu_shortfall, trainer.distribute's rule).
    seen = gpus.local_gpus()
    given = {k: args[k] for k in worker_pools.HARDWARE_PARAMETERS if k.startswith(("chief_", "worker_"))}
    for pool, (role, machine, gpu, asked, _) in enumerate(worker_pools.trainer_pools(**given)):  # as built
        if isinstance(asked, int) and asked > 0:
            where = f"this machine ({gpus.GPU_DRIVER_DIR})"
            problem = gpus.gpu_shortfall(
                f"workerpool{pool}", role, str(machine), str(gpu), asked, seen, where
            )
            if problem:
                add(
                    (f"{role}_accelerator_count",),
                    f"{problem}; set it to 0 (and {role}_accelerator_type to '') to train on CPU",
                )
    workers, parallel = args["worker_count"], args["parallel_trial_count"]
    if isinstance(workers, int) and workers > MAX_LOCAL_WORKERS:
        add(
            ("worker_count",),
            f"{workers} is more processes than a local run should start (max {MAX_LOCAL_WORKERS})",
        )
    elif args["tune"] and isinstance(workers, int) and isinstance(parallel, int):
        # Each trial is a job of its own with the same pools: parallel trials multiply the
        # replicas (6 trials of 2 replicas: 14 trainer processes, 5.8 GB on this machine).
        per_trial = 1 + workers
        if parallel * per_trial > MAX_LOCAL_REPLICAS:
            add(
                ("parallel_trial_count", "worker_count"),
                f"{parallel} trials at once of {per_trial} replicas each is {parallel * per_trial} "
                f"trainer processes; a local run starts at most {MAX_LOCAL_REPLICAS} at once: give "
                f"parallel_trial_count at most {max(1, MAX_LOCAL_REPLICAS // per_trial)}",
            )
    version = args["serving_tf_version"]
    try:  # the serving image this run would register with (auto: decided on today's date)
        serving = servingimage.resolve_serving_image(args["serving_image"], version)
    except ValueError:
        serving = ""  # an unknown version: named by registry_problems
    # The local registry serves each version under its serving image's TensorFlow: a prebuilt
    # image's, named by serving_tf_version or by the image's address.
    by_address = servingimage.prebuilt_tf_version(str(args["serving_image"]))
    if (by_address or (version if serving == "prebuilt" else "")) not in ("", *servingenv.PINS):
        add(
            ("serving_image",) if by_address else ("serving_tf_version",),
            f"{by_address or version} has no local serving environment; the local target "
            f"checks models under: {', '.join(sorted(servingenv.PINS))}",
        )
    if problem := tfds_source_problem(str(args["dataset_source"]), os.environ):
        add(("dataset_source",), problem)
    if problem := _registry_dir_problem(str(args["registry_dir"]), str(args["model_display_name"])):
        add(("registry_dir",), problem)
    return problems


# Where TFDS downloads from: its own mirror of prepared datasets in Cloud Storage (gs://tfds-data,
# tried first) and the sources' sites; a machine that cannot reach this host has no internet.
INTERNET_PROBE = ("storage.googleapis.com", 443)


def internet_reachable(timeout: float = 3.0) -> bool:
    import socket

    try:
        with socket.create_connection(INTERNET_PROBE, timeout=timeout):
            return True
    except OSError:
        return False


def tfds_source_problem(source: str, environ: Mapping[str, str]) -> str:
    """A `tfds:NAME` source that preparation would have to download on a machine without the
    internet: refused now, in seconds, instead of after TFDS's retries (221 s for tfds:mnist).
    TFDS keeps a prepared dataset in `$TFDS_DATA_DIR/<name>/[<config>/]<version>/dataset_info.json`
    (default data dir ~/tensorflow_datasets: tfds.core.constants.DATA_DIR)."""
    if not source.startswith("tfds:"):
        return ""
    name = source.removeprefix("tfds:").split(":")[0].split("/")[0]
    data_dir = Path(environ.get("TFDS_DATA_DIR") or Path.home() / "tensorflow_datasets")
    folder = data_dir / name
    prepared = any(folder.glob("*/dataset_info.json")) or any(folder.glob("*/*/dataset_info.json"))
    if prepared or internet_reachable():
        return ""
    return (
        f"{source}: not prepared in {data_dir} (TFDS_DATA_DIR) and this machine cannot reach the internet "
        f"({INTERNET_PROBE[0]}:{INTERNET_PROBE[1]}), so preparation could not download it: prepare it where "
        f"there is a network and copy {folder} here, or use folder:PATH or synthetic"
    )


def _registry_dir_problem(folder: str, model_display_name: str) -> str:
    """The registry folder is written only by the last step (upload-model): check now that it is
    a folder this run can write (or create), and the model's folder in it if there is one (a
    registry shared with the user who made it), not after the whole run."""
    from components import registry

    if not folder.strip():
        return "is empty: give the folder of the local registry (default local_runs/registry)"
    registry_dir = Path(folder)
    if registry_dir.is_symlink():  # local.registry opens it without following a link
        return (
            f"{registry_dir} is a symbolic link (to {os.readlink(registry_dir)}); the registry follows no "
            f"link: give --registry_dir the folder itself ({os.path.realpath(registry_dir)})"
        )
    if registry_dir.exists() and not registry_dir.is_dir():
        return f"{registry_dir} exists and is not a folder"
    existing = registry_dir
    while not existing.exists():  # a folder to create: its nearest existing parent must be writable
        existing = existing.absolute().parent
    if not existing.is_dir():
        return f"{registry_dir} cannot be created: {existing} is not a folder"
    if why := _unwritable(existing):
        what = "is not writable" if existing == registry_dir else f"cannot be created in {existing}"
        return f"{registry_dir} {what} ({why}): give --registry_dir a folder you can write"
    try:
        model_dir = registry_dir / registry.registry_folder(model_display_name)
    except ValueError:  # a bad name: named by registry_problems
        return ""
    if model_dir.is_dir() and not model_dir.is_symlink() and (why := _unwritable(model_dir)):
        return (
            f"{model_dir}, the model's folder, is not writable ({why}): a shared registry needs it "
            "writable by each user who registers; ask its owner, or give --registry_dir a registry of your own"
        )
    return ""


def _unwritable(folder: Path) -> str:
    """Why this run cannot create a file in `folder` ("": it can), found by creating one."""
    import tempfile

    try:
        handle, probe = tempfile.mkstemp(prefix=".write-check-", dir=folder)
        os.close(handle)
        os.remove(probe)
    except OSError as err:
        return str(err.strerror or err)
    return ""
