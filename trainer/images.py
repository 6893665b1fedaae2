"""Image decoding and resizing shared by dataset preparation and the serving signature,
so a served image goes through exactly the transformation the training images went through."""

from __future__ import annotations

from trainer._tf import tf
from trainer.config import ENCODINGS


def decode(encoded: tf.Tensor) -> tf.Tensor:
    """Encoded JPEG/PNG/GIF/BMP bytes to a uint8 [H, W, 3] tensor."""
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    return image


def rgb(image: tf.Tensor) -> tf.Tensor:
    """A uint8 [H, W, 1 to 4] image (a TFDS feature's) as [H, W, 3], as `decode` gives an image
    file: grey repeated in each channel, alpha dropped."""
    channels = image.shape[-1]
    return tf.image.grayscale_to_rgb(image[..., :1]) if channels in (1, 2) else image[..., :3]


def resize(image: tf.Tensor, size: int) -> tf.Tensor:
    """Any uint8 [H, W, 3] image to uint8 [size, size, 3] (area-aware, rounded)."""
    resized = tf.image.resize(image, (size, size), method="bilinear", antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)


def encode(image: tf.Tensor, encoding: str) -> tf.Tensor:
    """A uint8 [H, W, 3] image to the bytes stored in a prepared TFRecord."""
    if encoding == "raw":
        return tf.io.serialize_tensor(image)
    if encoding == "jpeg":
        return tf.io.encode_jpeg(image, quality=95)
    if encoding == "png":
        return tf.io.encode_png(image)
    raise ValueError(f"unknown encoding {encoding!r}; allowed: {', '.join(ENCODINGS)}")


def decode_stored(data: tf.Tensor, encoding: str, size: int) -> tf.Tensor:
    """The inverse of `encode` for an image of known size."""
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown encoding {encoding!r}; allowed: {', '.join(ENCODINGS)}")
    image = tf.io.parse_tensor(data, tf.uint8) if encoding == "raw" else decode(data)
    return tf.ensure_shape(image, [size, size, 3])
