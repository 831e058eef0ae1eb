"""Secrets kept out of what a message, a log line or ``autotune status`` shows of a URL."""

from __future__ import annotations

import re

_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)(?P<secret>[^@\s]+)(?=@)", re.I)


_QUERY_SECRET = re.compile(r"(?P<head>[?&](?:password|passwd|pwd|sslpassword)=)[^&#\s]+", re.I)


def redact(text: str) -> str:
    """``text`` with every URL password (``scheme://user:PASSWORD@host``, or a ``password=``
    query parameter) replaced by ``***``: what a message or a log line may show of a URL."""
    text = _PASSWORD.sub(lambda m: m.group("head") + "***", text)
    return _QUERY_SECRET.sub(lambda m: m.group("head") + "***", text)


def failure_text(exc: Exception, url: str) -> str:
    """An exception's text for a message: type and text, the URL's password masked wherever it
    appears (a driver may quote the URL)."""
    text = f"{type(exc).__name__}: {exc}"
    secret = _PASSWORD.search(url)
    if secret is not None:
        text = text.replace(secret.group("secret"), "***")
    return redact(text)
