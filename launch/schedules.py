"""Schedules of the compiled pipeline on Vertex AI: `make schedule`, `make schedules`,
`make schedule-pause|resume|delete`, through aiplatform's `PipelineJobSchedule` and kfp's
`RegistryClient` (the template is uploaded to Artifact Registry and the schedule runs that
version).

    python -m launch.schedules schedule [--<parameter> VALUE ...]
        with CRON='0 6 * * 1' [TIMEZONE=Europe/Paris MAX_CONCURRENT=1 START=ISO END=ISO] in the
        environment (or --cron, --timezone, --max_concurrent_runs, --start_time, --end_time)
    python -m launch.schedules schedules | pause [NAME] | resume [NAME] | delete [NAME]
        (NAME=projects/<p>/locations/<region>/schedules/<id> in the environment, or as argument)

make's variables come in the environment, each checked before any request.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from launch import cloud, flags, submit
from launch import settings as settings_mod
from launch.settings import Settings, SettingsError

# Vertex takes a cron with an optional `TZ=<IANA zone> ` prefix (aiplatform's PipelineJobSchedule.create;
# https://cloud.google.com/vertex-ai/docs/pipelines/schedule-pipeline-run), in the unix-cron format of
# https://cloud.google.com/scheduler/docs/configuring/cron-job-schedules.
MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
WEEKDAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
CRON_FIELDS: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, MONTHS),
    ("day of week", 0, 7, WEEKDAYS),  # 0 and 7 are Sunday
)
CRON_USAGE = (
    "CRON='<minute> <hour> <day of month> <month> <day of week>', e.g. CRON='0 6 * * 1' (Mondays, 06:00)"
)
# A schedule's resource name (aiplatform_v1 ScheduleServiceClient.schedule_path).
SCHEDULE_NAME = re.compile(r"projects/[a-z0-9-]+/locations/[a-z0-9-]+/schedules/[A-Za-z0-9_-]+")
SCHEDULE_NAME_USAGE = (
    "NAME=projects/<project>/locations/<region>/schedules/<id> (`make schedules` lists them)"
)


def _cron_value(text: str, low: int, high: int, names: tuple[str, ...]) -> int | None:
    if re.fullmatch(r"[0-9]{1,2}", text):
        value = int(text)
    elif text.upper() in names:
        value = names.index(text.upper()) + low
    else:
        return None
    return value if low <= value <= high else None


def _cron_field_ok(field: str, low: int, high: int, names: tuple[str, ...]) -> bool:
    for item in field.split(","):
        span, slash, step = item.partition("/")
        if slash and not (re.fullmatch(r"[0-9]{1,2}", step) and int(step) >= 1):
            return False
        if span == "*":
            continue
        first, dash, last = span.partition("-")
        start = _cron_value(first, low, high, names)
        if start is None or (slash and not dash):  # a step follows `*` or a range
            return False
        if dash:
            end = _cron_value(last, low, high, names)
            if end is None or end < start:
                return False
    return True


def check_cron(cron: str) -> str:
    """CRON: five unix-cron fields; returns them joined by single spaces."""
    if not cron.strip():
        raise ValueError(f"CRON is not set: {CRON_USAGE}")
    if cron.strip().upper().startswith(("TZ=", "CRON_TZ=")):
        raise ValueError(f"CRON={cron!r}: give the time zone as TIMEZONE=<IANA time zone>, not in CRON")
    if re.search(r"[^ -~]", cron):
        raise ValueError(f"CRON={cron!r} has a newline, tab or other non-printing character: {CRON_USAGE}")
    fields = cron.split()
    if len(fields) != 5:
        raise ValueError(
            f"CRON must have five fields (minute hour day month weekday), got {cron!r}: {CRON_USAGE}"
        )
    bad = [
        f"{name} {field!r} (expected {low}-{high}{', ' + names[0] + '-' + names[-1] if names else ''})"
        for field, (name, low, high, names) in zip(fields, CRON_FIELDS, strict=True)
        if not _cron_field_ok(field, low, high, names)
    ]
    if bad:
        raise ValueError(
            f"CRON={cron!r} is not a unix-cron expression: {'; '.join(bad)}. Each field takes *, a value, "
            "a range a-b, a step */n or a-b/n, or a list of these (a,b,c)"
        )
    return " ".join(fields)


def check_timezone(timezone: str) -> str:
    """TIMEZONE: empty (the schedule's cron is read in UTC), or an IANA time zone name."""
    if not timezone:
        return ""
    # The tzdata package's zones (a dependency: the machine's database may be missing, and adds
    # names that are no IANA zone: localtime, posixrules, Factory).
    import importlib.resources

    listing = importlib.resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    known = set(listing.split()) - {"Factory", "localtime", "posixrules"}
    if timezone in known:
        return timezone
    close = difflib.get_close_matches(timezone, sorted(known), n=3)
    raise ValueError(
        f"TIMEZONE={timezone!r} is not an IANA time zone name (e.g. Europe/Paris, America/New_York, "
        f"UTC; the tz database here has {len(known)})" + (f"; closest: {', '.join(close)}" if close else "")
    )


def check_timestamp(name: str, text: str) -> str | None:
    """START or END: an ISO-8601 timestamp with a UTC offset; returned in UTC as RFC 3339, the
    JSON form of the Schedule's start_time/end_time (protobuf Timestamps), or None when empty."""
    if not text:
        return None
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{name}={text!r} is not an ISO-8601 timestamp: expected e.g. 2026-12-01T06:00:00Z or "
            "2026-12-01T07:00:00+01:00"
        ) from None
    if when.tzinfo is None:
        raise ValueError(
            f"{name}={text!r} has no UTC offset: add Z (UTC) or +HH:MM, e.g. {when.isoformat()}Z"
        )
    try:
        return when.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z")
    except OverflowError:  # 9999-12-31T23:00:00-05:00 is past the last day Python (and protobuf) hold
        raise ValueError(f"{name}={text!r} is out of range: give a date from year 1 to 9999 in UTC") from None


