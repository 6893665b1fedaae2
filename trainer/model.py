"""The classifier: a backbone (transfer learning) and a small head, fed uint8 images.

The model's input is uint8 pixels: the cast and the backbone's own preprocessing run inside the
model, on the device, so the input pipeline moves 4x fewer bytes and serving cannot disagree
with training about preprocessing.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from typing import Any

from trainer import backbones, storage
from trainer._tf import keras, tf
from trainer.config import AUGMENT_POLICIES, TrainConfig

CAFFE_MEAN_BGR = (103.939, 116.779, 123.68)


@keras.utils.register_keras_serializable(package="trainer")
class Preprocess(keras.layers.Layer):
    """uint8 RGB pixels to what a backbone expects (`trainer.backbones.PREPROCESSING_MODES`), in
    the layer's compute dtype."""

    MODES = backbones.PREPROCESSING_MODES

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


@keras.utils.register_keras_serializable(package="trainer")
class RandomRot90(keras.layers.Layer):
    """Rotates each (square) image by a random multiple of 90 degrees, in training only: exact
    rotations, no interpolation and no corners to fill, unlike `RandomRotation`."""

    def __init__(self, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seed = seed

    def call(self, inputs: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        if not training:
            return inputs
        k = tf.random.uniform((tf.shape(inputs)[0],), 0, 4, dtype=tf.int32, seed=self.seed)
        out = inputs
        for i in (1, 2, 3):
            out = tf.where(tf.reshape(k == i, (-1, 1, 1, 1)), tf.image.rot90(inputs, i), out)
        return out

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "seed": self.seed}


def augmentation(policy: str, seed: int) -> keras.Sequential | None:
    """The layers of an augmentation policy (config.AUGMENT_POLICIES), on float pixels in 0-255,
    active in training only; None for `none` and for an unresolved `auto`."""
    if policy not in AUGMENT_POLICIES:
        raise ValueError(f"augmentation policy must be one of {AUGMENT_POLICIES}, got {policy!r}")
    if policy in ("none", "auto"):
        return None
    layers: list[keras.layers.Layer] = [
        keras.layers.RandomFlip("horizontal" if policy == "flip_lr" else "horizontal_and_vertical", seed=seed)
    ]
    if policy == "leaf":
        layers += [
            RandomRot90(seed=seed + 1),
            # Zooming in by up to 25% is a random crop of 75-100% of the side, resized back.
            keras.layers.RandomZoom((-0.25, 0.0), fill_mode="reflect", seed=seed + 2),
            keras.layers.RandomBrightness(0.2, value_range=(0, 255), seed=seed + 3),
            keras.layers.RandomContrast(0.2, seed=seed + 4),
        ]
    return keras.Sequential(layers, name=f"augment_{policy}")


# The tiny backbone's blocks: (filters, 3x3 convolutions), each block ending in a 2x2 max-pool.
TINY_BLOCKS = ((16, 1), (32, 2), (64, 2), (128, 2))


def tiny_backbone(input_shape: tuple[int, int, int], seed: int) -> keras.Model:
    """A small VGG-style CNN (about 290k weights) for tests and local runs, trained from scratch,
    deep enough for classes that differ by where a shape sits (docs/training.md, "Training locally
    on an image folder")."""
    init = keras.initializers.HeNormal(seed=seed)
    inputs = keras.Input(input_shape)
    x = inputs
    for i, (filters, convolutions) in enumerate(TINY_BLOCKS):
        for j in range(convolutions):
            x = keras.layers.Conv2D(
                filters, 3, padding="same", use_bias=False, kernel_initializer=init, name=f"tiny_conv{i}_{j}"
            )(x)
            # Fast-moving statistics: a tiny run has only tens of steps per epoch.
            x = keras.layers.BatchNormalization(momentum=0.8, name=f"tiny_bn{i}_{j}")(x)
            x = keras.layers.ReLU(name=f"tiny_relu{i}_{j}")(x)
        x = keras.layers.MaxPooling2D(2, name=f"tiny_pool{i}")(x)
    return keras.Model(inputs, x, name="tiny")


def _weights_argument(weights: str, workdir: str) -> str | None:
    if weights in ("none", "imagenet"):
        return None if weights == "none" else weights
    path = storage.resolve(weights)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"--weights {weights}: no such weights file")
    if not storage.is_remote(path):
        return path
    local = os.path.join(workdir, os.path.basename(path))  # h5py reads local files only
    tf.io.gfile.copy(path, local, overwrite=True)
    return local


def application(entry: backbones.Backbone) -> Callable[..., Any]:
    """The Keras application constructor a registered backbone names (`trainer.backbones`)."""
    constructor = getattr(keras.applications, entry.application or "", None)
    if not callable(constructor):
        raise ValueError(
            f"backbone {entry.name!r}: tf_keras.applications has no {entry.application!r} "
            f"(trainer/backbones.py; tf-keras {keras.__version__})"
        )
    return constructor


def build_backbone(config: TrainConfig) -> tuple[keras.Model, str]:
    """The backbone without its top, with its weights, and its preprocessing mode."""
    entry = backbones.get(config.backbone)
    shape = (config.image_size, config.image_size, 3)
    with tempfile.TemporaryDirectory() as workdir:
        weights = _weights_argument(config.weights, workdir)
        if entry.application is None:
            backbone = tiny_backbone(shape, config.seed)
            if weights:
                backbone.load_weights(weights)
            return backbone, entry.preprocessing
        constructor = application(entry)
        try:
            backbone = constructor(include_top=False, weights=weights, input_shape=shape)
        except ValueError as e:
            raise ValueError(
                f"--weights {config.weights} does not fit --backbone {config.backbone} without its "
                f"top (a '_notop' weights file is needed): {e}"
            ) from None
    return backbone, entry.preprocessing


