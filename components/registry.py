"""Step 7, the Model Registry: one model, a new version per run, and a `champion` alias that
moves only when the gate passes.

Vertex form: `find_champion` looks the model up by display name (its parent, when it exists,
and the champion's test accuracy from the metrics.json beside its SavedModel); the pipeline
uploads with GCPC's `ModelUploadOp` from an `UnmanagedContainerModel` (importer) carrying the
prebuilt TensorFlow serving image (`serving_container_uri`); `set_champion` moves the alias.
Local form: `components.local` keeps the same registry shape on disk.
"""

import re
from typing import NamedTuple

from kfp import dsl

from components import runtime


def serving_container_uri(tf_version: str, accelerator: str, location: str) -> str:
    """Vertex's prebuilt TensorFlow serving image for a TF version ("2.21"), "cpu" or "gpu",
    from the Artifact Registry multi-region nearest `location`."""
    import re

    match = re.match(r"^2\.(\d+)(\.\d+)?$", tf_version)
    if not match:
        raise ValueError(f"tf_version must look like 2.N (e.g. 2.21), got {tf_version!r}")
    if accelerator not in ("cpu", "gpu"):
        raise ValueError(f"serving accelerator must be cpu or gpu, got {accelerator!r}")
    area = location.split("-")[0]
    prefix = {"europe": "europe", "asia": "asia", "australia": "asia", "me": "asia"}.get(area, "us")
    return f"{prefix}-docker.pkg.dev/vertex-ai/prediction/tf2-{accelerator}.2-{match.group(1)}:latest"


def label_value(value: str) -> str:
    """A string as a Vertex label value: lowercase letters, digits, _ and -, at most 63."""
    import re

    return re.sub(r"[^a-z0-9_-]", "-", value.lower())[:63]


@dsl.component(
    base_image=runtime.BASE_IMAGE,
    install_kfp_package=False,
    additional_funcs=[serving_container_uri, label_value],
)
def upload_settings(
    location: str,
    tf_version: str,
    serving_accelerator: str,
    serving_image: str,
    labels: dict,
    source_commit: str,
    pipeline_run: str,
) -> NamedTuple("Outputs", serving_image=str, labels=dict):
    """The serving image (`serving_image` when set, else the prebuilt one matching the
    trainer's TF) and the model version's labels: `labels` plus the pipeline run and commit."""
    import collections

    image = serving_image or serving_container_uri(tf_version, serving_accelerator, location)
    merged = {label_value(k): label_value(str(v)) for k, v in labels.items()}
    merged["pipeline_run"] = label_value(pipeline_run)
    if source_commit:
        merged["source_commit"] = label_value(source_commit)
    print(f"serving image {image}; labels {merged}")
    Outputs = collections.namedtuple("Outputs", ["serving_image", "labels"])
    return Outputs(image, merged)


@dsl.component(
    base_image=runtime.BASE_IMAGE,
    install_kfp_package=False,
)
def find_champion(
    project: str, location: str, model_display_name: str, alias: str = "champion"
) -> NamedTuple("Outputs", exists=bool, resource_name=str, resource_uri=str, champion_accuracy=float):
    """The registry's model named `model_display_name` (the parent of the new version) and the
    test accuracy of its `alias` version (-1 when the model or the alias does not exist yet).
    Fails when two models share the name: the parent would be ambiguous."""
    import collections
    import json
    import re

    import google.cloud.storage as storage
    from google.api_core import exceptions
    from google.cloud import aiplatform_v1

    Outputs = collections.namedtuple(
        "Outputs", ["exists", "resource_name", "resource_uri", "champion_accuracy"]
    )
    endpoint = f"{location}-aiplatform.googleapis.com"
    client = aiplatform_v1.ModelServiceClient(client_options={"api_endpoint": endpoint})
    found = list(
        client.list_models(
            request={
                "parent": f"projects/{project}/locations/{location}",
                "filter": f'display_name="{model_display_name}"',
            }
        )
    )
    if not found:
        print(f"no model named {model_display_name!r} yet: the upload creates it")
        return Outputs(False, "", "", -1.0)
    if len(found) > 1:
        names = ", ".join(m.name for m in found)
        raise RuntimeError(
            f"{len(found)} models are named {model_display_name!r} ({names}); rename or delete all but one"
        )
    parent = found[0].name
    uri = f"https://{endpoint}/v1/{parent}"
    try:
        champion = client.get_model(name=f"{parent}@{alias}")
    except exceptions.NotFound:
        print(f"{parent} has no {alias!r} version yet")
        return Outputs(True, parent, uri, -1.0)
    match = re.match(r"^gs://([^/]+)/(.*?)/?$", champion.artifact_uri)
    if not match:
        raise RuntimeError(f"champion {champion.name}@{champion.version_id} has no gs:// artifact_uri")
    blob = storage.Client(project=project).bucket(match.group(1)).blob(f"{match.group(2)}/metrics.json")
    accuracy = float(json.loads(blob.download_as_bytes())["test_accuracy"])
    print(f"{parent}: {alias} is version {champion.version_id}, test_accuracy {accuracy:.4f}")
    return Outputs(True, parent, uri, accuracy)