def check_max_concurrent(value: int | str) -> int:
    """MAX_CONCURRENT: how many of the schedule's runs may run at once, an integer >= 1."""
    text = str(value)
    if not re.fullmatch(r"[0-9]{1,9}", text) or int(text) < 1:
        raise ValueError(
            f"MAX_CONCURRENT={text!r} is not valid: expected an integer >= 1 (how many of the "
            "schedule's runs may run at once)"
        )
    return int(text)


def check_schedule_name(name: str) -> str:
    """NAME of `make schedule-pause|resume|delete`: a schedule's full resource name."""
    if not name:
        raise ValueError(f"NAME is not set: {SCHEDULE_NAME_USAGE}")
    if not SCHEDULE_NAME.fullmatch(name):
        raise ValueError(f"NAME={name!r} is not a schedule's resource name: expected {SCHEDULE_NAME_USAGE}")
    return name


@dataclasses.dataclass(frozen=True)
class ScheduleOptions:
    cron: str
    timezone: str = ""
    max_concurrent_runs: int = 1
    start_time: str | None = None
    end_time: str | None = None


def schedule_options(
    cron: str,
    timezone: str = "",
    max_concurrent: int | str = 1,
    start: str | None = None,
    end: str | None = None,
) -> ScheduleOptions:
    """Every schedule variable checked; raises ValueError naming each bad one, one per line."""
    problems: list[str] = []
    checked: dict[str, Any] = {}
    checks = {
        "cron": lambda: check_cron(cron),
        "timezone": lambda: check_timezone(timezone),
        "max_concurrent_runs": lambda: check_max_concurrent(max_concurrent),
        "start_time": lambda: check_timestamp("START", start or ""),
        "end_time": lambda: check_timestamp("END", end or ""),
    }
    for key, check in checks.items():
        try:
            checked[key] = check()
        except ValueError as err:
            problems.append(str(err))
    begin, finish = checked.get("start_time"), checked.get("end_time")
    if begin and finish and datetime.datetime.fromisoformat(finish) <= datetime.datetime.fromisoformat(begin):
        problems.append(f"END={end!r} is not after START={start!r}")
    if problems:
        raise ValueError("\n".join(problems))
    return ScheduleOptions(**checked)


