"""The SavedModel the chief publishes: `serving_default` takes encoded image bytes.

Vertex AI's prebuilt TensorFlow prediction containers pass `{"image_bytes": {"b64": ...}}`
instances as the decoded bytes of an input whose name ends in `_bytes`. The signature decodes
JPEG/PNG, resizes exactly as `trainer.prepare` did, and returns the class probabilities, the
index and the name of the most likely class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainer import images
from trainer._tf import keras, tf

SERVING_INPUT = "image_bytes"


def serving_function(model: keras.Model, class_names: Sequence[str], image_size: int) -> Any:
    names = tf.constant(list(class_names))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=SERVING_INPUT)])
    def serve(image_bytes: tf.Tensor) -> dict[str, tf.Tensor]:
        pixels = tf.map_fn(
            lambda b: images.resize(images.decode(b), image_size),
            image_bytes,
            fn_output_signature=tf.TensorSpec([image_size, image_size, 3], tf.uint8),
        )
        probabilities = model(pixels, training=False)
        index = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
        return {
            "probabilities": probabilities,
            "class_index": index,
            "class_name": tf.gather(names, index),
        }

    return serve


def save(model: keras.Model, path: str, class_names: Sequence[str], image_size: int) -> None:
    """Writes the Keras SavedModel with the serving signature. Every worker must call this
    (saving runs collectives: docs/facts.md, fact 3); only the chief's `path` is kept."""
    serve = serving_function(model, class_names, image_size)
    model.save(path, save_format="tf", include_optimizer=False, signatures={"serving_default": serve})
