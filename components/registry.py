"""Step 7, the Model Registry: one model, a new version per run, and a `champion` alias that
moves only when the gate passes.

Vertex: `find_champion` by display name, GCPC's `ModelUploadOp`, then the gate
(`evaluation.evaluate_model`) writes its figures on the version and moves the alias
(`record_on_version`); local: `local.steps`, in a folder (docs/architecture.md#the-dag).

A model is only ever compared with, and may only replace, a champion trained for the same task:
the same class names in the same order (`task_mismatch`). Otherwise a one-class folder, whose
test accuracy is trivially 1.0, would take the alias from a five-class champion.
"""

from typing import NamedTuple

from kfp import dsl

from components import stepimage
from components.servingimage import (
    UNDEPLOYABLE_FUNCS,
    choose_serving_image,
    prebuilt_days_left,
    prebuilt_tf_serving_table,
    prebuilt_tf_version,
    registered_artifact,
    saved_model_folder,
    servable_folder,
    serving_container_uri,
    serving_image_warnings,
    serving_policy,
    tf_serving_routes,
    undeployable,
)
from components.stepimage import multi_region

# The keys of the champion's metrics.json `find_champion` reads (checked as evaluation.METRICS_READ).
METRICS_READ = ("test_accuracy", "class_names")


def check_model_display_name(name: str) -> str:
    """Vertex's rule for a Model's display name (aiplatform_v1 `Model.display_name`): required, at
    most 128 characters, any UTF-8. Raises ValueError naming the rule."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("model_display_name is required (Vertex: up to 128 characters of any UTF-8)")
    if len(name) > 128:
        raise ValueError(f"model_display_name has {len(name)} characters; Vertex allows at most 128")
    # find_champion filters on `display_name="<name>"` (AIP-160 string literal); Google documents no
    # escape for Vertex's filters, so a `"` or `\` is refused rather than matching the wrong models.
    bad = sorted({c for c in name if c in '"\\' or ord(c) < 32})
    if bad:
        raise ValueError(
            f"model_display_name may not contain {bad}: the registry lookup filters on the name in "
            'double quotes (display_name="..."); use any other characters (Vertex allows any UTF-8)'
        )
    return name


def task_mismatch(class_names: list, champion_class_names: list, model_display_name: str = "") -> str:
    """Why a model trained on `class_names` may be neither compared with nor replace the champion
    trained on `champion_class_names` (`[]`: none); "" when it may."""
    new = [str(c) for c in class_names]
    old = [str(c) for c in champion_class_names]
    if not old or new == old:
        return ""
    if sorted(new) == sorted(old):
        how = "the same class names in another order (a label index would mean another class)"
    else:
        how = f"{len(new)} class(es) against the champion's {len(old)}"
        missing, extra = sorted(set(old) - set(new)), sorted(set(new) - set(old))
        if missing or extra:
            how += f"; missing {missing}, extra {extra}"
    model = f" of {model_display_name!r}" if model_display_name else ""
    return (
        f"this run's dataset has the classes {new} but the champion{model} was trained on {old}: "
        f"{how}. A model may only be compared with, and replace, a champion trained for the same "
        "task (the same class names in the same order). To train for a different task, use another "
        "model_display_name; to retrain this one, use a dataset with the champion's classes."
    )


def registry_folder(name: str) -> str:
    """A model's folder for its display name (local registry; Vertex, under `model_root`): every
    character but ASCII letters, digits, `_` and `-` as %XX of its UTF-8 bytes, so no name (`..`,
    `a/b`) leaves the folder and two names never share one. An encoding over 240 bytes (a file
    name has at most 255) keeps its first 200 bytes, cut between characters, then `~` and 16 hex
    digits of the name's SHA-256."""
    import hashlib

    check_model_display_name(name)
    safe = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
    parts = [c if c in safe else "".join(f"%{b:02X}" for b in c.encode()) for c in name]
    folder = "".join(parts)
    if len(folder) <= 240:
        return folder
    head = ""
    for part in parts:
        if len(head) + len(part) > 200:
            break
        head += part
    return f"{head}~{hashlib.sha256(name.encode()).hexdigest()[:16]}"


