"""The registry step's rules, as strict as Vertex: serving images that exist, display names,
labels, a local registry no name can escape, and a champion only ever compared with (and
replaced by) a model of the same task: the same class names in the same order."""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.cloud import aiplatform_v1
from google.cloud.aiplatform_v1.services.model_service.transports.grpc import ModelServiceGrpcTransport
from google.protobuf import json_format

from components import registry, servingimage
from local import steps
from tests.fakes import Abort, GrpcFake, insecure_client, storage_emulator

CASSAVA = ["cbb", "cbsd", "cgm", "cmd", "healthy"]


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
    assert set(servingimage.PREBUILT_TF_SERVING_VERSIONS) == aiplatform_tf2_versions()
    assert (
        max(servingimage.PREBUILT_TF_SERVING_VERSIONS, key=lambda v: int(v.split(".")[1]))
        == servingimage.DEFAULT_SERVING_TF_VERSION
    )


@pytest.mark.parametrize("version", ["2.21", "2.16", "3.0", "2.15.1", ""])
def test_a_serving_version_without_a_prebuilt_image_is_refused(version: str) -> None:
    """`tf2-cpu.2-21` was derived from the trainer's TF and does not exist: deploying fails."""
    with pytest.raises(
        ValueError, match=r"has no prebuilt Vertex AI TensorFlow serving image; prebuilt versions: 2\.15"
    ):
        servingimage.serving_container_uri(version, "cpu", "us-central1")


def test_every_uri_chosen_is_one_aiplatform_lists() -> None:
    from google.cloud.aiplatform.constants import prediction

    for version in servingimage.PREBUILT_TF_SERVING_VERSIONS:
        for accelerator in ("cpu", "gpu"):
            for location in ("us-central1", "europe-west4", "asia-northeast1", "australia-southeast1"):
                # On a day when every version was still available.
                uri = servingimage.serving_container_uri(version, accelerator, location, today="2020-01-01")
                assert uri in prediction.TF_CONTAINER_URIS, uri
                assert servingimage.prebuilt_tf_version(uri) == version
    assert servingimage.prebuilt_tf_version("us-docker.pkg.dev/p/r/trainer-serving@sha256:" + "0" * 64) == ""


