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
