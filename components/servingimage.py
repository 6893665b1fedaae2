"""Which image serves a registered model version: Vertex's prebuilt TensorFlow serving images
(the versions that exist and their end of availability), the policy that switches `auto` to the
custom serving image (Dockerfile.serving) before the prebuilt one ends, the warnings before that
end, and the refusal of a version past it (`undeployable`). Plain functions: the registry's
components carry them (`additional_funcs`), the pre-flight calls them."""

from __future__ import annotations

from components.stepimage import multi_region


# Vertex AI's prebuilt TensorFlow 2 prediction images, newest first, with each one's end of
# availability (CPU and GPU alike; docs/facts.md, fact 35): the "End of availability" column of
# https://cloud.google.com/vertex-ai/docs/predictions/pre-built-containers (read 2026-11) and
# https://cloud.google.com/vertex-ai/docs/framework-support-policy. The versions are aiplatform's
# own (`constants/prediction.py`, TF_CONTAINER_URIS). A serving version is only chosen from here,
# never derived from the trainer's TensorFlow: `tf2-cpu.2-21` does not exist.
def prebuilt_tf_serving_table() -> dict[str, str]:
    """{TF version: end of availability (ISO date)}, newest first."""
    older = dict.fromkeys((f"2.{minor}" for minor in range(11, 0, -1)), "2024-11-15")  # 2.11 to 2.1
    return {
        "2.15": "2027-01-14",
        "2.14": "2027-01-14",
        "2.13": "2025-11-28",
        "2.12": "2025-06-30",
        **older,
    }


# The custom serving image (Dockerfile.serving) is TensorFlow Serving, the server Vertex's prebuilt
# TensorFlow images run, at this release (`tensorflow/serving:<version>.0`); the local target
# checks a model under this TensorFlow before registering it with that image (`local.servingenv`).
CUSTOM_SERVING_TF_VERSION = "2.20"


def tf_serving_routes() -> dict[str, str]:
    """The Model's containerSpec routes for TensorFlow Serving's REST API and the model its
    entrypoint (Dockerfile.serving) names `model` (https://www.tensorflow.org/tfx/serving/api_rest)."""
    return {"predict_route": "/v1/models/model:predict", "health_route": "/v1/models/model"}


def servable_folder(base: str) -> str:
    """Where the trainer publishes a model to be registered: version folder `1` of `base`, which
    both TensorFlow Serving (numbered version folders under its base path) and Vertex's prebuilt
    images (saved_model.pb at the top: Google's "Export model artifacts for prediction") load."""
    return base.rstrip("/") + "/1"


def registered_artifact(custom: bool, model_uri: str) -> dict[str, str]:
    """The artifact_uri (Vertex copies it to AIP_STORAGE_URI) and containerSpec routes of the
    SavedModel in `model_uri` (a `servable_folder`): for the custom image (TensorFlow Serving) the
    base above the version folder and its routes, else the folder itself and Vertex's defaults."""
    if not custom:
        return {"artifact_uri": model_uri, "predict_route": "", "health_route": ""}
    base, _, version = model_uri.rstrip("/").rpartition("/")
    if not version.isdigit():
        raise ValueError(
            f"the model {model_uri} is not in a numbered version folder TensorFlow Serving can load"
        )
    return {"artifact_uri": base, **tf_serving_routes()}


def saved_model_folder(artifact_uri: str, predict_route: str) -> str:
    """The SavedModel's folder (with its metrics.json) of a registered version: the inverse of
    `registered_artifact`."""
    if predict_route == tf_serving_routes()["predict_route"]:
        return servable_folder(artifact_uri)
    return artifact_uri.rstrip("/")


PREBUILT_TF_SERVING_VERSIONS = tuple(prebuilt_tf_serving_table())
DEFAULT_SERVING_TF_VERSION = PREBUILT_TF_SERVING_VERSIONS[0]


def serving_policy() -> dict[str, int]:
    """The serving-image policy's margins, in days before a prebuilt image's end: `auto` stops
    choosing it `safe_days` before (leaving a month to deploy and replace), and runs, schedules
    and the upload step warn from `warn_days` before."""
    return {"safe_days": 30, "warn_days": 90}


