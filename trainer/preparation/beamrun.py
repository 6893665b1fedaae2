"""`python -m trainer.prepare --engine beam`'s driver: the runner and its options (the
DirectRunner's worker processes here, Dataflow's), what is checked before any work (Beam
installed, the runner's paths, Google Cloud reachable), the plan written into the work folder,
the progress lines, and `prepare_beam`, which runs the pipeline of `trainer.preparation.beamprep` and waits
for it (that module's docstring describes the design).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from trainer import data, storage
from trainer._tf import tf
from trainer.config import SPLITS
from trainer.preparation.beamprep import (
    ERRORS,
    OWNER_FILE,
    PLAN_FILE,
    TASKS,
    build_pipeline,
    check_work_dir,
    disk_full,
    done_records,
    make_plan,
    plan_changes,
    read_problems,
)
from trainer.preparation.prepareconfig import WORK_SUFFIX, PrepareConfig, work_dir
from trainer.preparation.progress import Progress
from trainer.preparation.shards import few_images_warnings, source_identity
from trainer.preparation.source import PrepareError, Source


def _runner(args: Sequence[str]) -> str:
    """The runner `args` name; if none, DataflowRunner with a `--template_location` (a Flex
    Template's launcher: Beam then writes the job's graph for Dataflow), else the DirectRunner."""
    from apache_beam.options.pipeline_options import PipelineOptions

    found = PipelineOptions(list(args)).get_all_options()
    if found.get("runner"):
        return str(found["runner"])
    return "DataflowRunner" if found.get("template_location") else "DirectRunner"


# The local runner: Beam 2.77's "DirectRunner" (SwitchingDirectRunner, runners/direct/
# direct_runner.py) first tries Prism, a Go binary downloaded at run time that runs every step in
# one process; the FnApiRunner it falls back to downloads nothing and has the workers it is given.
LOCAL_RUNNER = "FnApiRunner"
# Memory one DirectRunner worker takes: two processes, each with TensorFlow loaded (24 workers
# reached 17 GB on a 2-CPU machine before the kernel killed them).
WORKER_BYTES = 1400 * 2**20
PROGRESS_EVERY_S = 5.0  # between the driver's progress lines


def local_workers(config: PrepareConfig) -> int:
    """The DirectRunner's worker processes: `--beam_workers` (0: one per CPU this process may use,
    fewer if memory holds fewer); PrepareError for more than the CPUs or MemAvailable hold."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    available = 0
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/meminfo") as f:
            available = int(next(line for line in f if line.startswith("MemAvailable:")).split()[1]) * 1024
    room = min(cpus, max(1, available // WORKER_BYTES) if available else cpus)
    if config.beam_workers > room:
        raise PrepareError(
            f"--beam_workers {config.beam_workers}: this machine has {cpus} CPUs and "
            f"{available / 2**30:.1f} GiB available, room for {room} workers (each "
            f"takes about {WORKER_BYTES / 2**30:.1f} GiB); give at most {room}, or 0"
        )
    return config.beam_workers or room


def pipeline_options(config: PrepareConfig) -> Any:
    """Beam's options: `config.beam_args` as given; for the DirectRunner (`_runner`), Beam's
    FnApiRunner (`LOCAL_RUNNER`) in multi-process mode with `local_workers` processes."""
    from apache_beam.options.pipeline_options import PipelineOptions

    args = list(config.beam_args)
    runner = _runner(args)
    if runner == "DirectRunner":
        # The workers' own logging off (a user's --default_sdk_harness_log_level, later, wins):
        # failures reach the driver, which says them in one line.
        args = [
            "--direct_running_mode=multi_processing",
            f"--direct_num_workers={local_workers(config)}",
            "--default_sdk_harness_log_level=CRITICAL",
            *args,
        ]
        # Last, so that it replaces a `--runner DirectRunner` among `args`.
        return PipelineOptions([*args, f"--runner={LOCAL_RUNNER}"])
    return PipelineOptions([f"--runner={runner}", *args])


def is_local_runner(config: PrepareConfig) -> bool:
    return _runner(config.beam_args) == "DirectRunner"


def check_before_output(config: PrepareConfig) -> None:
    """Refuses, before the output is looked at (on Dataflow that is a request): Beam not installed
    (the trainer and serving images lack it), more DirectRunner workers than `local_workers`, or on
    Dataflow a worker's path (output, folder source, TFDS data folder) not on gs:// or the synthetic
    source (made here), then Google Cloud unreachable or without credentials."""
    import importlib.util

    if importlib.util.find_spec("apache_beam") is None:
        raise PrepareError(
            "--engine beam needs Apache Beam, which this environment lacks: install the lock's beam "
            "group (uv sync --group beam), or use --engine job"
        )
    if is_local_runner(config):
        local_workers(config)
        return
    problems = []
    if config.source == "synthetic":
        problems.append(
            "--source synthetic is made in a temporary folder on this machine, which Dataflow's workers cannot read; use --engine job, or the DirectRunner"
        )
    kind, _, path = config.source.partition(":")
    named = {"--output_dir": config.output_dir}
    if kind == "folder":
        named["--source folder:"] = path
    if kind == "tfds":
        named["--tfds_data_dir"] = config.tfds_data_dir or ""
    for flag, value in named.items():
        if not value.startswith(("gs://", "/gcs/")):
            problems.append(
                f"{flag} {value or '(TFDS default, on this machine)'} is not on Cloud Storage: Dataflow's workers read and write gs:// paths only"
            )
    if problems:
        raise PrepareError("\n".join(problems))
    check_google_cloud()


# Tried before a remote runner starts: unchecked, TensorFlow's GCS client retried an unreachable
# or unauthorised request for about 25 s and ended in a FailedPreconditionError traceback.
GOOGLE_HOSTS = ("storage.googleapis.com", "dataflow.googleapis.com")
PROBE_SECONDS = 5.0


def check_google_cloud(seconds: float = PROBE_SECONDS) -> None:
    """Google's hosts answer a HEAD request (any HTTP answer will do) and credentials are found
    (google-auth's Application Default Credentials, what Beam's GCP IO uses); else PrepareError."""
    import concurrent.futures

    import google.auth
    import requests
    from google.auth import exceptions

    def head(host: str) -> str | None:
        try:
            requests.head(f"https://{host}/", timeout=(seconds, seconds))
            return None
        except requests.RequestException as e:
            return f"{host} ({type(e).__name__})"

    with concurrent.futures.ThreadPoolExecutor(len(GOOGLE_HOSTS)) as pool:
        failed = [f for f in pool.map(head, GOOGLE_HOSTS) if f]
    if failed:
        raise PrepareError(
            f"--runner DataflowRunner: cannot reach {', '.join(failed)} within {seconds:g} s; nothing "
            "was started. Check this machine's network, or the proxy it needs (HTTPS_PROXY); or use the DirectRunner"
        )
    try:
        google.auth.default()
    except exceptions.DefaultCredentialsError:
        raise PrepareError(
            "--runner DataflowRunner: no Google Cloud credentials were found; nothing was started. Run "
            "`gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service "
            "account key file; or use the DirectRunner"
        ) from None


def write_plan(work: str, plan: dict[str, Any], tasks: dict[str, Any], progress: Progress) -> int:
    """Writes the plan into `work`, keeping what a killed run with the same plan left; returns
    the number of shards already done (checked again by each worker before it is kept)."""
    plan_path = storage.join(work, PLAN_FILE)
    if tf.io.gfile.exists(plan_path):
        old = storage.read_json(plan_path)
        if old.get("fingerprint") == plan["fingerprint"]:
            done = len(done_records(work))
            progress.say(
                f"resuming the Beam preparation in {work}: {done} of {len(plan['shards'])} "
                "shards were written by an earlier run and are kept once checked (size and SHA-256)"
            )
            if tf.io.gfile.exists(storage.join(work, ERRORS)):
                tf.io.gfile.rmtree(storage.join(work, ERRORS))
            # The same images, perhaps from another folder (a TFDS split built anew): the shards
            # still to write read this run's.
            for name, task in tasks.items():
                storage.write_json(storage.join(work, TASKS, f"{name}.json"), task)
            return done
        changed = ", ".join(plan_changes(old, plan)) or "the plan's format"
        progress.say(
            f"cannot resume the earlier Beam preparation in {work}: its {changed} "
            "differ from this run's; starting over"
        )
    if tf.io.gfile.exists(work):
        check_work_dir(work)  # never removed through a link, nor a folder of the user's
        tf.io.gfile.rmtree(work)
    storage.write_json(storage.join(work, OWNER_FILE), {"output_dir": work.removesuffix(WORK_SUFFIX)})
    for name, task in tasks.items():
        storage.write_json(storage.join(work, TASKS, f"{name}.json"), task)
    storage.write_json(plan_path, plan)  # last: a plan.json means every task is there
    return 0


@contextlib.contextmanager
def _progress_lines(work: str, total: int, progress: Progress) -> Iterator[None]:
    """Counts the done records every PROGRESS_EVERY_S while the pipeline runs."""
    stop = threading.Event()

    def poll() -> None:
        last = -1
        while not stop.wait(PROGRESS_EVERY_S):
            with contextlib.suppress(tf.errors.OpError):
                done = len(done_records(work))
                if done > last:  # the work folder goes once published
                    progress.say(f"{done} of {total} shards written")
                    last = done

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


# The DirectRunner's workers' stderr (Beam's worker prints every failure's traceback there,
# whatever the log level): the screen gets one line, this file the details.
WORKERS_LOG = "beam-workers.log"


@contextlib.contextmanager
def _stderr_to(name_suffix: str) -> Iterator[None]:
    """File descriptor 2 (this process's and its workers') into a temporary file ending in
    `name_suffix` while the block runs: named on stderr if the block fails, else removed."""
    import tempfile

    fd, name = tempfile.mkstemp(prefix="prepare-", suffix=f"-{name_suffix}")
    saved, failed = os.dup(2), True
    try:
        sys.stderr.flush()
        os.dup2(fd, 2)
        yield
        failed = False
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
        if failed:
            sys.stderr.write(f"(the Beam workers' own output is in {name})\n")
        else:
            os.remove(name)


def prepare_beam(config: PrepareConfig, source: Source, progress: Progress, started: float) -> dict[str, Any]:
    """Runs the Beam preparation of the opened `source` and waits for it (on Dataflow too);
    returns the metadata. Under a Flex Template's launcher (`--template_location`) it only writes
    the job's graph and returns {}: the job publishes. `started`: time.monotonic() before the
    source was listed, to time what Dataflow's launch timeout bounds."""
    import logging
    import time

    import apache_beam as beam

    # Beam relays each worker's warnings with tracebacks; failures are said here in one line.
    logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
    plan, tasks = make_plan(source, config, {**source.info, **source_identity(source, config)})
    work = work_dir(config.output_dir)
    kept = write_plan(work, plan, tasks, progress)
    names = [s["name"] for s in plan["shards"]]
    options = pipeline_options(config)
    local = is_local_runner(config)
    if local:
        # The DirectRunner's worker processes import trainer/ as this process does.
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    progress.say(
        f"Beam {'DirectRunner' if local else options.get_all_options()['runner']}: {len(names)} shards "
        f"({len(names) - kept} to write) from {sum(s.count for s in source.splits.values())} images, "
        f"listed and planned in {time.monotonic() - started:.1f} s"
    )
    pipeline = beam.Pipeline(options=options)
    build_pipeline(pipeline, work, config.output_dir, names, local=local)
    if template := options.get_all_options().get("template_location"):
        pipeline.run()
        progress.say(f"wrote the Dataflow job's graph to {template}; the job publishes {config.output_dir}")
        return {}
    workers_log = _stderr_to(WORKERS_LOG) if local else contextlib.nullcontext()
    try:
        with _progress_lines(work, len(names), progress), workers_log:
            pipeline.run().wait_until_finish()
    except Exception as e:  # noqa: BLE001 - a worker's failure, reported without its traceback
        if not read_problems(work):  # else said below (a remote runner's Finalize fails the job on them)
            if "ResourceExhaustedError" in str(e) or "No space left on device" in str(e):
                raise PrepareError(disk_full(work)) from None
            raise PrepareError(
                f"the Beam preparation failed: {str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__}; "
                f"the shards written so far are kept in {work} for the next run"
            ) from None
    if problems := read_problems(work):
        raise PrepareError("\n".join(problems) + "\n(nothing was published)")
    metadata = dict(storage.read_json(storage.join(storage.resolve(config.output_dir), data.METADATA_FILE)))
    for warning in few_images_warnings({s: metadata["splits"][s]["class_counts"] for s in SPLITS}):
        progress.say(warning)  # as the job engine says them, in its order
    return metadata