def label_value(value: str) -> str:
    """A string as a Vertex label value: lowercase letters ("International characters are
    allowed": aiplatform_v1 `Model.labels`), digits, _ and -, at most 63; any other character -."""
    ok = [c if (c.isalpha() and not c.isupper()) or c.isdigit() or c in "_-" else "-" for c in value.lower()]
    return "".join(ok)[:63]


@dsl.component(
    base_image=stepimage.BASE_IMAGE,
    install_kfp_package=False,
    additional_funcs=[
        prebuilt_tf_serving_table,
        serving_policy,
        prebuilt_days_left,
        serving_image_warnings,
        multi_region,
        serving_container_uri,
        prebuilt_tf_version,
        choose_serving_image,
        tf_serving_routes,
        registered_artifact,
        label_value,
    ],
)
def upload_settings(
    location: str,
    serving_image: str,
    tf_version: str,
    serving_accelerator: str,
    custom_image_uri: str,
    model_uri: str,
    labels: dict,
    source_commit: str,
    pipeline_run: str,
) -> NamedTuple(
    "Outputs", serving_image=str, artifact_uri=str, predict_route=str, health_route=str, labels=dict
):
    """The Model's serving image (`choose_serving_image`), its artifact and routes
    (`registered_artifact`) and labels: `labels` plus the pipeline run and the commit."""
    import collections

    # `auto` as the build step decided it (see `choose_serving_image`).
    decided = ("custom" if custom_image_uri else "prebuilt") if serving_image == "auto" else serving_image
    if decided == "prebuilt":
        for warning in serving_image_warnings(serving_image, tf_version):
            print(f"WARNING: {warning}")
    image, why = choose_serving_image(
        serving_image, tf_version, serving_accelerator, location, custom_image_uri
    )
    artifact = registered_artifact(decided == "custom", model_uri)
    merged = {label_value(k): label_value(str(v)) for k, v in labels.items()}
    merged["pipeline_run"] = label_value(pipeline_run)
    if source_commit:
        merged["source_commit"] = label_value(source_commit)
    # Vertex's label rules (aiplatform_v1 `Model.labels`; Google Cloud's labels doc): keys start
    # with a letter; at most 64 labels on a resource.
    bad = sorted(k for k in merged if not k[:1].isalpha())
    if bad:
        raise ValueError(f"label keys must start with a lowercase letter (Vertex's label rule): {bad}")
    if len(merged) > 64:
        raise ValueError(f"{len(merged)} labels: Vertex allows at most 64 on a model version")
    print(f"serving image {image}: {why}")
    print(
        f"the model: {artifact['artifact_uri']}"
        + (f", routes {artifact['predict_route']}" if artifact["predict_route"] else "")
    )
    print(f"labels {merged}")
    Outputs = collections.namedtuple(
        "Outputs", "serving_image artifact_uri predict_route health_route labels"
    )
    return Outputs(serving_image=image, labels=merged, **artifact)


