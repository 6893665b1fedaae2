"""The serving image's end of availability: Vertex's prebuilt TensorFlow serving images carry an
end date (Google's prebuilt-containers page); one past it is refused, one within 90 days is warned
about, and the default (`serving_image=auto`) never registers a model with an image that ends
within 30 days: from then on the run builds and registers the custom serving image, so a schedule
created today keeps working past 2027-01-14. Every date here is given, never today's."""

from __future__ import annotations

import datetime

import pytest

from components import registry, servingimage
from pipeline import parameters_for
from pipeline.options import OptionsError, check

END_215 = "2027-01-14"


def day(offset: int, end: str = END_215) -> str:
    return (datetime.date.fromisoformat(end) + datetime.timedelta(days=offset)).isoformat()


def test_every_version_carries_the_pages_end_of_availability() -> None:
    table = servingimage.prebuilt_tf_serving_table()
    assert list(table) == list(servingimage.PREBUILT_TF_SERVING_VERSIONS)
    # The page's rows read (https://cloud.google.com/vertex-ai/docs/predictions/pre-built-containers).
    assert {v: table[v] for v in ("2.15", "2.14", "2.13", "2.12", "2.11", "2.10")} == {
        "2.15": "2027-01-14",
        "2.14": "2027-01-14",
        "2.13": "2025-11-28",
        "2.12": "2025-06-30",
        "2.11": "2024-11-15",
        "2.10": "2024-11-15",
    }
    for end in table.values():
        datetime.date.fromisoformat(end)
    # Newest first, ends never later for an older version.
    ends = list(table.values())
    assert ends == sorted(ends, reverse=True)


@pytest.mark.parametrize(
    ("today", "resolved"),
    [
        (day(-200), "prebuilt"),
        (day(-31), "prebuilt"),
        (day(-30), "custom"),  # the policy's 30 days: a month left to deploy and replace it
        (day(-1), "custom"),
        (day(0), "custom"),
        (day(400), "custom"),
    ],
)
def test_auto_switches_to_the_custom_image_30_days_before_the_end(today: str, resolved: str) -> None:
    assert servingimage.resolve_serving_image("auto", "2.15", today) == resolved
    # Other choices are the user's, taken as given.
    assert servingimage.resolve_serving_image("prebuilt", "2.15", today) == "prebuilt"
    assert servingimage.resolve_serving_image("custom", "2.15", today) == "custom"


def test_a_prebuilt_image_past_its_end_is_refused_with_the_date() -> None:
    with pytest.raises(
        ValueError, match=r"TensorFlow 2\.15 serving images ended on 2027-01-14.*serving_image=auto or custom"
    ):
        servingimage.serving_container_uri("2.15", "cpu", "us-central1", today=END_215)
    with pytest.raises(ValueError, match=r"ended on 2025-11-28"):
        servingimage.choose_serving_image("prebuilt", "2.13", "cpu", "us-central1", "", today="2026-11-24")
    # The day before, it is still served.
    uri = servingimage.serving_container_uri("2.15", "gpu", "europe-west4", today=day(-1))
    assert uri == "europe-docker.pkg.dev/vertex-ai/prediction/tf2-gpu.2-15:latest"
    # The same image given by its address ends on the same day.
    assert servingimage.choose_serving_image(uri, "2.20", "gpu", "europe-west4", "", today=day(-1))[0] == uri
    with pytest.raises(ValueError, match=r"^serving_image .*ended on 2027-01-14"):
        servingimage.choose_serving_image(uri, "2.20", "gpu", "europe-west4", "", today=END_215)


@pytest.mark.parametrize(
    ("mode", "today", "expected"),
    [
        ("auto", day(-91), []),
        ("auto", day(-90), ["registers with it until 2026-12-15, then with the custom serving image"]),
        ("auto", day(-10), ["serving_image=auto registers with the custom serving image"]),
        ("prebuilt", day(-51), ["51 days from now", "cannot be deployed after that date"]),
        ("prebuilt", day(-91), []),
        ("prebuilt", day(0), []),  # past: refused, not warned about
        ("custom", day(-10), []),
        ("us-docker.pkg.dev/p/r/mine:1", day(-10), []),
    ],
)
def test_warnings_within_90_days(mode: str, today: str, expected: list[str]) -> None:
    warnings = servingimage.serving_image_warnings(mode, "2.15", today)
    assert len(warnings) == (1 if expected else 0), warnings
    for text in expected:
        assert text in warnings[0], warnings
    if warnings:
        assert "2027-01-14" in warnings[0] and "pre-built-containers" in warnings[0]


