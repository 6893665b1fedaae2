"""How this machine talks to Google Cloud: each service named and tried once, within seconds,
before its first use (`reach`), a network failure of the client libraries afterwards turned into
one line (`reaching`, `GoogleUnreachable`: what could not be reached, where, why, and the likely
causes), and a 403 into the role of
docs/vertex.md#the-iam-roles-a-first-run-needs that grants what was refused (`refused_as`,
`GoogleRefused`)."""

from __future__ import annotations

import contextlib
import re
import socket
import sys
import threading
import urllib.error
import urllib.parse
from collections.abc import Iterator
from typing import Any

from launch.settings import Settings


class GoogleRefused(RuntimeError):
    """A 403 from Google Cloud: the request, the role that grants it, and Google's own words.
    Raised from the original error: its traceback is shown (exit code 1)."""


# A permission named in Google's 403 (e.g. "Permission 'aiplatform.pipelineJobs.create' denied",
# "does not have storage.objects.create access", "iam.serviceAccounts.actAs"), not a host name.
_PERMISSION = re.compile(r"\b(aiplatform|storage|iam|artifactregistry)\.(?!googleapis\b)[A-Za-z]+\.[A-Za-z]+")


def missing_role(text: str, settings: Settings, default: str) -> str:
    """The role (and where) holding the permission Google's 403 `text` names, as
    docs/vertex.md#the-iam-roles-a-first-run-needs lists it; `default` when it names none."""
    runs_as = settings.service_account or (
        "the Compute Engine default service account (<project number>-compute@developer.gserviceaccount.com), "
        "which the pipeline runs as when SERVICE_ACCOUNT is unset"
    )
    found = _PERMISSION.search(text)
    permission = found.group(0) if found else ""
    if permission == "iam.serviceAccounts.actAs" or "act as service account" in text.lower():
        return f"roles/iam.serviceAccountUser on {runs_as}"
    if permission == "storage.buckets.get":
        return f"roles/storage.legacyBucketReader on gs://{settings.bucket}"
    if permission.startswith("storage."):
        return f"roles/storage.objectAdmin on gs://{settings.bucket}"
    if permission.startswith("aiplatform."):
        return f"roles/aiplatform.user in project {settings.project}"
    if permission.startswith("artifactregistry."):
        return f"roles/artifactregistry.writer on {settings.template_repository}"
    return default


@contextlib.contextmanager
def refused_as(request: str, default_role: str, settings: Settings) -> Iterator[None]:
    """Turns a 403 of Google's client libraries during `request` into GoogleRefused: api_core's
    Forbidden (PermissionDenied is one; storage and aiplatform raise them), requests' HTTPError
    (kfp's RegistryClient) and urllib's (aiplatform reading a template from Artifact Registry)."""
    import requests
    from google.api_core import exceptions

    try:
        yield
    except (exceptions.Forbidden, requests.HTTPError, urllib.error.HTTPError) as err:
        status = getattr(getattr(err, "response", None), "status_code", None) or getattr(err, "code", None)
        if not isinstance(err, exceptions.Forbidden) and status != 403:
            raise
        cause = next((why for pattern, why in _NOT_A_ROLE if pattern.search(str(err))), "")
        if not cause:
            role = missing_role(str(err), settings, default_role)
            cause = (
                f"the account running make needs {role}; docs/vertex.md#the-iam-roles-a-first-run-needs "
                "lists every role a first run needs"
            )
        raise GoogleRefused(
            f"Google Cloud refused {request} (403): {cause}. Google said: {said(err, 400)}"
        ) from err


# 403s that no role mends: the API off in the project (a first run's usual one), a VPC Service
# Controls perimeter, billing disabled (Google's ErrorInfo reasons and their texts).
_NOT_A_ROLE = (
    (
        re.compile(r"SERVICE_DISABLED|has not been used in project \S+ before or it is disabled"),
        (
            "the API is not enabled in the project: enable it (`gcloud services enable <the service Google "
            "names>`), wait a few minutes, and run again"
        ),
    ),
    (
        re.compile(r"VPC Service Controls|vpcServiceControls|SECURITY_POLICY_VIOLATED"),
        (
            "a VPC Service Controls perimeter refused it: run from inside the perimeter, or have its "
            "owner allow this access"
        ),
    ),
    (
        re.compile(r"BILLING_DISABLED|billing (account )?(is )?disabled", re.IGNORECASE),
        "billing is disabled in the project: enable it (Cloud console, Billing)",
    ),
)