@dsl.component(
    base_image=stepimage.BASE_IMAGE,
    install_kfp_package=False,
    additional_funcs=[
        check_model_display_name,
        *UNDEPLOYABLE_FUNCS,
        tf_serving_routes,
        servable_folder,
        saved_model_folder,
    ],
)
def find_champion(project: str, location: str, model_display_name: str) -> NamedTuple(
    "Outputs",
    exists=bool,
    resource_name=str,
    resource_uri=str,
    champion_version=str,
    champion_uri=str,
    class_names=list,
):
    """The model named `model_display_name` (the new version's parent) and its `champion` version:
    versioned name, SavedModel folder and class names (from its metrics.json; "", "" and [] when
    the model or champion does not exist yet). Fails when two models share the name."""
    import collections
    import json
    import re

    import google.cloud.storage as storage
    from google.api_core import exceptions
    from google.cloud import aiplatform_v1

    Outputs = collections.namedtuple(
        "Outputs", "exists resource_name resource_uri champion_version champion_uri class_names"
    )
    check_model_display_name(model_display_name)
    endpoint = f"{location}-aiplatform.googleapis.com"
    client = aiplatform_v1.ModelServiceClient(client_options={"api_endpoint": endpoint})
    collection = f"projects/{project}/locations/{location}"
    query = {"parent": collection, "filter": f'display_name="{model_display_name}"'}
    # Exactly this name: to the filter a `*` is a wildcard (AIP-160), matching other models.
    found = [m for m in client.list_models(request=query) if m.display_name == model_display_name]
    if not found:
        print(f"no model named {model_display_name!r} yet: the upload creates it")
        # The upload's parent-model importer needs a URI, and GCPC's upload launcher leaves the
        # parent out when its resourceName is empty (container/v1/model/upload_model/
        # remote_runner.py: `if parent_model_name:`): the models collection, with no name.
        return Outputs(False, "", f"https://{endpoint}/v1/{collection}/models", "", "", [])
    if len(found) > 1:
        names = ", ".join(m.name for m in found)
        raise RuntimeError(
            f"{len(found)} models are named {model_display_name!r} ({names}); rename or delete all but one"
        )
    parent = found[0].name
    uri = f"https://{endpoint}/v1/{parent}"
    try:
        champion = client.get_model(name=f"{parent}@champion")
    except exceptions.NotFound:
        print(f"{parent} has no 'champion' version yet")
        return Outputs(True, parent, uri, "", "", [])
    folder = saved_model_folder(champion.artifact_uri, champion.container_spec.predict_route)
    match = re.match(r"^gs://([^/]+)/(.*?)/?$", folder)
    if not match:
        raise RuntimeError(f"champion {champion.name}@{champion.version_id} has no gs:// artifact_uri")
    version = f"{parent}@{champion.version_id}"
    why = undeployable(champion.container_spec.image_uri)
    if why:
        print(
            f"WARNING: champion {version} cannot be deployed: {why}. This run compares the new model with "
            "no champion, and the new model takes the alias if it passes the gate."
        )
        return Outputs(True, parent, uri, version, "", [])
    blob = storage.Client(project=project).bucket(match.group(1)).blob(f"{match.group(2)}/metrics.json")
    try:
        champion_metrics = json.loads(blob.download_as_bytes())
    except exceptions.NotFound:
        # As the local registry does with a damaged champion (`local.steps.champion_record`).
        print(
            f"WARNING: champion {version}'s files are gone: {folder}/metrics.json does not exist "
            "(deleted, e.g. by a lifecycle rule): this run compares the new model with no champion, and "
            "it takes the alias if it passes the gate. Keep model_root's folder (docs/training.md, "
            "'What may be deleted')."
        )
        return Outputs(True, parent, uri, version, "", [])
    class_names = [str(c) for c in champion_metrics["class_names"]]
    recorded = float(champion_metrics["test_accuracy"])
    print(
        f"{parent}: champion is version {champion.version_id} ({folder}), "
        f"recorded test_accuracy {recorded:.4f} on its own test split, classes {class_names}"
    )
    return Outputs(True, parent, uri, version, f"gs://{match.group(1)}/{match.group(2)}", class_names)


def evaluation_record(evaluated: dict, description: str) -> dict:
    """The new version's aiplatform_v1 `ModelEvaluation` (JSON) from evaluation.json: the
    schema's confusion matrix and log loss, the rest in `metadata`."""
    new = evaluated["models"]["challenger"]
    matrix = new["confusion_matrix"]
    labels = [str(c) for c in matrix["labels"]]
    metrics = {
        "confusionMatrix": {
            "annotationSpecs": [{"id": str(i), "displayName": name} for i, name in enumerate(labels)],
            "rows": [[float(c) for c in row] for row in matrix["matrix"]],
        },
        "logLoss": float(new["loss"]),
    }
    metadata = {
        "evaluation_dataset_type": "tf-record",
        "split": evaluated["split"],
        "dataset_fingerprint": evaluated["dataset_fingerprint"],
        "examples": new["examples"],
        "accuracy": new["accuracy"],
        "macro_f1": new["macro_f1"],
        "per_class": new.get("per_class") or {},
        "gate": description,
        "comparison": evaluated.get("comparison"),
    }
    return {
        "display_name": f"{evaluated['split']} split, dataset {evaluated['dataset_fingerprint'][:19]}",
        # The classification schema GCPC's own import uses (container/_implementation/model_evaluation/
        # import_model_evaluation.py, `PROBLEM_TYPE_TO_SCHEMA_URI`): the console draws its matrix.
        "metrics_schema_uri": "gs://google-cloud-aiplatform/schema/modelevaluation/classification_metrics_1.0.0.yaml",
        "metrics": metrics,
        "metadata": metadata,
    }


