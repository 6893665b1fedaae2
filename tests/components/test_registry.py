"""The registry step's rules, as strict as Vertex: serving images that exist, display names,
labels, and a local registry no name can escape."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from components import registry
from local import steps


def aiplatform_tf2_versions() -> set[str]:
    """The TF2 versions of aiplatform's own list of prebuilt prediction images."""
    from google.cloud.aiplatform.constants import prediction

    versions = set()
    for uri in prediction.TF_CONTAINER_URIS:
        match = re.search(r"/tf2-(cpu|gpu)\.2-(\d+):latest$", uri)
        if match:
            versions.add(f"2.{match.group(2)}")
    return versions


def test_the_prebuilt_table_is_the_images_that_exist() -> None:
    assert set(registry.PREBUILT_TF_SERVING_VERSIONS) == aiplatform_tf2_versions()
    assert (
        max(registry.PREBUILT_TF_SERVING_VERSIONS, key=lambda v: int(v.split(".")[1]))
        == registry.DEFAULT_SERVING_TF_VERSION
    )


@pytest.mark.parametrize("version", ["2.21", "2.16", "3.0", "2.15.1", ""])
def test_a_serving_version_without_a_prebuilt_image_is_refused(version: str) -> None:
    """`tf2-cpu.2-21` was derived from the trainer's TF and does not exist: deploying fails."""
    with pytest.raises(
        ValueError, match=r"has no prebuilt Vertex AI TensorFlow serving image; prebuilt versions: 2\.15"
    ):
        registry.serving_container_uri(version, "cpu", "us-central1")


def test_every_uri_chosen_is_one_aiplatform_lists() -> None:
    from google.cloud.aiplatform.constants import prediction

    for version in registry.PREBUILT_TF_SERVING_VERSIONS:
        for accelerator in ("cpu", "gpu"):
            for location in ("us-central1", "europe-west4", "asia-northeast1", "australia-southeast1"):
                uri = registry.serving_container_uri(version, accelerator, location)
                assert uri in prediction.TF_CONTAINER_URIS, uri
                assert registry.prebuilt_tf_version(uri) == version
    assert registry.prebuilt_tf_version("us-docker.pkg.dev/p/r/trainer-serving@sha256:" + "0" * 64) == ""


def test_serving_image_choice_and_labels(capsys: pytest.CaptureFixture[str]) -> None:
    out = registry.upload_settings.python_func(
        location="europe-west4",
        serving_image="prebuilt",
        tf_version=registry.DEFAULT_SERVING_TF_VERSION,
        serving_accelerator="gpu",
        custom_image_uri="",
        labels={"Team": "ML Ops"},
        source_commit="ABC123",
        pipeline_run="multiworker-cassava-training-20261121",
    )
    assert out.serving_image == "europe-docker.pkg.dev/vertex-ai/prediction/tf2-gpu.2-15:latest"
    # The choice is logged, with why.
    assert (
        "Vertex's prebuilt TensorFlow 2.15 GPU serving image (the newest prebuilt" in capsys.readouterr().out
    )
    assert out.labels == {
        "team": "ml-ops",
        "pipeline_run": "multiworker-cassava-training-20261121",
        "source_commit": "abc123",
    }
    built = "us-central1-docker.pkg.dev/p/r/trainer-serving@sha256:" + "1" * 64
    custom = registry.upload_settings.python_func(
        location="us-central1",
        serving_image="custom",
        tf_version="2.15",
        serving_accelerator="cpu",
        custom_image_uri=built,
        labels={},
        source_commit="",
        pipeline_run="r",
    )
    assert custom.serving_image == built and "source_commit" not in custom.labels
    assert "the custom serving image built from Dockerfile.serving" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("mode", "custom_uri", "match"),
    [
        ("custom", "", "serving_image=custom but the build step made no serving image"),
        ("my image", "", "serving_image must be prebuilt, custom or an image URI"),
        ("", "", "serving_image must be prebuilt, custom or an image URI"),
    ],
)
def test_bad_serving_choices_are_named(mode: str, custom_uri: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        registry.choose_serving_image(mode, "2.15", "cpu", "us-central1", custom_uri)


def test_an_image_uri_of_the_users_is_taken_as_given() -> None:
    image, why = registry.choose_serving_image("eu.gcr.io/p/serving:1.2", "2.15", "cpu", "europe-west1", "")
    assert image == "eu.gcr.io/p/serving:1.2" and "given by serving_image" in why


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        ({"1team": "x"}, r"label keys must start with a lowercase letter.*'1team'"),
        ({f"k{i}": "v" for i in range(63)}, "65 labels: Vertex allows at most 64"),
    ],
)
def test_labels_vertex_would_refuse_are_refused(labels: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        registry.upload_settings.python_func(
            location="us-central1",
            serving_image="prebuilt",
            tf_version="2.15",
            serving_accelerator="cpu",
            custom_image_uri="",
            labels=labels,
            source_commit="abc",
            pipeline_run="r",
        )


def test_registry_parameters_are_checked_before_any_work() -> None:
    ok = {"model_display_name": "cassava", "serving_image": "custom", "serving_tf_version": "2.15"}
    registry.check_registry_parameters(ok)  # custom: the pipeline builds the image
    with pytest.raises(ValueError, match="no prebuilt"):
        registry.check_registry_parameters({**ok, "serving_image": "prebuilt", "serving_tf_version": "2.21"})
    with pytest.raises(ValueError, match="model_display_name is required"):
        registry.check_registry_parameters({**ok, "model_display_name": " "})
    with pytest.raises(ValueError, match="has 129 characters; Vertex allows at most 128"):
        registry.check_registry_parameters({**ok, "model_display_name": "x" * 129})


@pytest.mark.parametrize(
    "name", ["../../escaped", "/tmp/absolute", "..", ".", "a/b", "nested/../../x", "caf\u00e9 v2"]
)
def test_no_display_name_leaves_the_registry_folder(tmp_path: Path, name: str) -> None:
    folder = steps.registry_folder(name)
    assert "/" not in folder and folder not in (".", "..", "")
    resolved = (tmp_path / folder).resolve()
    assert resolved.parent == tmp_path.resolve()


def test_distinct_names_get_distinct_folders() -> None:
    names = ["a b", "a%20b", "a_b", "A_b", "a-b", "a.b", "a/b", "a%2Fb"]
    assert len({steps.registry_folder(n) for n in names}) == len(names)


def test_local_find_champion_reads_the_mapped_folder(tmp_path: Path) -> None:
    name = "../outside"
    folder = tmp_path / steps.registry_folder(name)
    (folder / "3" / "model").mkdir(parents=True)
    (folder / "aliases.json").write_text(json.dumps({"default": "1", "champion": "3"}))
    (folder / "3" / "model" / "metrics.json").write_text(json.dumps({"test_accuracy": 0.91}))
    out = steps.local_find_champion.python_func(registry_dir=str(tmp_path), model_display_name=name)
    assert out.exists and out.champion_accuracy == 0.91
    assert not (tmp_path.parent / "outside").exists()
