"""What messages and logs show of text Bulldozer did not write.

Of a secret: nothing. A URL may carry a password (a Redis URL's ``user:password@``, a
catalog's SQLAlchemy URI, a ``password`` query parameter); wherever one is named in an error
or a log line, ``shown_url`` names it instead. Of a control character (in a table's names
or values, a reason someone gave, a message quoting them): its escape, so a line stays one
line and the operator's terminal is never driven by somebody else's text (``visible``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlsplit

__all__ = ["SECRET_SETTING", "first_line", "shown_url", "visible", "without_secrets", "yaml_problem", "yaml_where"]

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


#: what names a setting whose value is a secret (case aside; a regular expression both
#: Python and Java read alike): a REST catalog's ``credential`` and ``token``, a header's
#: ``Authorization``, ``s3.secret-access-key``, ``s3.session-token``, ``gcs.oauth2.token``,
#: ADLS's ``adls.account-key`` (Java's ``adls.auth.shared-key.account.key``) and
#: ``adls.sas-token…``, a ``…password``, a ``…private-key``. Here, and in Spark's
#: ``spark.redaction.regex`` (``bulldozer.load.engines.spark.session``)
SECRET_SETTING = r"credential|token|secret|passw|private|authorization|account[.-]?key"
_SECRET_NAME = re.compile(SECRET_SETTING, re.IGNORECASE)


def without_secrets(text: str, settings: Mapping[str, str]) -> str:
    """``text`` (what a library said of a client it built from ``settings``, a catalog's
    properties) with the secrets of ``settings`` in it hidden: the value of each setting
    named like a secret as ``***``, and each URL's password as ``shown_url`` shows it."""
    for name, value in settings.items():
        if not isinstance(value, str) or len(value) < 3:
            continue
        if _SECRET_NAME.search(name):
            text = text.replace(value, "***")
        elif "://" in value:
            text = text.replace(value, shown_url(value))
    return text


#: characters a terminal acts on instead of showing: C0 and C1 controls (ESC starts the
#: sequences that recolour, move the cursor, retitle the window or write the clipboard),
#: DEL, the bidirectional overrides that reorder what is shown, and the line separators
_UNSHOWN = [*range(0x20), *range(0x7F, 0xA0), 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_SHOWN = {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" for c in [*_UNSHOWN, 0x2028, 0x2029]}
_SHOWN.update({ord("\n"): "\\n", ord("\t"): "\\t", ord("\r"): "\\r"})


def visible(text: str) -> str:
    """``text`` with every character a terminal would act on written out as an escape
    (``\\x1b``, ``\\n``, ``\\u202e``): what a command prints of another's text (a table's
    names and values, a reason someone gave, a message quoting them) is shown, on its one
    line, and never recolours, moves or retitles the operator's terminal."""
    return text.translate(_SHOWN)


def first_line(exc: BaseException) -> str:
    """What a library's exception says, on its first line (its type's name when it says
    nothing): the rest is context for a traceback (SQLAlchemy's "(Background on this error
    at: ...)" link and ``[SQL: ...]``, DuckDB's and YAML's pointers under the line), not for
    the one line a command prints."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def yaml_problem(exc: BaseException) -> str:
    """A YAML parser's error (PyYAML's ``YAMLError``) as its one line, ``PROBLEM (CONTEXT)``,
    e.g. ``expected the node content, but found '<stream end>' (while parsing a flow node)``:
    its text is several lines, the last ones pointing at the line of a ``"<unicode string>"``."""
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    if not problem:
        return context or first_line(exc)
    return f"{problem} ({context})" if context else str(problem)


def yaml_where(path: object, exc: BaseException) -> str:
    """``PATH:LINE:COLUMN`` where the YAML parser's error ``exc`` points in ``path`` (``PATH``
    when it points nowhere)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
