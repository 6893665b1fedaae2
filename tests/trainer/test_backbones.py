"""A backbone is one entry of `trainer.backbones.REGISTRY`, and an incomplete entry fails here, not
inside a training job: its application must exist in the installed tf-keras and build (random
weights, nothing downloaded), its preprocessing mode must be one the model knows, and the flag's
choices, the model builder and the docs must all follow the registry."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from trainer import backbones
from trainer import model as model_lib
from trainer._tf import keras
from trainer.config import TrainConfig, build_parser, parse_args

ROOT = Path(__file__).resolve().parents[2]
BASE = ["--data_dir=/d", "--model_dir=/m"]
APPLICATIONS = [b for b in backbones.REGISTRY if b.application is not None]


def registry_problems(entries: Sequence[backbones.Backbone], default: str) -> list[str]:
    """What is incomplete or inconsistent in `entries` (empty when nothing), without TensorFlow:
    each name unique and flag-shaped, each preprocessing mode known, each application a plausible
    Keras attribute name, no ImageNet weights claimed for the project's own CNN, the default
    registered."""
    problems = []
    names = [b.name for b in entries]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"backbone {name!r} is registered more than once")
    for b in entries:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", b.name):
            problems.append(f"backbone {b.name!r}: a name is lower case letters, digits and '_'")
        if b.preprocessing not in backbones.PREPROCESSING_MODES:
            problems.append(
                f"backbone {b.name!r}: unknown preprocessing mode {b.preprocessing!r}; "
                f"expected one of {', '.join(backbones.PREPROCESSING_MODES)}"
            )
        if b.application is not None and not re.fullmatch(r"[A-Z][A-Za-z0-9]*", b.application):
            problems.append(
                f"backbone {b.name!r}: application {b.application!r} is not a tf_keras.applications "
                "constructor name (e.g. ResNet50)"
            )
        if b.application is None and b.imagenet:
            problems.append(f"backbone {b.name!r}: the project's own CNN has no ImageNet weights")
    if default not in names:
        problems.append(f"the default backbone {default!r} is not registered")
    return problems


@pytest.fixture(autouse=True)
def float32_policy() -> Iterator[None]:
    yield
    keras.mixed_precision.set_global_policy("float32")


def test_the_registry_is_complete() -> None:
    assert registry_problems(backbones.REGISTRY, backbones.DEFAULT) == []
    assert tuple(b.name for b in backbones.REGISTRY) == backbones.NAMES


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"preprocessing": "imagenet"},
            r"'extra': unknown preprocessing mode 'imagenet'; expected one of caffe",
        ),
        ({"application": "resnet152"}, r"'extra': application 'resnet152' is not a tf_keras.applications"),
        ({"application": None, "imagenet": True}, r"'extra': the project's own CNN has no ImageNet weights"),
        ({"name": "ResNet-152"}, r"'ResNet-152': a name is lower case"),
        ({"name": "resnet50"}, r"backbone 'resnet50' is registered more than once"),
    ],
)
def test_an_incomplete_entry_is_named(change: dict[str, object], expected: str) -> None:
    extra = dataclasses.replace(backbones.Backbone("extra", "ResNet152", "caffe", True), **change)  # type: ignore[arg-type]
    problems = registry_problems((*backbones.REGISTRY, extra), backbones.DEFAULT)
    assert len(problems) == 1 and re.search(expected, problems[0]), problems


def test_an_unregistered_default_is_named() -> None:
    assert registry_problems(backbones.REGISTRY, "vgg16") == [
        "the default backbone 'vgg16' is not registered"
    ]


def test_every_preprocessing_mode_is_one_the_model_applies() -> None:
    assert model_lib.Preprocess.MODES == backbones.PREPROCESSING_MODES
    pixel = np.array([[[[10, 20, 30]]]], dtype=np.uint8)
    outputs = {
        mode: model_lib.Preprocess(mode)(pixel).numpy().ravel().tolist()
        for mode in backbones.PREPROCESSING_MODES
    }
    assert len({tuple(o) for o in outputs.values()}) == len(
        backbones.PREPROCESSING_MODES
    )  # each does its own


@pytest.mark.parametrize("entry", APPLICATIONS, ids=lambda b: b.name)
def test_every_application_exists_in_the_installed_tf_keras(entry: backbones.Backbone) -> None:
    constructor = model_lib.application(entry)
    parameters = inspect.signature(constructor).parameters
    assert {"include_top", "weights", "input_shape"} <= set(parameters), entry


def test_an_application_tf_keras_lacks_is_named() -> None:
    entry = backbones.Backbone("vit", "VisionTransformerB16", "tf", True)
    with pytest.raises(
        ValueError, match=r"backbone 'vit': tf_keras.applications has no 'VisionTransformerB16'"
    ):
        model_lib.application(entry)


@pytest.mark.parametrize("name", backbones.NAMES)
def test_every_backbone_builds_and_classifies(name: str) -> None:
    """The whole classifier with random weights at the smallest image size: the application's
    arguments, the preprocessing and the head fit together (about a second per backbone)."""
    config = TrainConfig(
        data_dir="/d",
        model_dir="/m",
        checkpoint_dir="/c",
        tensorboard_dir="/l",
        backbone=name,
        weights="none",
        image_size=32,
        dense_units=8,
        fine_tune_fraction=1.0,
        augment="none",
    )
    model = model_lib.build_model(config, num_classes=3, input_size=32)
    assert model.get_layer("preprocess").mode == backbones.get(name).preprocessing
    probs = model(np.zeros((2, 32, 32, 3), dtype=np.uint8), training=False).numpy()
    assert probs.shape == (2, 3)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)


def test_the_flag_offers_the_registry() -> None:
    action = next(a for a in build_parser()._actions if a.dest == "backbone")
    assert tuple(action.choices or ()) == backbones.NAMES
    assert action.default == backbones.DEFAULT == TrainConfig.backbone
    for entry in backbones.REGISTRY:
        assert parse_args([*BASE, f"--backbone={entry.name}", "--weights=none"], {}).backbone == entry.name


@pytest.mark.parametrize("entry", backbones.REGISTRY, ids=lambda b: b.name)
def test_imagenet_weights_are_refused_exactly_where_keras_has_none(
    entry: backbones.Backbone, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*BASE, f"--backbone={entry.name}", "--weights=imagenet"]
    if entry.imagenet:
        assert parse_args(argv, {}).weights == "imagenet"
        return
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv, {})
    assert exit_info.value.code == 2
    assert f"--weights imagenet is not available for --backbone {entry.name}" in capsys.readouterr().err


def mentioned(line: str) -> list[str]:
    """The registered backbone names a line names, in order (whole words, as written)."""
    pattern = "|".join(re.escape(n) for n in sorted(backbones.NAMES, key=len, reverse=True))
    return re.findall(rf"(?<![\w-])(?:{pattern})(?![\w-])", line)


def test_every_list_of_backbones_in_the_docs_is_the_registry() -> None:
    """A line of README.md or docs/*.md that names two or more backbones lists them all, in the
    registry's order (the docs follow the registry; a new entry shows where the docs are behind).
    A table `make docs` writes is the code's own (a parameter's two defaults name two)."""
    stale = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        generated = False
        for number, line in enumerate(path.read_text().splitlines(), 1):
            generated = (generated or "<!-- BEGIN GENERATED" in line) and "<!-- END GENERATED" not in line
            names = mentioned(line)
            if not generated and len(set(names)) >= 2 and tuple(names) != backbones.NAMES:
                stale.append(f"{path.relative_to(ROOT)}:{number}: {names}")
    assert not stale, f"lists of backbones that are not {backbones.NAMES}:\n" + "\n".join(stale)