def prebuilt_days_left(tf_version: str, today: str = "") -> tuple[str, int]:
    """(end of availability, days from `today` (ISO; "": today, UTC) to it) of Vertex's prebuilt
    TF serving image of `tf_version`; ValueError for a version with none."""
    import datetime

    table = prebuilt_tf_serving_table()
    if tf_version not in table:
        raise ValueError(
            f"serving_tf_version {tf_version!r} has no prebuilt Vertex AI TensorFlow serving image; "
            f"prebuilt versions: {', '.join(table)} (or use serving_image=auto or custom)"
        )
    day = datetime.date.fromisoformat(today) if today else datetime.datetime.now(datetime.UTC).date()
    end = table[tf_version]
    return end, (datetime.date.fromisoformat(end) - day).days


def resolve_serving_image(serving_image: str, tf_version: str, today: str = "") -> str:
    """`serving_image` with `auto` decided for a run on `today`: `prebuilt` while Vertex's prebuilt
    image of `tf_version` has more than the policy's `safe_days` left, else `custom`."""
    if serving_image != "auto":
        return serving_image
    _, days = prebuilt_days_left(tf_version, today)
    return "prebuilt" if days > serving_policy()["safe_days"] else "custom"


def serving_image_warnings(serving_image: str, tf_version: str, today: str = "") -> list[str]:
    """What a run (or schedule) on `today` should be told about the prebuilt image's end: nothing
    unless it is within the policy's `warn_days`."""
    import datetime

    if serving_image not in ("auto", "prebuilt") or tf_version not in prebuilt_tf_serving_table():
        return []
    end, days = prebuilt_days_left(tf_version, today)
    policy = serving_policy()
    if days > policy["warn_days"] or days <= 0:
        return []  # far off, or past: then `prebuilt` is refused and `auto` already builds its own
    page = "https://cloud.google.com/vertex-ai/docs/predictions/pre-built-containers"
    head = f"Vertex's prebuilt TensorFlow {tf_version} serving images end on {end} ({days} days from now; {page})"
    switch = datetime.date.fromisoformat(end) - datetime.timedelta(days=policy["safe_days"])
    if serving_image == "prebuilt":
        tail = (
            "a model version registered with one cannot be deployed after that date, and runs with "
            "serving_image=prebuilt are refused from then on; serving_image=auto (the default) "
            "switches to the custom serving image (Dockerfile.serving) in time"
        )
    elif days > policy["safe_days"]:
        tail = (
            f"serving_image=auto registers with it until {switch.isoformat()}, then with the custom "
            "serving image built from Dockerfile.serving (scheduled runs switch by themselves)"
        )
    else:
        tail = "serving_image=auto registers with the custom serving image built from Dockerfile.serving"
    return [f"{head}: {tail}"]


def serving_container_uri(tf_version: str, accelerator: str, location: str, today: str = "") -> str:
    """Vertex's prebuilt TensorFlow serving image of `tf_version`, `accelerator` cpu or gpu, from
    the multi-region nearest `location` (aiplatform's `get_prebuilt_prediction_container_uri`
    takes the region's first word the same way). Refused once its end of availability has come;
    `accelerator` is checked by `choose_serving_image`."""
    end, days = prebuilt_days_left(tf_version, today)
    if days <= 0:
        newest = next(iter(prebuilt_tf_serving_table()))
        raise ValueError(
            f"serving_tf_version {tf_version}: Vertex's prebuilt TensorFlow {tf_version} serving images "
            f"ended on {end} (https://cloud.google.com/vertex-ai/docs/predictions/pre-built-containers): "
            "a model registered with one cannot be deployed. Use serving_image=auto or custom (the "
            f"serving image built from Dockerfile.serving), or a newer prebuilt version (newest: {newest})"
        )
    minor = tf_version.split(".")[1]
    return f"{multi_region(location)}-docker.pkg.dev/vertex-ai/prediction/tf2-{accelerator}.2-{minor}:latest"


def prebuilt_tf_version(image: str) -> str:
    """The TF version ("2.15") of a prebuilt Vertex TF2 serving image URI; "" for any other image."""
    import re

    match = re.match(r"^[a-z]+-docker\.pkg\.dev/vertex-ai/prediction/tf2-(?:cpu|gpu)\.2-(\d+):", image)
    return f"2.{match.group(1)}" if match else ""