def record_on_version(
    location: str,
    name: str,
    description: str,
    labels: dict,
    promote: bool,
    evaluated_champion: str,
    evaluation: dict | None = None,
) -> tuple:
    """(holds the alias, what was done, the evaluation import's outcome): writes `description` and
    `labels` on the uploaded version `name` (`projects/.../models/ID@VERSION`) and, when `promote`,
    moves `champion` and `default` to it if the alias is still on `evaluated_champion` (the version
    the gate compared with, by ID; "": none); otherwise the reason says to run again.

    `default` is what a versionless reference gets (Google's model-alias page); GCPC's ModelUploadOp
    sends no aliases, so Vertex would keep it on version 1 (aiplatform `Model.upload`:
    `_get_true_alias_list`). aiplatform_v1 `UpdateModelRequest`: "supported version-specific fields:
    version_description. Labels are supported"; labels are replaced, so the uploaded ones are kept.
    `evaluation` is imported last (ModelService.ImportModelEvaluation, parent the versioned name, as
    GCPC's own import passes the VertexModel's resourceName); a refusal there only warns."""
    from google.api_core import exceptions
    from google.cloud import aiplatform_v1
    from google.protobuf import field_mask_pb2

    if "@" not in name:
        raise ValueError(f"expected a versioned model name (...@VERSION), got {name!r}")
    parent, _, version_id = name.partition("@")
    region = location or name.split("/locations/")[1].split("/")[0]
    client = aiplatform_v1.ModelServiceClient(
        client_options={"api_endpoint": f"{region}-aiplatform.googleapis.com"}
    )
    version = client.get_model(name=name)
    fields = field_mask_pb2.FieldMask(paths=["version_description", "labels"])
    changes = aiplatform_v1.Model(
        name=name, version_description=description, labels={**version.labels, **labels}
    )
    client.update_model(model=changes, update_mask=fields)
    held, done = False, "champion stays where it is: the gate held this version back"
    if promote:
        try:
            now = client.get_model(name=f"{parent}@champion").version_id
        except exceptions.NotFound:
            now = ""
        compared = evaluated_champion.rpartition("@")[2] if evaluated_champion else ""
        if now in (compared, version_id):
            updated = client.merge_version_aliases(name=name, version_aliases=["champion", "default"])
            held, done = True, f"champion -> {name} (aliases now {sorted(updated.version_aliases)})"
        else:
            done = (
                f"champion stays on {f'version {now}' if now else 'no version'}: it was on "
                f"{f'version {compared}' if compared else 'no version'} when this run's evaluation read "
                "it, and this version was never compared with the champion now; run the pipeline again "
                "to compare them on like-for-like data"
            )
    imported = ""
    if evaluation is not None:
        from google.protobuf import json_format, struct_pb2

        record = aiplatform_v1.ModelEvaluation(
            display_name=evaluation["display_name"],
            metrics_schema_uri=evaluation["metrics_schema_uri"],
            metrics=json_format.ParseDict(evaluation["metrics"], struct_pb2.Value()),
            metadata=json_format.ParseDict(evaluation["metadata"], struct_pb2.Value()),
        )
        try:
            imported = client.import_model_evaluation(parent=name, model_evaluation=record).name
            print(f"evaluation imported onto {name}: {imported}")
        except exceptions.GoogleAPICallError as err:
            imported = f"refused: {err}"
            print(
                f"WARNING: Vertex refused the evaluation of {name} ({err}); the gate's decision stands "
                "and its figures are on the version's description and labels"
            )
    return held, done, imported