def test_auto_follows_the_build_steps_decision() -> None:
    """The build step decides once per run (it builds the custom image only then): the upload
    takes the image it built, and otherwise the prebuilt one, even a day later."""
    built = "us-central1-docker.pkg.dev/p/r/trainer-serving@sha256:" + "2" * 64
    image, why = servingimage.choose_serving_image(
        "auto", "2.15", "gpu", "us-central1", built, today=day(-100)
    )
    assert image == built and "ends on 2027-01-14" in why and "gpu stage" in why
    image, why = servingimage.choose_serving_image("auto", "2.15", "cpu", "us-central1", "", today=day(-100))
    assert image.endswith("/tf2-cpu.2-15:latest") and "(serving_image=auto)" in why
    # A run whose build decided `prebuilt` before the switch and uploads after it (a schedule near
    # midnight UTC) registers what its build decided, never decides again after the GPU run.
    image, _ = servingimage.choose_serving_image("auto", "2.15", "cpu", "us-central1", "", today=day(-5))
    assert image.endswith("/tf2-cpu.2-15:latest")


def test_upload_settings_registers_what_the_build_decided_across_the_switch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The build step ran 31 days before the prebuilt image's end (prebuilt: it built no serving
    image), upload-settings runs 29 days before it: the run's one decision stands."""
    monkeypatch.setattr(servingimage, "prebuilt_days_left", lambda v, today="": (END_215, 29))
    out = registry.upload_settings.python_func(
        location="us-central1",
        serving_image="auto",
        tf_version="2.15",
        serving_accelerator="cpu",
        custom_image_uri="",
        model_uri="gs://b/m/1",
        labels={},
        source_commit="",
        pipeline_run="run-1",
    )
    assert out.serving_image == "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest"


def test_the_build_step_and_its_local_form_decide_alike() -> None:
    from local import steps

    for today, custom in ((day(-100), False), (day(-5), True)):
        assert (servingimage.resolve_serving_image("auto", "2.15", today) == "custom") is custom
    out = steps.check_build_context.python_func(
        context_dir=".", repository="us-docker.pkg.dev/p/r", serving_image="custom", reduction_server_count=2
    )
    assert out.serving_image_uri == f"us-docker.pkg.dev/p/r/trainer-serving:{out.tag}"
    assert out.training_image_uri == f"us-docker.pkg.dev/p/r/trainer-reduction-server:{out.tag}"
    plain = steps.check_build_context.python_func(
        context_dir=".", repository="us-docker.pkg.dev/p/r", serving_image="prebuilt"
    )
    assert plain.serving_image_uri == "" and plain.training_image_uri == plain.image_uri


def test_the_default_is_auto_on_both_targets() -> None:
    for target in ("vertex", "local"):
        defaults = {p.name: p.default_for(target) for p in parameters_for(target)}
        assert defaults["serving_image"] == "auto", target


def values(target: str, **overrides: object) -> dict:
    return {**{p.name: p.default_for(target) for p in parameters_for(target)}, **overrides}


def test_the_preflight_refuses_and_warns_as_the_upload_would(monkeypatch: pytest.MonkeyPatch) -> None:
    """`make run` and `make schedule` check the options on their day: monkeypatched here to a
    day 51 days before 2.15's end (as on 2026-11-24), then to the day after it."""
    real = servingimage.prebuilt_days_left
    monkeypatch.setattr(servingimage, "prebuilt_days_left", lambda v, today="": real(v, day(-51)))
    warnings = check(values("local"), "local")
    assert any("registers with it until 2026-12-15" in w for w in warnings), warnings
    warnings = check(values("local", serving_image="prebuilt"), "local")
    assert any("cannot be deployed after that date" in w for w in warnings), warnings
    monkeypatch.setattr(servingimage, "prebuilt_days_left", lambda v, today="": real(v, day(1)))
    assert not [w for w in check(values("local"), "local") if "serving" in w]  # auto: custom, quietly
    with pytest.raises(OptionsError, match=r"serving_tf_version.*ended on 2027-01-14"):
        check(values("local", serving_image="prebuilt"), "local")
    with pytest.raises(OptionsError, match=r"serving_tf_version.*no prebuilt"):
        check(values("local", serving_tf_version="2.21"), "local")