def template_yaml(template: Path, folder: Path) -> Path:
    """The compiled template as `folder/<name>.yaml`, as kfp's compiler writes one
    (`pipeline_spec_builder.write_pipeline_spec_to_file`: `extract_comments_from_pipeline_spec`'s
    header, then `yaml.dump_all([spec], sort_keys=True)`), from the JSON, not a protobuf round trip
    (its map order may vary): same template, same digest. Parsed strictly into a `PipelineSpec`
    first: a field kfp does not know fails before any upload."""
    import yaml
    from google.protobuf import json_format
    from kfp.compiler import pipeline_spec_builder
    from kfp.pipeline_spec import pipeline_spec_pb2

    document = json.loads(template.read_text())
    json_format.ParseDict(document, pipeline_spec_pb2.PipelineSpec())
    header = pipeline_spec_builder.extract_comments_from_pipeline_spec(
        document, document.get("pipelineInfo", {}).get("description") or None
    )
    out = folder / f"{template.stem}.yaml"
    out.write_text(header + yaml.dump_all([document], sort_keys=True))
    return out


def upload_template(
    settings: Settings, template: Path, commit: str = "", auth: Any = None, host: str = ""
) -> str:
    """Uploads the compiled template to Artifact Registry, tagged with the commit and `latest`;
    returns the version's URI (under TEMPLATE_REPOSITORY; `host`: elsewhere, for tests). As
    https://cloud.google.com/vertex-ai/docs/pipelines/create-pipeline-template documents: a YAML
    file posted by kfp's `RegistryClient.upload_pipeline`, answered `<package>/sha256:<digest>`
    (kfp: "Compiling to JSON is deprecated"), so the JSON is rewritten as YAML (`template_yaml`)."""
    import tempfile

    from kfp.registry import RegistryClient

    import pipeline

    client = RegistryClient(host=host or settings.template_repository, auth=auth)
    # Both templates are one package: `<commit>` and `latest` name the one without the e-mail handler.
    suffix = "-notify" if template.name == pipeline.COMPILED_NOTIFY.name else ""
    tags = [t + suffix for t in (commit[:40], "latest") if t]  # never -dirty: `submit.prepare` refuses it
    with tempfile.TemporaryDirectory() as folder:
        package, version = client.upload_pipeline(
            file_name=str(template_yaml(template, Path(folder))), tags=tags
        )
    uri = f"{settings.template_repository.rstrip('/')}/{package}/{version}"
    print(f"template {uri} (tags: {', '.join(tags)})")
    return uri


def create_schedule(
    settings: Settings,
    given: Mapping[str, Any],
    *,
    cron: str,
    timezone: str = "",
    max_concurrent_runs: int = 1,
    start_time: str | None = None,
    end_time: str | None = None,
    credentials: Any = None,
    transport: str | None = None,
    registry_auth: Any = None,
    registry_host: str = "",
    root: Path = submit.ROOT,
) -> Any:
    """A Vertex pipeline schedule of the template version pinned to this commit."""
    from google.cloud import aiplatform

    options = schedule_options(cron, timezone, max_concurrent_runs, start_time, end_time)
    if not settings.template_repository:  # before the build context is uploaded
        raise SettingsError(f"TEMPLATE_REPOSITORY is not set: {settings_mod.SETTINGS['TEMPLATE_REPOSITORY']}")
    template, values, commit = submit.prepare(settings, given, root, credentials, transport, pinned=True)
    writer = f"roles/artifactregistry.writer on {settings.template_repository}"
    registry = ("Artifact Registry", registry_host or settings.template_repository, "")
    # kfp's RegistryClient and aiplatform's read-back set no timeout: a host that never answers
    # would hang here, so it is probed first, as the context's bucket is.
    cloud.reach(registry)
    with (
        cloud.reaching("the template's upload", registry),
        cloud.refused_as(f"the template's upload to {settings.template_repository}", writer, settings),
    ):
        template_uri = upload_template(settings, template, commit, registry_auth, registry_host)
    with (
        cloud.reaching("reading the template back", registry),
        cloud.refused_as(f"reading the template back from {settings.template_repository}", writer, settings),
    ):
        job = submit.build_pipeline_job(settings, values, template_uri)
    schedule = aiplatform.PipelineJobSchedule(
        pipeline_job=job, display_name=f"multiworker-cassava-training-{commit[:8]}"
    )
    # PipelineJobSchedule copies some of the job's fields into the runs it asks for
    # (aiplatform/pipeline_job_schedules.py); preflight validation, which PipelineJob.submit sets
    # for `make run`, is set there too. Whether Vertex then validates each scheduled run, only a
    # real schedule shows. No schedule can record its runs in an experiment: said, not dropped.
    if settings.preflight_validations:
        # The request as built, before creation (the public `gca_resource` exists only after it).
        schedule._gca_resource.create_pipeline_job_request.pipeline_job.preflight_validations = True
    if settings.experiment:
        print(
            f"warning: EXPERIMENT={settings.experiment} applies to make run only: Vertex schedules "
            "cannot record their runs in an experiment",
            file=sys.stderr,
        )
    with cloud.calling_vertex(
        "the schedule's creation", settings, "; the schedule was not created", "the schedule"
    ):
        schedule.create(
            cron=f"TZ={options.timezone} {options.cron}" if options.timezone else options.cron,
            max_concurrent_run_count=options.max_concurrent_runs,
            start_time=options.start_time,
            end_time=options.end_time,
            service_account=settings.service_account or None,
            network=settings.network or None,
        )
    print(f"created schedule {schedule.resource_name}")
    return schedule


