"""`notification_emails` (an extra, Vertex only): it picks the compiled template before the
parameters' defaults are read, so `launch.submit` calls its rule on its own."""

from __future__ import annotations

import re
from typing import Any

from pipeline.options.common import REQUIRED
from pipeline.options.common import Parameter as _p

PARAMETERS: tuple[_p, ...] = (
    _p(
        "notification_emails",
        list,
        REQUIRED,
        "One to three addresses e-mailed when the run ends (Vertex only). Given: the run uses "
        "the template with a notification exit handler; not given: the template without one.",
        targets=("vertex",),
    ),
)

EMAIL = re.compile(r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$")


def check_notification_emails(emails: Any) -> list[str]:
    """`notification_emails` as VertexNotificationEmailOp may receive it: one to three addresses
    (GCPC's `vertex_notification_email` docstring and Google's "Configure email notifications"
    page: "up to 3 emails"). [] or None: no notification (the template without the handler)."""
    if emails in (None, []):
        return []
    if not isinstance(emails, list) or not all(isinstance(e, str) for e in emails):
        raise ValueError(f"notification_emails must be a JSON list of addresses, got {emails!r}")
    bad = [e for e in emails if not EMAIL.match(e)]
    if bad:
        raise ValueError(f"notification_emails: not e-mail addresses: {', '.join(map(repr, bad))}")
    if not 1 <= len(emails) <= 3:
        raise ValueError(
            f"notification_emails takes one to three addresses (Vertex's limit), got {len(emails)}"
        )
    return list(emails)
