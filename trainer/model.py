"""The classifier: a backbone (transfer learning) and a small head, fed uint8 images.

The model's input is uint8 pixels: the cast and the backbone's own preprocessing run inside the
model, on the device, so the input pipeline moves 4x fewer bytes and serving cannot disagree
with training about preprocessing.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from typing import Any

from trainer import storage
from trainer._tf import keras, tf
from trainer.config import TrainConfig

# Backbone -> (constructor, preprocessing mode of its ImageNet weights).
APPLICATIONS: dict[str, tuple[Callable[..., Any], str]] = {
    "resnet50": (keras.applications.ResNet50, "caffe"),
    "resnet101": (keras.applications.ResNet101, "caffe"),
    "efficientnet_b0": (keras.applications.EfficientNetB0, "raw"),  # rescales internally
    "mobilenet_v2": (keras.applications.MobileNetV2, "tf"),
}
CAFFE_MEAN_BGR = (103.939, 116.779, 123.68)


@keras.utils.register_keras_serializable(package="trainer")
class Preprocess(keras.layers.Layer):
    """uint8 RGB pixels to what a backbone expects, in the layer's compute dtype.

    Modes: `caffe` (BGR, ImageNet mean subtracted: ResNet), `tf` (scaled to [-1, 1]:
    MobileNet), `unit` (scaled to [0, 1]), `raw` (0-255 floats: EfficientNet).
    """

    MODES = ("caffe", "tf", "unit", "raw")

    def __init__(self, mode: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if mode not in self.MODES:
            raise ValueError(f"unknown preprocessing mode {mode!r}; allowed: {self.MODES}")
        self.mode = mode

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        x = tf.cast(inputs, self.compute_dtype)
        if self.mode == "caffe":
            return x[..., ::-1] - tf.constant(CAFFE_MEAN_BGR, dtype=self.compute_dtype)
        if self.mode == "tf":
            return x / 127.5 - 1.0
        if self.mode == "unit":
            return x / 255.0
        return x

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "mode": self.mode}


def tiny_backbone(input_shape: tuple[int, int, int], seed: int) -> keras.Model:
    """A small CNN (about 30k weights) for tests and fast local runs."""
    init = keras.initializers.HeNormal(seed=seed)
    inputs = keras.Input(input_shape)
    x = inputs
    for i, filters in enumerate((16, 32, 64)):
        x = keras.layers.Conv2D(
            filters, 3, padding="same", use_bias=False, kernel_initializer=init, name=f"tiny_conv{i}"
        )(x)
        # Fast-moving statistics: a tiny run has only tens of steps.
        x = keras.layers.BatchNormalization(momentum=0.8, name=f"tiny_bn{i}")(x)
        x = keras.layers.ReLU(name=f"tiny_relu{i}")(x)
        x = keras.layers.MaxPooling2D(2, name=f"tiny_pool{i}")(x)
    return keras.Model(inputs, x, name="tiny")


def _weights_argument(weights: str, workdir: str) -> str | None:
    if weights == "none":
        return None
    if weights == "imagenet":
        return "imagenet"
    if not tf.io.gfile.exists(storage.resolve(weights)):
        raise FileNotFoundError(f"--weights {weights}: no such weights file")
    return storage.local_copy(weights, workdir)  # h5py reads local files only


def build_backbone(config: TrainConfig) -> tuple[keras.Model, str]:
    """The backbone without its top, with its weights, and its preprocessing mode."""
    shape = (config.image_size, config.image_size, 3)
    with tempfile.TemporaryDirectory() as workdir:
        weights = _weights_argument(config.weights, workdir)
        if config.backbone == "tiny":
            backbone = tiny_backbone(shape, config.seed)
            if weights:
                backbone.load_weights(weights)
            return backbone, "unit"
        constructor, mode = APPLICATIONS[config.backbone]
        try:
            backbone = constructor(include_top=False, weights=weights, input_shape=shape)
        except ValueError as e:
            raise ValueError(
                f"--weights {config.weights} does not fit --backbone {config.backbone} without its "
                f"top (a '_notop' weights file is needed): {e}"
            ) from None
    return backbone, mode


def set_trainable(backbone: keras.Model, fraction: float, pretrained: bool) -> int:
    """Trains the top `fraction` of the backbone's layers. In a pretrained backbone the
    BatchNorm layers stay frozen (their statistics are ImageNet's; the backbone runs in
    inference mode). Returns the number of layers left trainable."""
    layers = backbone.layers
    first = len(layers) - math.ceil(fraction * len(layers))
    backbone.trainable = fraction > 0
    count = 0
    for i, layer in enumerate(layers):
        frozen_bn = pretrained and isinstance(layer, keras.layers.BatchNormalization)
        layer.trainable = i >= first and not frozen_bn
        count += int(layer.trainable)
    return count


def build_model(config: TrainConfig, num_classes: int, input_size: int) -> keras.Model:
    """uint8 [B, input_size, input_size, 3] -> float32 class probabilities [B, num_classes].

    Images prepared at another size than `config.image_size` are resized inside the model.
    """
    backbone, mode = build_backbone(config)
    pretrained = config.weights != "none"
    set_trainable(backbone, config.fine_tune_fraction, pretrained)
    init = keras.initializers.GlorotUniform(seed=config.seed)

    inputs = keras.Input((input_size, input_size, 3), dtype="uint8", name="image")
    x = Preprocess(mode, name="preprocess")(inputs)
    if input_size != config.image_size:
        x = keras.layers.Resizing(config.image_size, config.image_size, name="resize")(x)
    if config.augment:
        x = keras.layers.RandomFlip("horizontal_and_vertical", seed=config.seed, name="augment")(x)
    # A pretrained backbone always runs in inference mode (frozen BatchNorm statistics).
    x = backbone(x, training=False) if pretrained else backbone(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    if config.dense_units:
        x = keras.layers.Dense(config.dense_units, activation="relu", kernel_initializer=init, name="dense")(
            x
        )
    if config.dropout:
        x = keras.layers.Dropout(config.dropout, seed=config.seed, name="dropout")(x)
    x = keras.layers.Dense(num_classes, kernel_initializer=init, name="logits")(x)
    # Under mixed precision the softmax runs, and the output stays, in float32.
    outputs = keras.layers.Activation("softmax", dtype="float32", name="probabilities")(x)
    return keras.Model(inputs, outputs, name=f"{config.backbone}_classifier")


def compile_model(model: keras.Model, config: TrainConfig) -> None:
    model.compile(
        optimizer=keras.optimizers.Adam(config.learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        jit_compile=config.xla,
    )