def undeployable(image_uri: str, today: str = "") -> str:
    """Why a version served by `image_uri` can no longer hold the champion alias on `today`: a
    prebuilt TF serving image past its end or within `safe_days` of it; "" otherwise."""
    version = prebuilt_tf_version(image_uri)
    if version not in prebuilt_tf_serving_table():
        return ""
    end, days = prebuilt_days_left(version, today)
    safe = serving_policy()["safe_days"]
    if days > safe:
        return ""
    when = (
        f"ended on {end}" if days <= 0 else f"ends on {end}, in {days} days (the policy's margin is {safe})"
    )
    return (
        f"its serving image {image_uri} is Vertex's prebuilt TensorFlow {version} image, which {when}: "
        "it cannot be deployed after that date (https://cloud.google.com/vertex-ai/docs/predictions/"
        "pre-built-containers)"
    )


# What a component needs shipped (`additional_funcs`) to call `undeployable`.
UNDEPLOYABLE_FUNCS = [
    prebuilt_tf_serving_table,
    serving_policy,
    prebuilt_days_left,
    prebuilt_tf_version,
    undeployable,
]


def choose_serving_image(
    serving_image: str,
    tf_version: str,
    accelerator: str,
    location: str,
    custom_image_uri: str,
    today: str = "",
) -> tuple[str, str]:
    """The Model's serving container and why, for `serving_image` `auto`, `prebuilt` (Vertex's TF
    image of `tf_version`, while available), `custom` (the serving image the build step made) or
    a user's image URI. Raises ValueError naming what is allowed."""
    import re

    # `auto` was decided once, by the build step on its date: it built the custom image only when
    # auto chose it. Deciding again here, on this step's date, would raise after the whole GPU run
    # for a run that straddles the switch (a schedule near midnight UTC).
    mode = ("custom" if custom_image_uri else "prebuilt") if serving_image == "auto" else serving_image
    if accelerator not in ("cpu", "gpu"):
        raise ValueError(f"serving accelerator must be cpu or gpu, got {accelerator!r}")
    if mode == "prebuilt":
        image = serving_container_uri(tf_version, accelerator, location, today)
        why = f"Vertex's prebuilt TensorFlow {tf_version} {accelerator.upper()} serving image"
        if tf_version == next(iter(prebuilt_tf_serving_table())):
            why += " (the newest prebuilt one; the trainer's models are tested to serve under it)"
        return image, why + (" (serving_image=auto)" if serving_image == "auto" else "")
    if mode == "custom":
        if not custom_image_uri:
            raise ValueError("serving_image=custom but the build step made no serving image")
        why = f"the custom serving image built from Dockerfile.serving (TensorFlow Serving, its {accelerator} stage)"
        if serving_image == "auto":
            end, _ = prebuilt_days_left(tf_version, today)
            why += f" (serving_image=auto: the prebuilt TensorFlow {tf_version} image ends on {end})"
        return custom_image_uri, why
    # "This URI must identify an image in Artifact Registry or Container Registry" (aiplatform_v1
    # ModelContainerSpec.image_uri); path components and tags as Docker's reference grammar has them.
    host = r"([a-z0-9-]+-docker\.pkg\.dev|([a-z]+\.)?gcr\.io)"
    path = r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*"
    if not re.fullmatch(
        rf"{host}/{path}(:[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}|@sha256:[0-9a-f]{{64}})", serving_image
    ):
        raise ValueError(
            f"serving_image must be auto, prebuilt, custom or an image URI in Artifact Registry or "
            f"Container Registry, as Vertex requires (<region>-docker.pkg.dev/<project>/<repo>/<image>:<tag> "
            f"or @sha256:<digest>; gcr.io/...), got {serving_image!r}"
        )
    version = prebuilt_tf_version(serving_image)
    if version in prebuilt_tf_serving_table():  # Vertex's prebuilt image by its address: its end holds
        end, days = prebuilt_days_left(version, today)
        if days <= 0:
            raise ValueError(
                f"serving_image {serving_image} is Vertex's prebuilt TensorFlow {version} serving image, which "
                f"ended on {end}: a model registered with it cannot be deployed; use serving_image=auto or custom"
            )
    return serving_image, "the serving image given by serving_image"


def check_serving_parameters(
    serving_image: str, tf_version: str, accelerator: str, location: str, today: str = ""
) -> list[str]:
    """The serving parameters checked before any work, as the upload step will on `today`:
    ValueError naming what is wrong and what is allowed; returns `serving_image_warnings`."""
    custom = resolve_serving_image(serving_image, tf_version, today) == "custom"
    built = "<built by the pipeline>" if custom else ""
    choose_serving_image(serving_image, tf_version, accelerator, location, built, today)
    return serving_image_warnings(serving_image, tf_version, today)
