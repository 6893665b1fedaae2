"""One CMEK rule, two doors: the KMS_KEY setting (`launch.settings.load`) and the pipeline
parameter `encryption_spec_key_name` (`pipeline.options.check`, which `make run` and
`make schedule` apply to the run's values) give the same verdict in the same words, because both
call `pipeline.options.jobs.kms_key_problem`. Vertex: "The Cloud KMS key must be in the same region
as the resource" (aiplatform_v1 `EncryptionSpec`), so `global` and multi-region keys (`us`,
`europe`) are refused even over a region inside them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import pipeline
from launch import settings
from pipeline import options
from pipeline.options import jobs as job_rules


def key(location: str) -> str:
    return f"projects/p-proj/locations/{location}/keyRings/ring/cryptoKeys/key"


def settings_verdict(kms_key: str, region: str) -> str:
    """The KMS_KEY line of the settings' refusal (without `KMS_KEY=<value> is not valid: `), or ""."""
    environ = {
        "PROJECT_ID": "p-proj",
        "REGION": region,
        "PIPELINE_ROOT": "gs://p-proj-pipelines/root",
        "ARTIFACT_REPOSITORY": f"{region}-docker.pkg.dev/p-proj/training",
        "KMS_KEY": kms_key,
    }
    try:
        settings.load(environ, Path("/nonexistent"))
    except settings.SettingsError as err:
        prefix = f"KMS_KEY={kms_key!r} is not valid: "
        lines = str(err).splitlines()
        assert all(line.startswith(prefix) for line in lines), lines  # nothing else is wrong
        [line] = lines
        return line.removeprefix(prefix)
    return ""


def parameter_verdict(kms_key: str, region: str) -> str:
    """The encryption_spec_key_name problem of `options.check` for a Vertex run in `region`, or ""."""
    values: dict[str, Any] = {q.name: q.default_for("vertex") for q in pipeline.parameters_for("vertex")}
    values.update(
        project="p-proj",
        location=region,
        context_uri="gs://b/c.tgz",
        artifact_repository=f"{region}-docker.pkg.dev/p-proj/training",
        encryption_spec_key_name=kms_key,
    )
    try:
        options.check(values, "vertex", region)
    except options.OptionsError as err:
        # (the default GPUs may be missing from the region: only the key's problem is compared)
        found = [p.message for p in err.problems if "encryption_spec_key_name" in p.parameters]
        assert len(found) <= 1, found
        return found[0] if found else ""
    return ""


FORM = "projects/<project>/locations/{}/keyRings/<ring>/cryptoKeys/<key>"
CASES = [
    # (key, region, refused?, words the refusal must hold)
    (key("us-central1"), "us-central1", False, ()),
    (key("europe-west4"), "europe-west4", False, ()),
    (key("europe-west4"), "us-central1", True, ("the key is in europe-west4;", FORM.format("us-central1"))),
    (key("global"), "us-central1", True, ("in global (a global key)", "global and multi-region keys")),
    (key("us"), "us-central1", True, ("in us (a multi-region)", FORM.format("us-central1"))),
    (key("europe"), "europe-west4", True, ("in europe (a multi-region)", FORM.format("europe-west4"))),
    (key("asia"), "asia-east1", True, ("in asia (a multi-region)",)),
    ("my-key", "us-central1", True, (f"must be {FORM.format('us-central1')}, got 'my-key'",)),
]


@pytest.mark.parametrize(("kms_key", "region", "is_refused", "words"), CASES)
def test_the_setting_and_the_parameter_agree(
    kms_key: str, region: str, is_refused: bool, words: tuple[str, ...]
) -> None:
    from_settings, from_parameter = settings_verdict(kms_key, region), parameter_verdict(kms_key, region)
    assert from_settings == from_parameter == job_rules.kms_key_problem(kms_key, region)
    assert bool(from_settings) is is_refused
    for word in words:
        assert word in from_settings, (word, from_settings)
