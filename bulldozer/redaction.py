"""What messages and logs show of a secret: nothing. A URL may carry a password (a Redis
URL's ``user:password@``, a catalog's SQLAlchemy URI, a ``password`` query parameter);
wherever one is named in an error or a log line, ``shown_url`` names it instead."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

__all__ = ["shown_url"]

_QUERY_PASSWORD = re.compile(r"(^|&)(password|passwd|pwd)=[^&]*", re.IGNORECASE)


def shown_url(url: str) -> str:
    """``url`` with a password in it (``user:password@``, or a ``password``, ``passwd`` or
    ``pwd`` query parameter) replaced by ``***``; the rest as it is, character for character."""
    try:
        parts = urlsplit(url)
    except ValueError:  # an unbalanced bracket: not taken apart, so not shown
        return "(a URL that does not parse)"
    if parts.password is not None:
        host = parts.netloc.rpartition("@")[2]
        url = url.replace(f"//{parts.netloc}", f"//{parts.username or ''}:***@{host}", 1)
    head, sep, query = url.partition("?")
    return head + sep + _QUERY_PASSWORD.sub(r"\1\2=***", query)
