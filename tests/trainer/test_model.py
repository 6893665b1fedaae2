from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from trainer import model as model_lib
from trainer._tf import keras, tf
from trainer.config import TrainConfig

TINY = TrainConfig(
    data_dir="/d",
    model_dir="/m",
    checkpoint_dir="/c",
    tensorboard_dir="/l",
    backbone="tiny",
    weights="none",
    image_size=32,
    dense_units=16,
    fine_tune_fraction=1.0,
)


@pytest.fixture(autouse=True)
def float32_policy() -> Iterator[None]:
    yield
    keras.mixed_precision.set_global_policy("float32")


def images(n: int, size: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 255, (n, size, size, 3), dtype=np.uint8)


def test_uint8_in_float32_probabilities_out() -> None:
    model = model_lib.build_model(TINY, num_classes=5, input_size=32)
    assert model.input.dtype == tf.uint8
    probs = model(images(4, 32), training=False).numpy()
    assert probs.shape == (4, 5) and probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)


def test_mixed_precision_computes_in_half_precision_but_outputs_float32() -> None:
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = model_lib.build_model(TINY, num_classes=3, input_size=32)
    assert model.get_layer("logits").compute_dtype == "bfloat16"
    assert model(images(2, 32)).dtype == tf.float32


def test_images_prepared_at_another_size_are_resized_in_the_model() -> None:
    model = model_lib.build_model(TINY, num_classes=3, input_size=48)
    assert model.input.shape[1:] == (48, 48, 3)
    assert model.get_layer("resize").output.shape[1:3] == (32, 32)


def test_caffe_preprocessing_is_bgr_minus_the_imagenet_mean() -> None:
    pixel = np.array([[[[10, 20, 30]]]], dtype=np.uint8)
    out = model_lib.Preprocess("caffe")(pixel).numpy().ravel()
    np.testing.assert_allclose(out, [30 - 103.939, 20 - 116.779, 10 - 123.68], rtol=1e-6)


@pytest.mark.parametrize(
    ("fraction", "expect_some", "expect_all"), [(0.0, False, False), (0.3, True, False), (1.0, True, True)]
)
def test_fine_tune_fraction_unfreezes_the_top_of_a_pretrained_backbone(
    fraction: float, expect_some: bool, expect_all: bool
) -> None:
    config = replace(TINY, backbone="resnet50", fine_tune_fraction=fraction)
    backbone, mode = model_lib.build_backbone(config)
    assert mode == "caffe"
    trainable = model_lib.set_trainable(backbone, fraction, pretrained=True)
    assert (trainable > 0) is expect_some
    convs = [layer for layer in backbone.layers if isinstance(layer, keras.layers.Conv2D)]
    assert all(c.trainable for c in convs) is expect_all
    assert convs[-1].trainable is expect_some  # the top is unfrozen first
    assert not any(
        layer.trainable for layer in backbone.layers if isinstance(layer, keras.layers.BatchNormalization)
    )


def test_weights_from_a_file(tmp_path: Path) -> None:
    source, _ = model_lib.build_backbone(replace(TINY, seed=1))
    path = tmp_path / "tiny_notop.h5"
    source.save_weights(str(path))
    loaded, _ = model_lib.build_backbone(replace(TINY, seed=2, weights=str(path)))
    for a, b in zip(source.get_weights(), loaded.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_missing_weights_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"--weights .*nope\.h5: no such weights file"):
        model_lib.build_backbone(replace(TINY, backbone="resnet50", weights=str(tmp_path / "nope.h5")))


# --- augmentation policies, the learning-rate schedule, the loss ----------------------------


