"""Dataset preparation: `python -m trainer.prepare --source SOURCE --output_dir DIR --image_size N`.

Sources (trainer/preparation/sources.py): `tfds:NAME` (default `tfds:cassava`), `folder:PATH`
(PATH/<split>/<class>/<image>, local or gs://) or `synthetic`. Output: images resized once to
N x N in TFRecord shards per split, and `metadata.json`
(docs/contracts.md#a-prepared-dataset-python--m-trainerprepare-output); a split the source lacks
is carved deterministically from train. It is staged and published only when complete.

Progress: tqdm bars on a terminal, else plain `prepare: ...` lines. SIGTERM unwinds the command
like Ctrl-C: nothing is published, no staging folder is left, and it exits with status 143.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from trainer.config import ENCODINGS, MAX_IMAGE_SIZE, MIN_IMAGE_SIZE, float_in, int_in, parse_bool
from trainer.preparation.prepareconfig import PrepareConfig, work_dir
from trainer.preparation.progress import Progress
from trainer.preparation.source import PrepareError
from trainer.preparation.sources import open_source


def _source(text: str) -> str:
    if text == "synthetic":
        return text
    kind, sep, rest = text.partition(":")
    if sep and kind in ("tfds", "folder") and rest.strip():
        return text
    raise argparse.ArgumentTypeError(
        f"must be tfds:NAME (e.g. tfds:cassava), folder:PATH or synthetic, got {text!r}"
    )


def _class_names(text: str) -> tuple[str, ...]:
    with contextlib.suppress(ValueError):
        if isinstance(names := json.loads(text), list) and all(isinstance(n, str) and n for n in names):
            return tuple(names)
    raise argparse.ArgumentTypeError(f"must be a JSON list of class names, got {text!r}")


def champion_mismatch(class_names: Sequence[str], champion_class_names: Sequence[str]) -> str:
    """Why a dataset of `class_names` is not the champion's task; "" when it is (no champion, or
    the same names in the same order): `components.registry.task_mismatch`'s rule."""
    new, old = list(class_names), list(champion_class_names)
    if not old or new == old:
        return ""
    how = "the same class names in another order" if sorted(new) == sorted(old) else "other class names"
    return (
        f"the source has the classes {new} but the champion was trained on {old} ({how}): a model may "
        "only replace a champion of the same task. To train for a different task, use another "
        "model_display_name; to retrain this one, use a source with the champion's classes"
    )


