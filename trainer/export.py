"""The SavedModel the chief publishes: `serving_default` takes encoded image bytes.

Vertex AI's prebuilt TensorFlow prediction containers pass `{"image_bytes": {"b64": ...}}`
instances as the decoded bytes of an input whose name ends in `_bytes` (docs/facts.md, fact 23).
The signature decodes JPEG/PNG, resizes exactly as `trainer.prepare` did, and returns the class
probabilities, the index and the name of the most likely class.

Its guards are in the graph, so they hold under any server: more than `serve.MAX_INSTANCES`
images, an image that is not JPEG or PNG, or one whose header declares more than
`config.MAX_IMAGE_PIXELS` pixels is refused (InvalidArgumentError, a 400) before any decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainer import images
from trainer._tf import keras, tf
from trainer.config import MAX_IMAGE_PIXELS
from trainer.serve import MAX_INSTANCES, SERVING_INPUT

_JPEG, _PNG = b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n"


def header_pixels(encoded: tf.Tensor) -> tf.Tensor:
    """The pixels a JPEG's frame header (`extract_jpeg_shape`, which decodes nothing) or a PNG's
    IHDR chunk declares, as int64; -1 for anything else."""

    def png() -> tf.Tensor:  # IHDR's width and height: 4 big-endian bytes each
        ihdr = tf.cast(tf.io.decode_raw(tf.strings.substr(encoded, 16, 8), tf.uint8), tf.int64)
        return tf.reduce_prod(tf.reduce_sum(tf.reshape(ihdr, (2, 4)) * [1 << 24, 1 << 16, 1 << 8, 1], axis=1))

    def jpeg() -> tf.Tensor:
        shape = tf.io.extract_jpeg_shape(encoded, output_type=tf.int64)
        return shape[0] * shape[1]

    is_png = tf.logical_and(
        tf.equal(tf.strings.substr(encoded, 0, 8), _PNG), tf.strings.length(encoded) >= 24
    )
    is_jpeg = tf.equal(tf.strings.substr(encoded, 0, 3), _JPEG)
    return tf.cond(is_png, png, lambda: tf.cond(is_jpeg, jpeg, lambda: tf.constant(-1, tf.int64)))


def checked_decode(encoded: tf.Tensor) -> tf.Tensor:
    """`images.decode`, once the header says JPEG or PNG of at most MAX_IMAGE_PIXELS."""
    pixels = header_pixels(encoded)
    checks = [
        tf.debugging.Assert(pixels >= 0, ["the model serves JPEG or PNG images"]),
        tf.debugging.Assert(pixels <= MAX_IMAGE_PIXELS, ["image over", MAX_IMAGE_PIXELS, "pixels:", pixels]),
    ]
    with tf.control_dependencies(checks):
        return images.decode(tf.identity(encoded))


def serving_function(model: keras.Model, class_names: Sequence[str], image_size: int) -> Any:
    names = tf.constant(list(class_names))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=SERVING_INPUT)])
    def serve(image_bytes: tf.Tensor) -> dict[str, tf.Tensor]:
        count = tf.size(image_bytes)
        limit = tf.debugging.Assert(
            count <= MAX_INSTANCES, ["at most", MAX_INSTANCES, "images a request:", count]
        )
        with tf.control_dependencies([limit]):
            image_bytes = tf.identity(image_bytes)
        pixels = tf.map_fn(
            lambda b: images.resize(checked_decode(b), image_size),
            image_bytes,
            fn_output_signature=tf.TensorSpec([image_size, image_size, 3], tf.uint8),
        )
        probabilities = model(pixels, training=False)
        index = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
        return {"probabilities": probabilities, "class_index": index, "class_name": tf.gather(names, index)}

    return serve


def save(model: keras.Model, path: str, class_names: Sequence[str], image_size: int) -> None:
    """Writes the Keras SavedModel with the serving signature. Every worker must call this
    (saving runs collectives: docs/facts.md, fact 3); only the chief's `path` is kept."""
    serve = serving_function(model, class_names, image_size)
    # Without each layer's traced functions (tf_keras `save_model`: it "requires that all custom
    # layers/models implement a `get_config()` method"; trainer/model.py's do): 5x faster to save.
    # Vertex's prebuilt containers need the `serve` tag and the `serving_default` signature ("Export
    # model artifacts for prediction", https://cloud.google.com/vertex-ai/docs/training/exporting-model-artifacts).
    model.save(
        path,
        save_format="tf",
        include_optimizer=False,
        signatures={"serving_default": serve},
        save_traces=False,
    )