def asymmetric(n: int, size: int) -> np.ndarray:
    """Images whose every flip and rotation differs from them: a gradient and a bright corner."""
    x = np.zeros((n, size, size, 3), dtype=np.float32)
    x += np.linspace(0, 200, size, dtype=np.float32)[None, None, :, None]
    x[:, : size // 4, : size // 8, :] = 255.0
    return x


@pytest.mark.parametrize("policy", ["flip_lr", "flip", "leaf"])
def test_each_policy_changes_the_input_in_training_only(policy: str) -> None:
    layers = model_lib.augmentation(policy, seed=1)
    assert layers is not None
    x = asymmetric(64, 32)
    trained = layers(x, training=True).numpy()
    assert not np.allclose(trained, x), f"{policy} left every image unchanged"
    assert np.allclose(layers(x, training=False).numpy(), x), f"{policy} changed images at inference"


def test_flip_lr_only_mirrors_left_and_right() -> None:
    x = asymmetric(64, 32)
    layers = model_lib.augmentation("flip_lr", seed=3)
    assert layers is not None
    out = layers(x, training=True).numpy()
    for image, original in zip(out, x, strict=True):
        assert np.allclose(image, original) or np.allclose(image, original[:, ::-1])
    assert any(np.allclose(image, original[:, ::-1]) for image, original in zip(out, x, strict=True))


def test_leaf_rotates_by_multiples_of_90_degrees_exactly() -> None:
    x = asymmetric(64, 16)
    out = model_lib.RandomRot90(seed=5)(tf.constant(x), training=True).numpy()
    seen = set()
    for image, original in zip(out, x, strict=True):
        k = [i for i in range(4) if np.array_equal(image, np.rot90(original, i))]
        assert len(k) == 1, "not an exact 90-degree rotation"
        seen.add(k[0])
    assert seen == {0, 1, 2, 3}


def test_none_and_auto_add_no_layers_and_auto_follows_the_data() -> None:
    from trainer.config import augment_policy, resolve_augment

    assert model_lib.augmentation("none", 0) is None and model_lib.augmentation("auto", 0) is None
    assert resolve_augment("auto", "tfds:cassava") == "leaf"
    assert resolve_augment("auto", "synthetic") == "flip"
    assert resolve_augment("auto", "folder:/data/characters") == "none"
    assert resolve_augment("flip_lr", "tfds:cassava") == "flip_lr"
    assert augment_policy("true") == "flip" and augment_policy("false") == "none"
    with pytest.raises(Exception, match="must be one of auto, none, flip_lr, flip, leaf"):
        augment_policy("rotate")


def test_the_schedule_warms_up_linearly_then_decays_as_a_cosine() -> None:
    config = replace(TINY, learning_rate=1e-3, per_replica_batch_size=16, epochs=4, warmup_epochs=1.0)
    schedule = model_lib.learning_rate(config, global_batch=32, steps_per_epoch=10)
    peak = 2e-3  # linear scaling: 1e-3 per replica x 2 replicas in sync
    assert schedule.warmup_steps == 10 and schedule.total_steps == 40
    expected = {0: peak * 1 / 10, 4: peak * 5 / 10, 9: peak, 10: peak, 25: peak / 2, 40: 0.0}
    for step, value in expected.items():
        assert float(schedule(step)) == pytest.approx(value, rel=1e-5, abs=1e-9), step
    assert float(schedule(18)) > float(schedule(19)) > float(schedule(30))


def test_constant_and_the_reference_batch_and_the_warmup_cap() -> None:
    constant = replace(TINY, learning_rate=1e-3, per_replica_batch_size=16, lr_schedule="constant")
    assert model_lib.learning_rate(constant, 64, 10) == pytest.approx(4e-3)
    reference = replace(constant, lr_reference_batch_size=256)
    assert model_lib.learning_rate(reference, 64, 10) == pytest.approx(2.5e-4)
    short = replace(TINY, epochs=2, warmup_epochs=5.0)
    assert model_lib.learning_rate(short, 16, 10).warmup_steps == 10  # at most half of 20 steps


def test_balanced_class_weights_and_the_weighted_smoothed_loss() -> None:
    weights = model_lib.balanced_class_weights([6, 3, 0, 3])
    assert weights == pytest.approx([12 / 24, 12 / 12, 0.0, 12 / 12])
    loss = model_lib.make_loss(3, label_smoothing=0.3, class_weights=[2.0, 1.0, 1.0])
    y_true = np.array([0, 1])
    y_pred = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]], dtype=np.float32)
    got = loss(tf.constant(y_true), tf.constant(y_pred)).numpy()
    # by hand: smoothed targets (1 - 0.3) * one_hot + 0.3 / 3
    smooth0 = np.array([0.8, 0.1, 0.1])
    smooth1 = np.array([0.1, 0.8, 0.1])
    want = [2.0 * -(smooth0 * np.log(y_pred[0])).sum(), 1.0 * -(smooth1 * np.log(y_pred[1])).sum()]
    assert got == pytest.approx(want, rel=1e-4)


def test_balanced_class_weights_need_the_counts() -> None:
    model = model_lib.build_model(replace(TINY, class_weights="balanced"), 3, 32)
    with pytest.raises(ValueError, match="needs the training split's class counts"):
        model_lib.compile_model(model, replace(TINY, class_weights="balanced"))


def test_one_unit_of_the_tiny_backbone_sees_about_the_whole_64_pixel_image() -> None:
    """What lets `tiny` learn classes that differ by where a shape sits (`b` against `d`): the
    pixels that can change one output unit span about the whole side before global pooling. The
    former 3-convolution backbone's unit saw 18 pixels."""
    backbone = model_lib.tiny_backbone((64, 64, 3), seed=0)
    x = tf.constant(np.random.default_rng(1).normal(size=(1, 64, 64, 3)), tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        features = backbone(x, training=False)
        unit = tf.reduce_sum(features[0, 1, 1])  # a unit off the centre: its field meets the border
    assert features.shape[1:3] == (4, 4)
    influence = tf.reduce_sum(tf.abs(tape.gradient(unit, x)), axis=(0, 3)).numpy()
    rows, cols = np.nonzero(influence.sum(axis=1))[0], np.nonzero(influence.sum(axis=0))[0]
    # From the border up to beyond the middle of the image, on both axes.
    assert rows.min() == cols.min() == 0 and rows.max() >= 48 and cols.max() >= 48, (rows, cols)