def build_parser(
    parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser,
) -> argparse.ArgumentParser:
    p = parser_class(
        prog="python -m trainer.prepare",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    d = PrepareConfig(source="", output_dir="")
    p.add_argument(
        "--source", type=_source, default="tfds:cassava", help="tfds:NAME, folder:PATH or synthetic"
    )
    p.add_argument(
        "--output_dir",
        default=None,
        help="Where to publish the prepared dataset (local, gs:// or /gcs/). Default: $AIP_MODEL_DIR, "
        "the output folder Vertex gives a custom job.",
    )
    p.add_argument("--image_size", type=int_in(MIN_IMAGE_SIZE, MAX_IMAGE_SIZE), default=d.image_size)
    p.add_argument("--encoding", choices=ENCODINGS, default=d.encoding)
    p.add_argument("--shards", type=int_in(1, 4096), default=d.shards)
    for split in ("validation", "test"):
        p.add_argument(
            f"--{split}_fraction",
            type=float_in(0, 0.5, low_open=True, high_open=True),
            default=getattr(d, f"{split}_fraction"),
            help=f"Share of train carved into the {split} split when the source has none.",
        )
    p.add_argument("--seed", type=int_in(0, 2**31 - 1), default=d.seed)
    p.add_argument("--tfds_data_dir", default=None, help="TFDS data folder. Default: TFDS's own.")
    p.add_argument(
        "--synthetic_per_class",
        type=int_in(3, 100_000),
        default=d.synthetic_per_class,
        help="--source synthetic: images per class.",
    )
    p.add_argument("--synthetic_source_size", type=int_in(32, 2048), default=d.synthetic_source_size)
    p.add_argument(
        "--overwrite",
        nargs="?",
        const=True,
        default=False,
        type=parse_bool,
        help="Replace a dataset already in --output_dir (also --overwrite=true|false: a Dataflow Flex "
        "Template passes every parameter with a value).",
    )
    p.add_argument(
        "--champion_class_names",
        type=_class_names,
        default=None,
        help="The champion's class names as a JSON list: a source of other classes, or of the same "
        "in another order, is refused before any conversion. Default: none (no champion).",
    )
    p.add_argument(
        "--engine",
        choices=("job", "beam"),
        default=d.engine,
        help="job: this process converts every image; beam: an Apache Beam pipeline (the "
        "DirectRunner's worker processes here; Dataflow with --runner DataflowRunner and Beam's "
        "Dataflow options, which any flag this command does not know is taken as). Both write the "
        "same bytes; beam resumes a killed run.",
    )
    p.add_argument(
        "--beam_workers",
        type=int_in(0, 256),
        default=d.beam_workers,
        help="--engine beam on the DirectRunner: worker processes (0: one per CPU).",
    )
    return p


def unknown_beam_options(args: Sequence[str]) -> list[str]:
    """Those of `args` that no Apache Beam pipeline option takes (Beam only logs them: a mistyped
    flag would be ignored); [] without Beam installed. Beam's own parser, built as
    `PipelineOptions.get_all_options` builds it (apache_beam/options/pipeline_options.py)."""
    import importlib.util

    if importlib.util.find_spec("apache_beam") is None:
        return []
    from apache_beam.options import pipeline_options as po

    parser = po._BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in po.PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)
    return list(parser.parse_known_args(list(args))[1])


def parse_args(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser,
) -> PrepareConfig:
    parser = build_parser(parser_class)
    ns, rest = parser.parse_known_args(argv)
    if rest and ns.engine != "beam":
        parser.error(
            f"unrecognized arguments: {' '.join(rest)} (only --engine beam takes Beam's own options)"
        )
    if rest and (unknown := unknown_beam_options(rest)):
        parser.error(
            f"unrecognized arguments: {' '.join(unknown)} (neither this command's flags nor Apache "
            "Beam's pipeline options)"
        )
    ns.beam_args = tuple(rest)
    ns.output_dir = ns.output_dir or (os.environ if environ is None else environ).get(
        "AIP_MODEL_DIR", ""
    ).rstrip("/")
    if not ns.output_dir:
        parser.error("--output_dir is required when AIP_MODEL_DIR is not set")
    ns.champion_class_names = ns.champion_class_names or ()
    return PrepareConfig(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(PrepareConfig)})


# --- stopping on SIGTERM ----------------------------------------------------------------------

# As local/jobs.py's `TERMINATED` and trainer.callbacks.TERMINATED_EXIT_CODE (not imported: it loads TensorFlow).
TERMINATED_EXIT_CODE = 128 + signal.SIGTERM


class Terminated(BaseException):
    """SIGTERM reached `main`, raised so that every `finally` and `with` on the way out runs; a
    BaseException, like KeyboardInterrupt, so that no `except Exception` swallows it."""


_STOP = threading.Event()


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Inside the block, SIGTERM raises Terminated in the main thread, and again at every image's
    progress update (`stop_if_asked`): Python drops an exception a handler raises inside a
    `__del__`, a weakref callback or C code. A second SIGTERM does nothing, so the clean-up is not
    cut short; once stopping, other threads' exceptions are not printed (Beam's die with its workers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        if not _STOP.is_set():
            _STOP.set()
            raise Terminated(f"signal {signum} (SIGTERM)")

    def quiet_once_stopping(args: Any) -> None:
        if not _STOP.is_set():
            hook(args)

    _STOP.clear()
    previous, hook = signal.signal(signal.SIGTERM, on_sigterm), threading.excepthook
    threading.excepthook = quiet_once_stopping
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        threading.excepthook = hook
        _STOP.clear()


