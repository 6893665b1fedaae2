"""Checks that a published model serves: `python -m trainer.serve --model_dir DIR [--image FILE]`.

Loads the SavedModel, calls its `serving_default` signature the way Vertex's prebuilt TensorFlow
container does (encoded image bytes in `image_bytes`) and prints one JSON line per image:
{"image", "class_name", "class_index", "probabilities"}. Without `--image` it classifies one
synthetic leaf per class (so the check needs no data). Exit status 1 when the model does not
load or answer, with the reason.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--model_dir", required=True, help="The SavedModel folder (local, gs:// or /gcs/).")
    p.add_argument("--image", action="append", default=[], help="An image file (JPEG/PNG); repeatable.")
    args = p.parse_args(argv)

    import numpy as np

    from trainer import storage, synthetic
    from trainer._tf import tf
    from trainer.export import SERVING_INPUT

    try:
        serve = tf.saved_model.load(storage.resolve(args.model_dir)).signatures["serving_default"]
    except (OSError, KeyError, ValueError, tf.errors.OpError) as err:
        print(f"{args.model_dir} does not load as a serving model: {err}", file=sys.stderr)
        return 1
    if args.image:
        names = list(args.image)
        blobs = [tf.io.read_file(path) for path in names]
    else:
        rng = np.random.default_rng(0)
        names = [f"synthetic:{c}" for c in synthetic.CASSAVA_CLASSES]
        blobs = [tf.io.encode_jpeg(synthetic.make_image(rng, c, 96)) for c in synthetic.CASSAVA_CLASSES]
    try:
        out = serve(**{SERVING_INPUT: tf.stack(blobs)})
    except (tf.errors.OpError, ValueError, TypeError) as err:
        print(f"{args.model_dir} failed to answer serving_default: {err}", file=sys.stderr)
        return 1
    for i, name in enumerate(names):
        row = {
            "image": name,
            "class_name": out["class_name"][i].numpy().decode(),
            "class_index": int(out["class_index"][i]),
            "probabilities": [round(float(v), 6) for v in out["probabilities"][i]],
        }
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