def schedule_command(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> int:
    """`python -m launch.schedules ...` (module docstring); returns the exit status."""
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    action, rest = argv[0], list(argv[1:])
    if action == "schedule":
        return _schedule(rest, environ)
    prog = "make schedules" if action == "schedules" else f"make schedule-{action}"  # pause, resume, delete
    if action == "schedules" and not rest:
        name = ""
    elif action in ("pause", "resume", "delete") and len(rest) <= 1:
        try:
            name = check_schedule_name(rest[0] if rest else environ.get("NAME", ""))
        except ValueError as err:
            print(f"{prog}: {err}", file=sys.stderr)
            return 2
    else:
        print(
            f"unknown schedule command {' '.join(argv)!r}; use schedule, schedules, pause NAME, resume NAME or delete NAME",
            file=sys.stderr,
        )
        return 2
    settings = submit.load_settings(prog, lambda: settings_mod.load(environ))
    if settings is None:
        return 2

    def request() -> int:
        from google.cloud import aiplatform

        submit.init_aiplatform(settings)
        with cloud.calling_vertex(f"{prog}'s request", settings, out=sys.stderr):  # stdout is the listing
            if action == "schedules":
                for s in aiplatform.PipelineJobSchedule.list():
                    state = s.state.name if s.state is not None else "?"
                    print(f"{s.resource_name}  {s.display_name}  {state}  cron={s.cron!r}")
                return 0
            schedule = aiplatform.PipelineJobSchedule.get(name)
            getattr(schedule, action)()
        print(f"{'paused' if action == 'pause' else action + 'd'} {schedule.resource_name}")
        return 0

    return submit.exit_status(prog, request)


def _schedule(rest: Sequence[str], environ: Mapping[str, str]) -> int:
    """`make schedule`: the variables and flags checked, then the settings, then the requests."""
    import pipeline

    parser = flags.build_parser(pipeline.parameters_for("vertex"))
    parser.prog = "make schedule CRON=..."
    # Each ScheduleOptions field's flag and make variable.
    fields = [f.name for f in dataclasses.fields(ScheduleOptions)]
    variables = dict(zip(fields, ("CRON", "TIMEZONE", "MAX_CONCURRENT", "START", "END"), strict=True))
    for flag, variable in variables.items():
        default = environ.get(variable) or ("1" if variable == "MAX_CONCURRENT" else "")
        parser.add_argument(f"--{flag}", default=default, help=f"default: {variable}")
    ns = parser.parse_args(rest)
    try:
        options = schedule_options(*(getattr(ns, flag) for flag in variables))
    except ValueError as err:
        print(f"make schedule: {err}", file=sys.stderr)
        return 2
    settings = submit.load_settings("make schedule", lambda: settings_mod.load(environ))
    if settings is None:
        return 2

    def request(given: dict[str, Any]) -> int:
        create_schedule(settings, given, **dataclasses.asdict(options))
        return 0

    return submit.with_flags("make schedule", ns, request)


if __name__ == "__main__":
    sys.exit(schedule_command(sys.argv[1:]))