def stop_if_asked() -> None:
    """Raises Terminated once SIGTERM has come (`sigterm_unwinds`)."""
    if _STOP.is_set():
        raise Terminated("SIGTERM (seen at the next image)")


def prepare(config: PrepareConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Prepares `config.source` into `config.output_dir`; returns the metadata written."""
    from trainer import storage
    from trainer._tf import tf
    from trainer.preparation.shards import write_dataset

    progress = progress or Progress.auto()
    progress.stop = stop_if_asked  # every image's update: the work loop's stop point

    if config.engine == "beam":
        from trainer.preparation import beamrun

        beamrun.check_before_output(config)
    output = storage.resolve(config.output_dir)
    exists = tf.io.gfile.exists(output) if storage.is_remote(output) else os.path.lexists(output)
    if not config.overwrite and exists and not tf.io.gfile.isdir(output):
        raise PrepareError(
            f"--output_dir {config.output_dir} is an existing file, not a folder; pass --overwrite "
            "to replace it, or name a folder"
        )
    if not config.overwrite and exists and tf.io.gfile.listdir(output):
        raise PrepareError(
            f"--output_dir {config.output_dir} already exists and is not empty; pass --overwrite "
            "to replace it"
        )
    kind, _, where = config.source.partition(":")
    for flag, given in (
        ("--source", where if kind == "folder" else ""),
        ("--tfds_data_dir", config.tfds_data_dir),
    ):
        if given and storage.holds(config.output_dir, given):  # publishing replaces the output folder whole
            raise PrepareError(
                f"--output_dir {config.output_dir} is {flag} {given} or holds it: the prepared dataset "
                "replaces that folder as a whole, and the source with it; name an output folder outside it"
            )
    if config.engine == "beam":
        beamrun.check_work_dir(work_dir(config.output_dir))  # before anything is listed or removed
    started = time.monotonic()
    with open_source(config, progress) as source:
        if mismatch := champion_mismatch(source.class_names, config.champion_class_names):
            raise PrepareError(mismatch)
        if config.engine == "beam":
            return beamrun.prepare_beam(config, source, progress, started)
        with storage.staged_output(config.output_dir) as staging:
            return write_dataset(source, config, staging, progress)


def main(argv: Sequence[str] | None = None) -> int:
    """The command: 0 prepared, 1 bad input (one line per problem), 2 bad flags, 143 stopped on
    SIGTERM and 130 on Ctrl-C (nothing published, no staging folder left either way)."""
    config = None
    with sigterm_unwinds():
        try:
            config = parse_args(argv)
            metadata = prepare(config)
        except (PrepareError, FileExistsError) as e:
            print(f"python -m trainer.prepare: error: {e}", file=sys.stderr)
            return 1
        except (Terminated, KeyboardInterrupt) as e:
            how = "stopped on SIGTERM" if isinstance(e, Terminated) else "interrupted"
            code = TERMINATED_EXIT_CODE if isinstance(e, Terminated) else 128 + signal.SIGINT
            left = "no staging folder is left"
            if config is not None and config.engine == "beam":
                left = f"the shards written so far are kept in {work_dir(config.output_dir)} for the next run"
            print(
                f"python -m trainer.prepare: {how}: nothing was published and {left}; "
                f"exiting with status {code}",
                file=sys.stderr,
                flush=True,
            )
            return code
    if not metadata:  # a Flex Template's launcher: the Dataflow job publishes when done
        return 0
    counts = ", ".join(f"{s} {v['count']}" for s, v in metadata["splits"].items())
    skipped = metadata["source_info"].get("skipped", {}).get("count", 0)
    note = f"; {skipped} source entries skipped (listed above, and in source_info.skipped)" if skipped else ""
    assert config is not None
    print(
        f"prepared {config.source} into {config.output_dir}: {counts} ({metadata['fingerprint'][:19]}){note}"
    )
    return 0


if __name__ == "__main__":
    code = main()
    if code in (TERMINATED_EXIT_CODE, 128 + signal.SIGINT):
        # Cleaned up: exit without waiting for threads that wait on what is gone (the Beam engine's
        # worker handlers: a driver of 64 workers slept 14 minutes there).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