def set_trainable(backbone: keras.Model, fraction: float, pretrained: bool) -> int:
    """Trains the top `fraction` of the backbone's layers, BatchNorm layers of a pretrained one
    excepted (it runs in inference mode). Returns the number of layers left trainable."""
    layers = backbone.layers
    first = len(layers) - math.ceil(fraction * len(layers))
    backbone.trainable = fraction > 0
    for i, layer in enumerate(layers):
        frozen_bn = pretrained and isinstance(layer, keras.layers.BatchNormalization)
        layer.trainable = i >= first and not frozen_bn
    return sum(layer.trainable for layer in layers)


def build_model(config: TrainConfig, num_classes: int, input_size: int) -> keras.Model:
    """uint8 [B, input_size, input_size, 3] -> float32 class probabilities [B, num_classes]; images
    prepared at another size than `config.image_size` are resized inside the model."""
    backbone, mode = build_backbone(config)
    pretrained = config.weights != "none"
    set_trainable(backbone, config.fine_tune_fraction, pretrained)
    init = keras.initializers.GlorotUniform(seed=config.seed)

    inputs = keras.Input((input_size, input_size, 3), dtype="uint8", name="image")
    x = inputs
    augment = augmentation(config.augment, config.seed)
    if augment is not None:  # on 0-255 floats, before the backbone's preprocessing
        x = augment(tf.cast(x, "float32"))
    x = Preprocess(mode, name="preprocess")(x)
    if input_size != config.image_size:
        x = keras.layers.Resizing(config.image_size, config.image_size, name="resize")(x)
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


@keras.utils.register_keras_serializable(package="trainer")
class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0 to `peak` over `warmup_steps`, then cosine decay to 0 at
    `total_steps` (Goyal et al. 2017; Loshchilov & Hutter 2017). The step is the optimizer's,
    which the backup restores, so a resumed run continues the schedule where it stopped."""

    def __init__(self, peak: float, warmup_steps: int, total_steps: int) -> None:
        self.peak, self.warmup_steps, self.total_steps = float(peak), int(warmup_steps), int(total_steps)

    def __call__(self, step: Any) -> tf.Tensor:
        step = tf.cast(step, tf.float32)
        warmup = tf.cast(self.warmup_steps, tf.float32)
        decay = tf.cast(max(self.total_steps - self.warmup_steps, 1), tf.float32)
        rising = self.peak * (step + 1.0) / tf.maximum(warmup, 1.0)
        progress = tf.clip_by_value((step - warmup) / decay, 0.0, 1.0)
        falling = 0.5 * self.peak * (1.0 + tf.cos(math.pi * progress))
        return tf.where(step < warmup, rising, falling)

    def get_config(self) -> dict[str, Any]:
        return {"peak": self.peak, "warmup_steps": self.warmup_steps, "total_steps": self.total_steps}


def learning_rate(config: TrainConfig, global_batch: int, steps_per_epoch: int) -> Any:
    """The optimizer's learning rate: a constant, or `WarmupCosine` over the whole run, peaking at
    `learning_rate` scaled to the global batch from `lr_reference_batch_size` (0: the per-replica
    batch size), the linear scaling rule."""
    reference = config.lr_reference_batch_size or config.per_replica_batch_size
    peak = config.learning_rate * global_batch / reference
    if config.lr_schedule == "constant":
        return peak
    total = max(config.epochs * steps_per_epoch, 1)
    warmup = min(round(config.warmup_epochs * steps_per_epoch), total // 2)
    return WarmupCosine(peak, warmup, total)


def balanced_class_weights(class_counts: Any) -> list[float]:
    """n / (k * n_c) per class (scikit-learn's "balanced"): every class weighs the same in the
    loss in total. A class without training images gets weight 0."""
    counts = [int(c) for c in class_counts]
    total, k = sum(counts), len(counts)
    return [total / (k * c) if c else 0.0 for c in counts]


def make_loss(num_classes: int, label_smoothing: float = 0.0, class_weights: Any = None) -> Any:
    """Sparse cross-entropy on probabilities, with label smoothing and per-class weights (which
    tf-keras's SparseCategoricalCrossentropy does not take)."""
    weights = None if class_weights is None else tf.constant(list(class_weights), tf.float32)

    def loss(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
        labels = tf.cast(tf.reshape(y_true, (-1,)), tf.int32)
        one_hot = tf.one_hot(labels, num_classes, dtype=tf.float32)
        per_example = keras.losses.categorical_crossentropy(
            one_hot, tf.cast(y_pred, tf.float32), label_smoothing=label_smoothing
        )
        if weights is not None:
            per_example = per_example * tf.gather(weights, labels)
        return per_example

    loss.__name__ = "sparse_categorical_crossentropy"
    return loss


def compile_model(
    model: keras.Model,
    config: TrainConfig,
    global_batch: int | None = None,
    steps_per_epoch: int = 1,
    class_counts: Any = None,
) -> None:
    """Adam with `learning_rate(...)`, the loss of `make_loss`, accuracy. `class_counts` (the
    training split's images per class) is needed for `class_weights=balanced`."""
    if config.class_weights == "balanced" and class_counts is None:
        raise ValueError("class_weights=balanced needs the training split's class counts")
    weights = balanced_class_weights(class_counts) if config.class_weights == "balanced" else None
    model.compile(
        optimizer=keras.optimizers.Adam(
            learning_rate(config, global_batch or config.per_replica_batch_size, steps_per_epoch)
        ),
        loss=make_loss(int(model.output_shape[-1]), config.label_smoothing, weights),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        jit_compile=config.xla,
    )
