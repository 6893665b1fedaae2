"""Checks that a published model serves: `python -m trainer.serve --model_dir DIR [--image FILE]`.

Calls `serving_default` as Vertex's prebuilt TensorFlow container does (encoded image bytes in
`image_bytes`) and prints one JSON line per image; without `--image`, one synthetic leaf per
class. Exit status 1 when the model does not load or answer, with the reason.

TensorFlow and numpy only, no tf_keras: Vertex's prebuilt container is TensorFlow Serving (2.15
at most), which loads the graph alone; the check runs under that TensorFlow and the custom
serving image's too (`local.servingenv.python_for(version)`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainer import storage

# The signature's one input (docs/facts.md, fact 23); trainer.export builds the signature with it.
SERVING_INPUT = "image_bytes"
SIGNATURE = "serving_default"
# The most images one call of the signature takes (trainer.export refuses more, in the graph): a
# call's images are decoded and run together (ResNet50 at 224 px on CPU: 64 images raised the peak
# by 590 MiB over one). Vertex bounds only the body's size (1.5 MB on a shared public endpoint, 10
# MB on a dedicated one).
MAX_INSTANCES = 64
OUTPUTS = ("probabilities", "class_index", "class_name")


class ServingError(Exception):
    """The model does not load as a serving model, or does not answer."""


@dataclass(frozen=True)
class Served:
    """A loaded `serving_default`. The loaded SavedModel is kept with it: it owns the variables
    the signature reads, which go when it is garbage-collected."""

    signature: Any
    saved_model: Any
    model_dir: str


def import_tf() -> Any:
    """TensorFlow itself (quiet, and with the trainer's choice of Keras should anything ask)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    return tf


def load(model_dir: str) -> Served:
    """The SavedModel's `serving_default`, checked to take `image_bytes` and give OUTPUTS."""
    tf = import_tf()
    try:
        loaded = tf.saved_model.load(storage.resolve(model_dir))
    except (OSError, ValueError, tf.errors.OpError) as err:
        raise ServingError(f"{model_dir} does not load as a serving model: {err}") from None
    signatures = dict(loaded.signatures)
    if SIGNATURE not in signatures:
        raise ServingError(
            f"{model_dir} has no {SIGNATURE!r} signature (it has: {', '.join(signatures) or 'none'})"
        )
    serve = signatures[SIGNATURE]
    inputs = serve.structured_input_signature[1]
    if set(inputs) != {SERVING_INPUT} or inputs[SERVING_INPUT].dtype != tf.string:
        found = ", ".join(f"{name}: {spec.dtype.name}" for name, spec in inputs.items()) or "none"
        raise ServingError(
            f"{model_dir}: {SIGNATURE} must take one string input {SERVING_INPUT!r}; it takes {found}"
        )
    missing = [name for name in OUTPUTS if name not in serve.structured_outputs]
    if missing:
        raise ServingError(f"{model_dir}: {SIGNATURE} does not return {', '.join(missing)}")
    return Served(serve, loaded, model_dir)


def answer(served: Served, blobs: Sequence[bytes]) -> list[dict[str, Any]]:
    """One call of the signature on a batch of encoded images: one prediction per image."""
    tf = import_tf()
    try:
        out = served.signature(**{SERVING_INPUT: tf.constant(list(blobs), dtype=tf.string)})
        probabilities, indices, names = (out[name].numpy() for name in OUTPUTS)
    except (tf.errors.OpError, ValueError, TypeError) as err:
        raise ServingError(f"{served.model_dir}: {SIGNATURE} failed to answer: {err}") from None
    return [
        {"class_name": name.decode(), "class_index": int(index), "probabilities": [float(p) for p in ps]}
        for name, index, ps in zip(names, indices, probabilities, strict=True)
    ]


def synthetic_images(size: int = 96) -> tuple[list[str], list[bytes]]:
    """One synthetic leaf per class, as JPEG: (names, encoded images). Always the same images."""
    import numpy as np

    # trainer.synthetic's images are numpy-made; the module must not import tf_keras at the top.
    from trainer import synthetic

    tf = import_tf()
    rng = np.random.default_rng(0)
    names = [f"synthetic:{c}" for c in synthetic.CASSAVA_CLASSES]
    blobs = [tf.io.encode_jpeg(synthetic.make_image(rng, c, size)).numpy() for c in synthetic.CASSAVA_CLASSES]
    return names, blobs


def read_images(paths: Sequence[str]) -> tuple[list[str], list[bytes]]:
    tf = import_tf()
    blobs = []
    for path in paths:
        try:
            with tf.io.gfile.GFile(storage.resolve(path), "rb") as f:
                blobs.append(f.read())
        except (OSError, tf.errors.OpError) as err:
            raise ServingError(f"cannot read the image {path}: {err}") from None
    return list(paths), blobs


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--model_dir", required=True, help="The SavedModel folder (local, gs:// or /gcs/).")
    p.add_argument("--image", action="append", default=[], help="An image file (JPEG/PNG); repeatable.")
    args = p.parse_args(argv)

    try:
        served = load(args.model_dir)
        names, blobs = read_images(args.image) if args.image else synthetic_images()
        predictions = answer(served, blobs)
    except ServingError as err:
        print(err, file=sys.stderr)
        return 1
    for name, prediction in zip(names, predictions, strict=True):
        probabilities = [round(v, 6) for v in prediction["probabilities"]]
        print(json.dumps({"image": name, **prediction, "probabilities": probabilities}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
