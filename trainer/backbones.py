"""Every backbone the trainer knows, each registered once: adding one is one `Backbone` entry here.

The `--backbone` flag's choices (`trainer.config`), the model builder (`trainer.model`) and
`tests/trainer/test_backbones.py` (the docs' lists; every entry complete and consistent, every
application exists in the installed tf-keras and builds) read `REGISTRY`. No TensorFlow here, so
flags are checked in milliseconds: an application is named by its `tf_keras.applications` attribute.
"""

from __future__ import annotations

import dataclasses

PREPROCESSING_MODES = ("caffe", "tf", "unit", "raw")
"""How uint8 RGB pixels become what a backbone's weights expect (`trainer.model.Preprocess`):
`caffe` (BGR, ImageNet mean subtracted: ResNet), `tf` (scaled to [-1, 1]: MobileNet), `unit`
(scaled to [0, 1]), `raw` (0-255 floats: EfficientNet, which rescales internally)."""


@dataclasses.dataclass(frozen=True)
class Backbone:
    """One backbone: `name` is the `--backbone` value (lower case, digits, `_`); `application` the
    constructor in `tf_keras.applications` (called with `include_top=False, weights=...,
    input_shape=...`), None for `trainer.model.tiny_backbone`; `preprocessing` one of
    PREPROCESSING_MODES, what its weights were trained on; `imagenet` whether Keras publishes
    ImageNet weights for it (else only `--weights none` or a weights file)."""

    name: str
    application: str | None
    preprocessing: str
    imagenet: bool


REGISTRY: tuple[Backbone, ...] = (
    Backbone("resnet50", "ResNet50", "caffe", True),
    Backbone("resnet101", "ResNet101", "caffe", True),
    Backbone("efficientnet_b0", "EfficientNetB0", "raw", True),  # rescales internally
    Backbone("mobilenet_v2", "MobileNetV2", "tf", True),
    Backbone("tiny", None, "unit", False),
)
"""Every backbone, in the order `--backbone` lists them."""

DEFAULT = "resnet50"
"""`--backbone`'s default."""

NAMES: tuple[str, ...] = tuple(b.name for b in REGISTRY)
"""The `--backbone` choices."""


def get(name: str) -> Backbone:
    """The registered backbone called `name`; ValueError naming the choices otherwise."""
    for backbone in REGISTRY:
        if backbone.name == name:
            return backbone
    raise ValueError(f"unknown backbone {name!r}; expected one of {', '.join(NAMES)}")