class GoogleUnreachable(RuntimeError):
    """Google Cloud not reached, or no answer: one line (service, host, why, likely causes),
    printed without a traceback (exit code 1)."""


# How long the first contact with a service may take: its connection, then its answer.
PROBE_SECONDS = 5.0
LIKELY_CAUSES = (
    "Likely causes: no network on this machine; a proxy it needs (set HTTPS_PROXY, and NO_PROXY for "
    "the hosts it must not handle) or one in the way; a firewall or a VPC Service Controls perimeter "
    "blocking the host"
)


def said(text: object, limit: int = 300) -> str:
    """`text` on one line (whitespace collapsed), cut to `limit` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def vertex_endpoint(settings: Settings) -> str:
    """Where this machine's requests to Vertex go: API_ENDPOINT, else the region's endpoint."""
    return settings.api_endpoint or f"{settings.region}-aiplatform.googleapis.com"


def client_args(endpoint: str, credentials: Any) -> dict[str, Any]:
    """A google-cloud client's keyword arguments for `endpoint`: over REST when it is a plain http://
    URL (a stand-in: launch.settings allows http://127.0.0.1), which gRPC cannot speak."""
    return {
        "credentials": credentials,
        "client_options": {"api_endpoint": endpoint},
        "transport": "rest" if endpoint.startswith("http://") else None,
    }


def vertex_service(settings: Settings) -> tuple[str, str, str]:
    """(service, URL, a hint) of the Vertex API, for `reach` and `reaching`."""
    endpoint = vertex_endpoint(settings)
    hint = (
        f"; or API_ENDPOINT={settings.api_endpoint!r} (env or env.sh) is wrong"
        if settings.api_endpoint
        else "; or this network reaches Vertex AI only through a Private Service Connect endpoint: set "
        "API_ENDPOINT (env.sh.example)"
    )
    url = endpoint if endpoint.startswith("http://") else f"https://{endpoint}"
    return f"Vertex AI in {settings.region}", url, hint


def _host(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc or url


def _chain(err: BaseException | None) -> list[BaseException]:
    """The error and those under it: causes, contexts, api_core's RetryError.cause, urllib3's and
    urllib's `reason`, requests' wrapped first argument."""
    chain: list[BaseException] = []
    while err is not None and len(chain) < 20 and not any(err is seen for seen in chain):
        chain.append(err)
        under = getattr(err, "cause", None)  # RetryError
        if not isinstance(under, BaseException):
            under = err.__cause__ or err.__context__
        if under is None and isinstance(getattr(err, "reason", None), BaseException):
            under = err.reason  # type: ignore[attr-defined]
        if under is None and err.args and isinstance(err.args[0], BaseException):
            under = err.args[0]
        err = under
    return chain


def network_failure(err: BaseException) -> bool:
    """Whether `err` says Google Cloud was not reached or did not answer: api_core's RetryError
    (storage retries a failed connection for 120 s), ServiceUnavailable and DeadlineExceeded,
    google-auth's TransportError (or a RefreshError from one), requests' ConnectionError and
    Timeout, urllib's URLError (an HTTPError is an answer), and the OS's connection errors."""
    import requests
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth

    if isinstance(err, urllib.error.HTTPError):
        return False
    network = (
        api.RetryError,
        api.ServiceUnavailable,
        api.DeadlineExceeded,
        auth.TransportError,
        requests.ConnectionError,
        requests.Timeout,
        urllib.error.URLError,
        ConnectionError,
        TimeoutError,
        socket.gaierror,
    )
    if isinstance(err, network):
        return True
    return isinstance(err, auth.RefreshError) and any(isinstance(e, auth.TransportError) for e in _chain(err))


def network_reason(err: BaseException, url: str = "") -> str:
    """What went wrong, in a few words (DNS, refused, no answer, TLS, proxy, or Google's words);
    the host when not `url`'s (the token endpoint); how long it was retried."""
    import requests
    from google.api_core import exceptions as api

    chain = _chain(err)
    retried = next((e for e in chain if isinstance(e, api.RetryError)), None)
    under = [e for e in chain if not isinstance(e, api.RetryError)] or chain
    text = " ".join(" ".join(str(e).split()) for e in under)
    unreachable = next((w for w in ("Network is unreachable", "No route to host") if w in text), "")
    if any(isinstance(e, socket.gaierror) for e in under) or re.search(
        r"Failed to resolve|Name or service not known|nodename nor servname|name resolution|DNS resolution failed",
        text,
    ):
        reason = "its name does not resolve (DNS)"
    elif any(isinstance(e, ConnectionRefusedError) for e in under) or "Connection refused" in text:
        reason = "connection refused"
    elif unreachable:
        reason = unreachable.lower()
    elif any(isinstance(e, requests.exceptions.SSLError) for e in under):
        reason = f"TLS failed (a proxy that intercepts TLS needs its CA in REQUESTS_CA_BUNDLE): {said(under[-1], 160)}"
    elif any(isinstance(e, (requests.Timeout, TimeoutError, socket.timeout)) for e in under) or re.search(
        r"timed out|Deadline", text
    ):
        reason = "no answer in time"
    else:  # "503 POST <url>: <Google's words>" over REST: the code and the words
        answer = next((e for e in reversed(under) if isinstance(e, api.GoogleAPICallError)), None)
        words = str(under[-1])
        if answer is not None:
            message = re.sub(r"^(GET|POST|PUT|PATCH|DELETE|HEAD) \S+: ", "", str(answer.message))
            words = f"{answer.code or ''} {message}"
        reason = said(words, 200) or type(under[-1]).__name__
    if any(isinstance(e, requests.exceptions.ProxyError) for e in under):
        reason = f"the proxy failed: {reason}"
    host = re.search(r"host='([^']+)', port=(\d+)", text)
    if host and host.group(1) != (urllib.parse.urlsplit(url).hostname if url else None):
        reason += f" (at {host.group(1)}:{host.group(2)})"
    seconds = re.search(r"Timeout of ([0-9.]+)s", str(retried)) if retried is not None else None
    return reason + (f"; retried for {float(seconds.group(1)):g} s" if seconds else "")


def reach(service: tuple[str, str, str], seconds: float = PROBE_SECONDS, out: Any = None) -> None:
    """Says on `out` (stdout) which service it contacts, then sends one HEAD request to its root
    (no credentials, nothing of the run). Any HTTP answer will do; none within `seconds` to connect
    and `seconds` to answer is GoogleUnreachable: at most 2 x `seconds` + 1, where the client
    libraries would retry for minutes (storage: 120 s)."""
    import requests

    name, url, hint = service
    print(f"contacting {name} ({_host(url)}) ...", file=out or sys.stdout, flush=True)
    failures: list[str] = []

    def probe() -> None:
        try:
            requests.head(url, timeout=(seconds, seconds), allow_redirects=False)
        except Exception as err:  # noqa: BLE001 (every failure is named in the line)
            failures.append(
                network_reason(err, url) if network_failure(err) else f"{type(err).__name__}: {err}"
            )

    thread = threading.Thread(target=probe, daemon=True, name=f"reach {_host(url)}")
    thread.start()
    limit = 2 * seconds + 1
    thread.join(limit)
    if thread.is_alive():  # e.g. a name server that does not answer (no timeout of its own)
        failures.append(f"no answer within {limit:g} s")
    if failures:
        raise GoogleUnreachable(
            f"cannot reach {_at(name, url)} ({failures[0]}); nothing was sent to it. {LIKELY_CAUSES}{hint}"
        )


def _at(service: str, url: str) -> str:
    """`<service> at <host>`, and the proxy requests would use (host:port, no credentials)."""
    import requests.utils

    proxy = requests.utils.select_proxy(url, requests.utils.get_environ_proxies(url))
    return f"{service} at {_host(url)}" + (
        f" through the proxy {_host(proxy).rpartition('@')[2]}" if proxy else ""
    )


@contextlib.contextmanager
def reaching(request: str, service: tuple[str, str, str], after: str = "") -> Iterator[None]:
    """A network failure (`network_failure`) during `request` as GoogleUnreachable; `after`: what was done."""
    name, url, hint = service
    try:
        yield
    except GoogleUnreachable:
        raise
    except Exception as err:
        if not network_failure(err):
            raise
        raise GoogleUnreachable(
            f"{request} failed: {_at(name, url)} could not be reached or did not answer "
            f"({network_reason(err, url)}){after}. {LIKELY_CAUSES}{hint}"
        ) from err


@contextlib.contextmanager
def calling_vertex(
    request: str, settings: Settings, after: str = "", refused: str = "", out: Any = None
) -> Iterator[None]:
    """A request to Vertex AI: `reach` first (said on `out`), then `reaching` and `refused_as`
    (naming `refused`, default `request`, and roles/aiplatform.user)."""
    vertex = vertex_service(settings)
    reach(vertex, out=out)
    role = f"roles/aiplatform.user in project {settings.project}"
    with reaching(request, vertex, after), refused_as(refused or request, role, settings):
        yield