@dsl.component(base_image=runtime.BASE_IMAGE, install_kfp_package=False)
def set_champion(project: str, location: str, model: dsl.Input[dsl.Artifact], alias: str = "champion") -> str:
    """Moves `alias` to the uploaded version (`model` is ModelUploadOp's VertexModel output,
    whose resourceName is `projects/.../models/ID@VERSION`). Returns that versioned name."""
    from google.cloud import aiplatform_v1

    name = model.metadata["resourceName"]
    if "@" not in name:
        raise ValueError(f"expected a versioned model name (...@VERSION), got {name!r}")
    client = aiplatform_v1.ModelServiceClient(
        client_options={"api_endpoint": f"{location}-aiplatform.googleapis.com"}
    )
    updated = client.merge_version_aliases(name=name, version_aliases=[alias])
    print(f"{alias} -> {name} (aliases now {list(updated.version_aliases)})")
    return name


def tf_version_from_lock(lock_text: str) -> str:
    """The trainer's TensorFlow minor version ("2.21") from uv.lock's text."""
    match = re.search(r'\nname = "tensorflow"\nversion = "(\d+\.\d+)', lock_text)
    if not match:
        raise ValueError("uv.lock pins no tensorflow version")
    return match.group(1)


# --- the local form -------------------------------------------------------------------------
# <registry_dir>/<model>/<version>/model/  the SavedModel (and its metrics.json, config.json)
# <registry_dir>/<model>/<version>/version.json  labels, serving image, metrics, gate, source
# <registry_dir>/<model>/aliases.json  {"default": "1", "champion": "<version>"}


@dsl.component(base_image=runtime.BASE_IMAGE, install_kfp_package=False)
def local_find_champion(registry_dir: str, model_display_name: str, alias: str = "champion") -> NamedTuple(
    "Outputs", exists=bool, resource_name=str, resource_uri=str, champion_accuracy=float
):
    """Local form of `find_champion`, on the local registry folder."""
    import collections
    import json
    import os

    Outputs = collections.namedtuple(
        "Outputs", ["exists", "resource_name", "resource_uri", "champion_accuracy"]
    )
    model_dir = os.path.abspath(os.path.join(registry_dir, model_display_name))
    aliases_path = os.path.join(model_dir, "aliases.json")
    if not os.path.exists(aliases_path):
        print(f"no model {model_display_name!r} in {registry_dir} yet: the upload creates it")
        return Outputs(False, "", "", -1.0)
    with open(aliases_path) as f:
        version = json.load(f).get(alias)
    if version is None:
        print(f"{model_display_name} has no {alias!r} version yet")
        return Outputs(True, model_dir, model_dir, -1.0)
    with open(os.path.join(model_dir, version, "model", "metrics.json")) as f:
        accuracy = float(json.load(f)["test_accuracy"])
    print(f"{model_display_name}: {alias} is version {version}, test_accuracy {accuracy:.4f}")
    return Outputs(True, model_dir, model_dir, accuracy)


@dsl.component(base_image=runtime.BASE_IMAGE, install_kfp_package=False)
def local_upload_model(
    model: dsl.Input[dsl.Model],
    registry_dir: str,
    model_display_name: str,
    serving_image: str,
    labels: dict,
    promote: bool,
    gate_reason: str,
) -> NamedTuple("Outputs", version=str, path=str, champion=bool):
    """Local form of `ModelUploadOp` + `set_champion`: checks that the SavedModel serves
    (`python -m trainer.serve`, its `serving_default` on test images), then registers it as the
    next version of `model_display_name` and moves the champion alias when `promote`."""
    import collections
    import fcntl
    import json
    import os
    import shutil
    import subprocess
    import sys
    import time

    check = subprocess.run(
        [sys.executable, "-m", "trainer.serve", "--model_dir", model.path],
        capture_output=True,
        text=True,
        check=False,
    )
    if check.returncode != 0:
        raise RuntimeError(f"the model in {model.path} does not serve: {check.stderr.strip()[-2000:]}")
    answers = [json.loads(line) for line in check.stdout.splitlines() if line.startswith("{")]
    print(
        f"serving check: {len(answers)} test images answered, e.g. {answers[0]['image']} -> {answers[0]['class_name']}"
    )

    root = os.path.abspath(os.path.join(registry_dir, model_display_name))
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two local runs never get the same version
        versions = [int(v) for v in os.listdir(root) if v.isdigit()]
        version = str(max(versions, default=0) + 1)
        staging = os.path.join(root, f".{version}.partial")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(model.path, os.path.join(staging, "model"))
        with open(os.path.join(model.path, "metrics.json")) as f:
            metrics = json.load(f)
        record = {
            "model": model_display_name,
            "version": version,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "source_uri": model.uri,
            "serving_image": serving_image,
            "labels": labels,
            "test_accuracy": metrics["test_accuracy"],
            "gate": {"promoted": promote, "reason": gate_reason},
            "serving_check": answers,
        }
        with open(os.path.join(staging, "version.json"), "w") as f:
            json.dump(record, f, indent=1)
        os.rename(staging, os.path.join(root, version))
        aliases_path = os.path.join(root, "aliases.json")
        aliases = {}
        if os.path.exists(aliases_path):
            with open(aliases_path) as f:
                aliases = json.load(f)
        aliases.setdefault("default", version)
        if promote:
            aliases["champion"] = version
        with open(aliases_path + ".tmp", "w") as f:
            json.dump(aliases, f, indent=1)
        os.replace(aliases_path + ".tmp", aliases_path)
    where = os.path.join(root, version)
    print(
        f"registered {model_display_name} version {version} at {where}" + (" (champion)" if promote else "")
    )
    Outputs = collections.namedtuple("Outputs", ["version", "path", "champion"])
    return Outputs(version, where, promote)