def test_serving_image_choice_and_labels(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A day 2.15 is safely available (the component judges on the run's date).
    monkeypatch.setattr(servingimage, "prebuilt_days_left", lambda v, today="": ("2027-01-14", 200))
    out = registry.upload_settings.python_func(
        location="europe-west4",
        serving_image="prebuilt",
        tf_version=servingimage.DEFAULT_SERVING_TF_VERSION,
        serving_accelerator="gpu",
        custom_image_uri="",
        model_uri="gs://b/m/1",
        labels={"Team": "ML Ops", "équipe": "josé", "xè": "1", "xé": "2"},
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
        "équipe": "josé",  # international characters are allowed, as Vertex allows them
        "xè": "1",
        "xé": "2",
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
        model_uri="gs://b/m/1",
        labels={},
        source_commit="",
        pipeline_run="r",
    )
    assert custom.serving_image == built and "source_commit" not in custom.labels
    assert "the custom serving image built from Dockerfile.serving" in capsys.readouterr().out


def test_each_image_is_given_the_model_where_it_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer publishes into `<model>/1`: the custom image (TensorFlow Serving) is given
    `<model>` and its routes, any other image the SavedModel's folder and its own routes."""
    monkeypatch.setattr(servingimage, "prebuilt_days_left", lambda v, today="": ("2027-01-14", 200))
    model = "gs://b/models/cassava/run-9/1"
    built = "us-central1-docker.pkg.dev/p/r/trainer-serving@sha256:" + "1" * 64
    common = {"location": "us-central1", "tf_version": "2.15", "serving_accelerator": "cpu", "labels": {}}
    common |= {"source_commit": "", "pipeline_run": "r", "model_uri": model}
    for mode, uri, artifact, routes in (
        ("custom", built, "gs://b/models/cassava/run-9", servingimage.tf_serving_routes()),
        ("auto", built, "gs://b/models/cassava/run-9", servingimage.tf_serving_routes()),
        ("auto", "", model, {"predict_route": "", "health_route": ""}),
        ("prebuilt", "", model, {"predict_route": "", "health_route": ""}),
        ("eu.gcr.io/p/serving:1", "", model, {"predict_route": "", "health_route": ""}),
    ):
        out = registry.upload_settings.python_func(serving_image=mode, custom_image_uri=uri, **common)
        assert out.artifact_uri == artifact, mode
        assert {"predict_route": out.predict_route, "health_route": out.health_route} == routes, mode
        # find-champion reads the version back where the trainer published it.
        assert servingimage.saved_model_folder(out.artifact_uri, out.predict_route) == model, mode
    with pytest.raises(ValueError, match="numbered version folder"):
        servingimage.registered_artifact(True, "gs://b/models/cassava/run-9")


@pytest.mark.parametrize(
    ("mode", "custom_uri", "match"),
    [
        ("custom", "", "serving_image=custom but the build step made no serving image"),
        ("my image", "", "serving_image must be auto, prebuilt, custom or an image URI"),
        ("", "", "serving_image must be auto, prebuilt, custom or an image URI"),
        # Vertex takes images in Artifact Registry or Container Registry only, well formed.
        *(
            (image, "", "in Artifact Registry or Container Registry")
            for image in (
                "tensorflow/serving:2.20.0",
                "ghcr.io/o/serving:v1",
                "us-docker.pkg.dev/p/r/serving:tä",
                "us-docker.pkg.dev/p/r//serving-:.x",
            )
        ),
    ],
)
def test_bad_serving_choices_are_named(mode: str, custom_uri: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        servingimage.choose_serving_image(mode, "2.15", "cpu", "us-central1", custom_uri)


def test_an_image_uri_of_the_users_is_taken_as_given() -> None:
    image, why = servingimage.choose_serving_image(
        "eu.gcr.io/p/serving:1.2", "2.15", "cpu", "europe-west1", ""
    )
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
            serving_image="custom",
            tf_version="2.15",
            serving_accelerator="cpu",
            custom_image_uri="us-docker.pkg.dev/p/r/trainer-serving:t",
            model_uri="gs://b/m/1",
            labels=labels,
            source_commit="abc",
            pipeline_run="r",
        )


def test_registry_parameters_are_checked_before_any_work() -> None:
    """What pipeline.options.gate calls for the registry's parameters, before any work."""
    from components import servingimage

    servingimage.check_serving_parameters("custom", "2.15", "cpu", "")  # the pipeline builds the image
    with pytest.raises(ValueError, match="no prebuilt"):
        servingimage.check_serving_parameters("prebuilt", "2.21", "cpu", "")
    with pytest.raises(ValueError, match="model_display_name is required"):
        registry.check_model_display_name(" ")
    with pytest.raises(ValueError, match="has 129 characters; Vertex allows at most 128"):
        registry.check_model_display_name("x" * 129)


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


@pytest.mark.parametrize(
    "name", ["\u732b" * 29, "\u732b" * 128, "\U0001f600" * 128, "a" * 128, "\U0001f600" * 127 + "a"]
)
def test_every_name_vertex_allows_gets_a_folder_the_file_system_allows(tmp_path: Path, name: str) -> None:
    """128 characters of any UTF-8 (Vertex's rule): 128 emoji encode to 1,536 bytes, past a file
    name's 255; the folder is made, and names sharing the first 200 bytes still differ."""
    folder = steps.registry_folder(name)
    assert len(folder.encode()) <= 255 and "/" not in folder
    (tmp_path / folder).mkdir()
    assert steps.registry_folder(name) == folder  # the same name finds the same folder
    twin = name[:-1] + ("b" if name[-1] != "b" else "c")
    assert steps.registry_folder(twin) != folder
    if len(name.encode()) * 3 <= 240:  # short names keep the folder earlier versions gave them
        assert "~" not in folder


def test_local_find_champion_reads_the_mapped_folder(tmp_path: Path) -> None:
    name = "../outside"
    folder = tmp_path / steps.registry_folder(name)
    (folder / "3" / "model").mkdir(parents=True)
    (folder / "aliases.json").write_text(json.dumps({"default": "1", "champion": "3"}))
    metrics = {"test_accuracy": 0.91, "class_names": CASSAVA}
    (folder / "3" / "model" / "metrics.json").write_text(json.dumps(metrics))
    (folder / "3" / "model" / "saved_model.pb").write_bytes(b"pb")
    (folder / "3" / "version.json").write_text("{}")  # as registered before file sizes were recorded
    out = steps.local_find_champion.python_func(registry_dir=str(tmp_path), model_display_name=name)
    assert out.exists and out.class_names == CASSAVA
    # The champion's version and SavedModel folder: what the evaluation job re-evaluates.
    assert (out.champion_version, out.champion_uri) == ("3", str(folder.resolve() / "3" / "model"))
    assert not (tmp_path.parent / "outside").exists()


def test_local_find_champion_without_a_champion_has_no_class_names(tmp_path: Path) -> None:
    none = steps.local_find_champion.python_func(registry_dir=str(tmp_path), model_display_name="m")
    assert (none.exists, none.champion_version, none.champion_uri, none.class_names) == (False, "", "", [])
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "aliases.json").write_text(json.dumps({"default": "1"}))
    no_alias = steps.local_find_champion.python_func(registry_dir=str(tmp_path), model_display_name="m")
    assert (no_alias.exists, no_alias.champion_version, no_alias.champion_uri) == (True, "", "")
    assert no_alias.class_names == []


# --- the same task: the same class names in the same order -----------------------------------


def test_a_model_of_the_champions_classes_or_without_a_champion_is_comparable() -> None:
    assert registry.task_mismatch(CASSAVA, CASSAVA) == ""
    assert registry.task_mismatch(["only"], []) == ""  # no champion (preparation refuses one class)


@pytest.mark.parametrize(
    ("classes", "how"),
    [
        (
            ["healthy"],
            "1 class(es) against the champion's 5; missing ['cbb', 'cbsd', 'cgm', 'cmd'], extra []",
        ),
        (["cat", "dog"], "2 class(es) against the champion's 5; missing"),
        (list(reversed(CASSAVA)), "the same class names in another order"),
    ],
    ids=["one-class", "unrelated", "reordered"],
)
def test_another_task_is_named_with_both_class_lists_and_what_to_do(classes: list[str], how: str) -> None:
    why = registry.task_mismatch(classes, CASSAVA, "cassava-classifier")
    assert f"this run's dataset has the classes {classes}" in why
    assert f"the champion of 'cassava-classifier' was trained on {CASSAVA}" in why
    assert how in why and "use another model_display_name" in why


@pytest.mark.parametrize(
    "classes", [CASSAVA, ["healthy"], ["cat", "dog"], list(reversed(CASSAVA)), [*CASSAVA, "extra"], []]
)
def test_the_preparation_refuses_what_the_gate_would_refuse(classes: list[str]) -> None:
    """The check before any conversion (`trainer.prepare`, given the champion's classes by the
    plan) and the gate's (`task_mismatch`) are one rule, kept in two layers that cannot import
    each other: they agree on every case, and the preparation's names both lists."""
    from trainer.prepare import champion_mismatch

    gate = registry.task_mismatch(classes, CASSAVA)
    before = champion_mismatch(classes, CASSAVA)
    assert bool(gate) == bool(before) == (classes != CASSAVA)
    if before:
        assert str(classes) in before and str(CASSAVA) in before
        assert "use another model_display_name" in before
    assert champion_mismatch(classes, []) == ""  # no champion: nothing to compare with


# --- find_champion (Vertex) against a fake ModelService and a Cloud Storage emulator ----------

PARENT = "projects/p/locations/us-central1/models/77"
BUCKET = "models-bucket"


@pytest.fixture
def model_service(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Models by display name, and the version each alias points to (a Model with its
    artifact_uri); the champion's metrics.json is in the storage emulator."""
    import google.cloud.storage as storage

    state: dict[str, Any] = {"models": {}, "aliases": {}}
    fake = GrpcFake()

    def list_models(request: aiplatform_v1.ListModelsRequest) -> aiplatform_v1.ListModelsResponse:
        name = re.fullmatch(r'display_name="(.*)"', request.filter)
        assert name, request.filter
        # AIP-160: "services should support wildcards using the * character" in a string `=`.
        matched = [
            (n, m) for n, ms in state["models"].items() if fnmatch.fnmatchcase(n, name.group(1)) for m in ms
        ]
        return aiplatform_v1.ListModelsResponse(
            models=[aiplatform_v1.Model(name=m.name, display_name=n) for n, m in matched]
        )

    def get_model(request: aiplatform_v1.GetModelRequest) -> aiplatform_v1.Model:
        if request.name not in state["aliases"]:
            raise Abort(grpc.StatusCode.NOT_FOUND, f"{request.name} not found")
        return state["aliases"][request.name]

    def merge_aliases(request: aiplatform_v1.MergeVersionAliasesRequest) -> aiplatform_v1.Model:
        model = state["aliases"][request.name]
        for alias in request.version_aliases:
            state["aliases"][f"{request.name.split('@')[0]}@{alias}"] = model
        return aiplatform_v1.Model(
            name=model.name, version_id=model.version_id, version_aliases=list(request.version_aliases)
        )

    service = "google.cloud.aiplatform.v1.ModelService"
    fake.add(service, "ListModels", aiplatform_v1.ListModelsRequest, list_models)
    fake.add(service, "GetModel", aiplatform_v1.GetModelRequest, get_model)
    fake.add(service, "MergeVersionAliases", aiplatform_v1.MergeVersionAliasesRequest, merge_aliases)

    def update_model(request: aiplatform_v1.UpdateModelRequest) -> aiplatform_v1.Model:
        return request.model

    fake.add(service, "UpdateModel", aiplatform_v1.UpdateModelRequest, update_model)

    def import_evaluation(
        request: aiplatform_v1.ImportModelEvaluationRequest,
    ) -> aiplatform_v1.ModelEvaluation:
        if state.get("refuse_import"):
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "metrics do not match the schema")
        return aiplatform_v1.ModelEvaluation(name=f"{request.parent.split('@')[0]}/evaluations/1")

    fake.add(service, "ImportModelEvaluation", aiplatform_v1.ImportModelEvaluationRequest, import_evaluation)
    state["fake"] = fake
    fake.start()
    monkeypatch.setattr(
        aiplatform_v1,
        "ModelServiceClient",
        insecure_client(aiplatform_v1.ModelServiceClient, ModelServiceGrpcTransport, fake.address),
    )
    with storage_emulator() as url:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
        state["bucket"] = storage.Client(project="p").create_bucket(BUCKET)
        yield state
    fake.stop()


def find(**overrides: Any) -> Any:
    args = {"project": "p", "location": "us-central1", "model_display_name": "cassava", **overrides}
    return registry.find_champion.python_func(**args)


def test_find_champion_returns_the_champions_version_folder_and_class_names(
    model_service: dict[str, Any],
) -> None:
    model_service["models"]["cassava"] = [aiplatform_v1.Model(name=PARENT)]
    model_service["aliases"][f"{PARENT}@champion"] = aiplatform_v1.Model(
        name=PARENT, version_id="3", artifact_uri=f"gs://{BUCKET}/runs/7/train/model/"
    )
    metrics = {"test_accuracy": 0.91, "class_names": CASSAVA}
    model_service["bucket"].blob("runs/7/train/model/metrics.json").upload_from_string(json.dumps(metrics))
    out = find()
    assert (out.exists, out.resource_name, out.class_names) == (True, PARENT, CASSAVA)
    # The versioned name the gate checks the alias against, and the folder (without the
    # trailing slash) the evaluation job reads the champion's SavedModel from.
    assert (out.champion_version, out.champion_uri) == (f"{PARENT}@3", f"gs://{BUCKET}/runs/7/train/model")
    assert out.resource_uri == f"https://us-central1-aiplatform.googleapis.com/v1/{PARENT}"


def test_a_champion_served_by_tensorflow_serving_is_read_in_its_version_folder(
    model_service: dict[str, Any],
) -> None:
    """Registered with the custom image, a version's artifact_uri is the base above `1/`
    (`servingimage.registered_artifact`); its SavedModel and metrics.json are in `1/`."""
    model_service["models"]["cassava"] = [aiplatform_v1.Model(name=PARENT)]
    model_service["aliases"][f"{PARENT}@champion"] = aiplatform_v1.Model(
        name=PARENT,
        version_id="4",
        artifact_uri=f"gs://{BUCKET}/models/cassava/run-8",
        container_spec=aiplatform_v1.ModelContainerSpec(
            image_uri="us-docker.pkg.dev/p/r/trainer-serving@sha256:" + "2" * 64,
            **servingimage.tf_serving_routes(),
        ),
    )
    metrics = {"test_accuracy": 0.93, "class_names": CASSAVA}
    model_service["bucket"].blob("models/cassava/run-8/1/metrics.json").upload_from_string(
        json.dumps(metrics)
    )
    out = find()
    assert (out.champion_uri, out.class_names) == (f"gs://{BUCKET}/models/cassava/run-8/1", CASSAVA)


def test_a_champion_whose_files_are_gone_is_named_and_counts_as_none(
    model_service: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """A lifecycle rule deleted the champion's folder: find-champion says so (not a raw NotFound),
    and the run goes on as with no champion to compare with, the alias still where it is, so a
    model that passes the gate takes it (record_on_version compares with that very version)."""
    model_service["models"]["cassava"] = [aiplatform_v1.Model(name=PARENT)]
    model_service["aliases"][f"{PARENT}@champion"] = aiplatform_v1.Model(
        name=PARENT, version_id="3", artifact_uri=f"gs://{BUCKET}/models/cassava/run-7/"
    )
    out = find()
    printed = capsys.readouterr().out
    assert f"champion {PARENT}@3's files are gone: gs://{BUCKET}/models/cassava/run-7/metrics.json" in printed
    assert "lifecycle rule" in printed and "What may be deleted" in printed
    assert (out.exists, out.champion_version, out.champion_uri, out.class_names) == (
        True,
        f"{PARENT}@3",
        "",
        [],
    )


def test_find_champion_takes_only_the_model_of_exactly_its_name(model_service: dict[str, Any]) -> None:
    """A `*` in the name is a wildcard to the filter (AIP-160): models it matches are not its own."""
    model_service["models"] |= {"cassava-a": [aiplatform_v1.Model(name=PARENT)]}
    model_service["models"] |= {"cassava-b": [aiplatform_v1.Model(name=PARENT + "8")]}
    assert find(model_display_name="cassava*").exists is False


def test_find_champion_without_a_model_or_an_alias_has_no_class_names(model_service: dict[str, Any]) -> None:
    assert (find().class_names, find().champion_version, find().champion_uri, find().exists) == (
        [],
        "",
        "",
        False,
    )
    # The upload's parent-model importer needs a URI; the empty resourceName makes GCPC's
    # launcher upload a first model.
    assert (find().resource_uri, find().resource_name) == (
        "https://us-central1-aiplatform.googleapis.com/v1/projects/p/locations/us-central1/models",
        "",
    )
    model_service["models"]["cassava"] = [aiplatform_v1.Model(name=PARENT)]
    no_alias = find()
    assert (no_alias.exists, no_alias.champion_version, no_alias.class_names) == (True, "", [])


def version(state: dict[str, Any], number: str, accuracy: float, classes: list[str]) -> str:
    """Registers version `number` (reachable as PARENT@number) with its metrics.json in GCS."""
    folder = f"runs/{number}/train/model"
    state["aliases"][f"{PARENT}@{number}"] = aiplatform_v1.Model(
        name=PARENT, version_id=number, artifact_uri=f"gs://{BUCKET}/{folder}/", labels={"uploaded": "yes"}
    )
    metrics = {"test_accuracy": accuracy, "class_names": classes}
    state["bucket"].blob(f"{folder}/metrics.json").upload_from_string(json.dumps(metrics))
    return f"{PARENT}@{number}"


EVALUATED = {
    "split": "test",
    "dataset_fingerprint": "sha256:" + "ab" * 32,
    "models": {
        "challenger": {
            "examples": 20,
            "loss": 0.31,
            "accuracy": 0.9,
            "macro_f1": 0.88,
            "per_class": {"a": {"precision": 1.0, "recall": 0.8, "f1": 0.89, "support": 10}},
            "confusion_matrix": {"labels": ["a", "b"], "matrix": [[8, 2], [0, 10]]},
        }
    },
    "comparison": {"examples": 20, "mcnemar": {"b": 3, "c": 1, "p_value": 0.625}},
}


def record(name: str, evaluated: str, promote: bool = True) -> tuple[bool, str, str]:
    return registry.record_on_version(
        "us-central1",
        name,
        "Promoted on accuracy ...",
        {"gate": "promoted"},
        promote,
        evaluated,
        evaluation=registry.evaluation_record(EVALUATED, "Promoted on accuracy ..."),
    )


def test_the_gate_moves_the_alias_from_the_champion_it_compared_with(
    model_service: dict[str, Any],
) -> None:
    one = version(model_service, "1", 0.90, CASSAVA)
    model_service["aliases"][f"{PARENT}@champion"] = model_service["aliases"][one]
    moved, reason, _ = record(version(model_service, "2", 0.92, CASSAVA), evaluated=one)
    assert moved and model_service["aliases"][f"{PARENT}@champion"].version_id == "2", reason
    assert model_service["fake"].calls("MergeVersionAliases")
    # The decision is written on the version itself: its own description and its labels, kept.
    (update,) = model_service["fake"].calls("UpdateModel")
    assert update.model.name == f"{PARENT}@2" and sorted(update.update_mask.paths) == [
        "labels",
        "version_description",
    ]
    assert update.model.version_description == "Promoted on accuracy ..."
    assert dict(update.model.labels) == {"uploaded": "yes", "gate": "promoted"}
    # The evaluation itself, on the version, in the schema the console draws (its confusion matrix).
    (imported,) = model_service["fake"].calls("ImportModelEvaluation")
    assert imported.parent == f"{PARENT}@2"
    evaluation = imported.model_evaluation
    assert evaluation.metrics_schema_uri.startswith("gs://google-cloud-aiplatform/schema/modelevaluation/")
    assert evaluation.metrics_schema_uri.endswith("/classification_metrics_1.0.0.yaml")
    metrics = json_format.MessageToDict(aiplatform_v1.ModelEvaluation.pb(evaluation).metrics)
    assert metrics["confusionMatrix"]["rows"] == [[8, 2], [0, 10]] and metrics["logLoss"] == 0.31
    assert [s["displayName"] for s in metrics["confusionMatrix"]["annotationSpecs"]] == ["a", "b"]
    metadata = json_format.MessageToDict(aiplatform_v1.ModelEvaluation.pb(evaluation).metadata)
    assert metadata["macro_f1"] == 0.88 and metadata["per_class"]["a"]["recall"] == 0.8
    assert metadata["dataset_fingerprint"] == EVALUATED["dataset_fingerprint"]
    assert metadata["comparison"]["mcnemar"]["p_value"] == 0.625


def test_a_held_version_gets_the_decision_and_not_the_alias(model_service: dict[str, Any]) -> None:
    one = version(model_service, "1", 0.90, CASSAVA)
    model_service["aliases"][f"{PARENT}@champion"] = model_service["aliases"][one]
    moved, reason, _ = record(version(model_service, "2", 0.80, CASSAVA), evaluated=one, promote=False)
    assert not moved and "held this version back" in reason
    assert model_service["aliases"][f"{PARENT}@champion"].version_id == "1"
    assert model_service["fake"].calls("UpdateModel") and not model_service["fake"].calls(
        "MergeVersionAliases"
    )


def test_a_champion_registered_since_the_gate_compared_keeps_the_alias(
    model_service: dict[str, Any],
) -> None:
    """Two overlapping runs: both evaluations compared with version 4; the first to finish moved
    the alias to version 5. The second (version 6) was never compared with version 5 on like-for-
    like data, so it must not take the alias, however its own figures look."""
    four = version(model_service, "4", 0.90, CASSAVA)
    version(model_service, "5", 0.91, CASSAVA)
    model_service["aliases"][f"{PARENT}@champion"] = model_service["aliases"][f"{PARENT}@5"]
    moved, reason, _ = record(version(model_service, "6", 0.99, CASSAVA), evaluated=four)
    assert not moved and "stays on version 5" in reason and "was on version 4" in reason
    assert "run the pipeline again" in reason
    assert model_service["aliases"][f"{PARENT}@champion"].version_id == "5"
    assert not model_service["fake"].calls("MergeVersionAliases")
    # An evaluation that compared with no champion (the first run) cannot take the alias once one exists.
    first, why, _ = record(version(model_service, "7", 0.99, CASSAVA), evaluated="")
    assert not first and "was on no version" in why


def test_the_first_champion_takes_the_alias(model_service: dict[str, Any]) -> None:
    moved, _, _ = record(version(model_service, "1", 0.6, CASSAVA), evaluated="")
    assert moved and model_service["aliases"][f"{PARENT}@champion"].version_id == "1"


def test_default_moves_with_the_champion_and_a_held_version_moves_neither(
    model_service: dict[str, Any],
) -> None:
    """Vertex keeps `default` on version 1 unless a request names it (ModelUploadOp sends no
    aliases); everything that names the model without a version gets `default`."""
    one = version(model_service, "1", 0.90, CASSAVA)
    model_service["aliases"][f"{PARENT}@champion"] = model_service["aliases"][f"{PARENT}@default"] = (
        model_service["aliases"][one]
    )
    record(version(model_service, "2", 0.80, CASSAVA), evaluated=one, promote=False)
    assert model_service["aliases"][f"{PARENT}@default"].version_id == "1"
    moved, _, _ = record(version(model_service, "3", 0.95, CASSAVA), evaluated=one)
    assert moved
    (merge,) = model_service["fake"].calls("MergeVersionAliases")
    assert merge.name == f"{PARENT}@3" and sorted(merge.version_aliases) == ["champion", "default"]
    assert model_service["aliases"][f"{PARENT}@default"].version_id == "3"


def test_versions_are_compared_by_id_whatever_the_project_is_spelled(model_service: dict[str, Any]) -> None:
    """find-champion's name comes from list_models (the project's number), the upload's may
    spell the project by its ID: the same version either way."""
    one = version(model_service, "1", 0.90, CASSAVA)
    model_service["aliases"][f"{PARENT}@champion"] = model_service["aliases"][one]
    by_number = one.replace("projects/p/", "projects/123456789/")
    moved, why, _ = record(version(model_service, "2", 0.95, CASSAVA), evaluated=by_number)
    assert moved, why


def test_a_refused_evaluation_import_does_not_block_the_promotion(
    model_service: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The alias moves first; the import's refusal is a warning naming the version, returned."""
    model_service["refuse_import"] = True
    two = version(model_service, "2", 0.95, CASSAVA)
    moved, _, imported = record(two, evaluated="")
    assert moved and model_service["aliases"][f"{PARENT}@champion"].version_id == "2"
    assert imported.startswith("refused") and "400" in imported
    assert f"WARNING: Vertex refused the evaluation of {two}" in capsys.readouterr().out


@pytest.mark.parametrize("days_left", [-5, 0, 30])
def test_a_champion_on_a_prebuilt_image_past_or_near_its_end_counts_as_none(
    model_service: dict[str, Any], monkeypatch: pytest.MonkeyPatch, days_left: int
) -> None:
    """A champion nobody can deploy (its prebuilt serving image past its end of availability,
    or within the policy's margin) must not keep the alias: no usable champion, as with files gone."""
    monkeypatch.setattr(servingimage, "prebuilt_days_left", lambda v, today="": ("2027-01-14", days_left))
    model_service["models"]["cassava"] = [aiplatform_v1.Model(name=PARENT)]
    image = "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest"
    model_service["aliases"][f"{PARENT}@champion"] = aiplatform_v1.Model(
        name=PARENT,
        version_id="3",
        artifact_uri=f"gs://{BUCKET}/runs/7/train/model/",
        container_spec=aiplatform_v1.ModelContainerSpec(image_uri=image),
    )
    metrics = {"test_accuracy": 0.91, "class_names": CASSAVA}
    model_service["bucket"].blob("runs/7/train/model/metrics.json").upload_from_string(json.dumps(metrics))
    out = find()
    assert (out.champion_version, out.champion_uri, out.class_names) == (f"{PARENT}@3", "", [])
    monkeypatch.setattr(servingimage, "prebuilt_days_left", lambda v, today="": ("2027-01-14", 31))
    assert find().class_names == CASSAVA  # still deployable past the margin: the champion
    custom = "europe-west4-docker.pkg.dev/p/r/trainer-serving@sha256:" + "0" * 64
    assert servingimage.undeployable(custom) == ""  # the custom serving image has no end date


@pytest.mark.parametrize("name", ['cassava "v2"', "cassava\\v2", "line\nbreak"])
def test_a_name_the_lookup_filter_cannot_hold_is_refused_before_any_work(name: str) -> None:
    with pytest.raises(ValueError, match="model_display_name"):
        registry.check_model_display_name(name)
    with pytest.raises(ValueError, match="model_display_name"):
        find(model_display_name=name)
