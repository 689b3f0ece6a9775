"""Validated identifiers: job names, aliases and version namespaces.

Nothing a user typed ever reaches a file path, a CQL statement or a key prefix without
passing through here first. The patterns are deliberately narrow (ASCII lowercase,
digits, underscore) so a name is safe in every engine as it is.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable
from datetime import UTC, datetime

from bulldozer.errors import InvalidArgumentError, InvalidNameError, NamespaceNotFoundError
from bulldozer.kv.v1 import shared

__all__ = [
    "ALIAS_PATTERN",
    "NAMESPACE_PATTERN",
    "VERSION_REF_PATTERN",
    "closest",
    "describe_value",
    "did_you_mean",
    "is_identifier",
    "new_version_name",
    "parse_version_name",
    "pick_version",
    "short_version",
    "validate_alias",
    "validate_namespace",
]

# Both patterns are rules shared with the Go data plane: proto/bulldozer/kv/v1/shared.yaml.
#: Job names and aliases: a lowercase letter, then up to 62 lowercase letters, digits or ``_``.
ALIAS_PATTERN = shared.NAMES_ALIAS_PATTERN
#: Namespaces (an alias plus a version suffix): same alphabet, up to 128 characters.
NAMESPACE_PATTERN = shared.NAMES_NAMESPACE_PATTERN

_ALIAS_RE = re.compile(ALIAS_PATTERN)
_NAMESPACE_RE = re.compile(NAMESPACE_PATTERN)
#: How a read names one version of an alias (``ALIAS@REF``): the version's full namespace
#: name, or a unique suffix of it of at least ``MIN_VERSION_REF`` characters (its id, ``e10890``).
VERSION_REF_PATTERN = r"^[a-z0-9_]{1,128}$"
MIN_VERSION_REF = 4
_VERSION_REF_RE = re.compile(VERSION_REF_PATTERN)
_VERSION_RE = re.compile(r"^(?P<alias>[a-z][a-z0-9_]{0,62}?)__v(?P<ts>\d{14})_(?P<id>[0-9a-f]{6})$")


def describe_value(value: object, limit: int = 40) -> str:
    """A short, printable rendering of an untrusted value for an error message."""
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def is_identifier(value: object, pattern: str = ALIAS_PATTERN) -> bool:
    return isinstance(value, str) and re.fullmatch(pattern, value) is not None


def validate_alias(value: object, what: str = "alias") -> str:
    """Return ``value`` if it is a valid alias / job name, else raise InvalidNameError."""
    if not isinstance(value, str) or _ALIAS_RE.fullmatch(value) is None:
        raise InvalidNameError(f"{what} {describe_value(value)} must match {ALIAS_PATTERN}")
    return value


def validate_namespace(value: object, what: str = "namespace") -> str:
    """Return ``value`` if it is a valid namespace name, else raise InvalidNameError."""
    if not isinstance(value, str) or _NAMESPACE_RE.fullmatch(value) is None:
        raise InvalidNameError(f"{what} {describe_value(value)} must match {NAMESPACE_PATTERN}")
    return value


def new_version_name(alias: str, now: datetime | None = None) -> str:
    """A fresh version namespace ``<alias>__v<UTC yyyymmddHHMMSS>_<6 hex>``; names sort by time."""
    validate_alias(alias)
    when = (now or datetime.now(UTC)).astimezone(UTC)
    return f"{alias}__v{when:%Y%m%d%H%M%S}_{secrets.token_hex(3)}"


def parse_version_name(name: str) -> tuple[str, datetime] | None:
    """``(alias, created)`` for a version namespace name, or None for any other name."""
    m = _VERSION_RE.fullmatch(name)
    if m is None:
        return None
    ts = datetime.strptime(m.group("ts"), "%Y%m%d%H%M%S").replace(tzinfo=UTC)
    return m.group("alias"), ts


def short_version(name: str) -> str:
    """The short id of a version namespace (its 6 hex digits, ``e10890``), or the name itself
    for a namespace that is not a version name."""
    m = _VERSION_RE.fullmatch(name)
    return m.group("id") if m else name


def pick_version(ref: str, names: list[str], owner: str) -> str:
    """The one of ``names`` (the versions of ``owner``: ``alias 'x'``, or ``the store``)
    that ``ref`` names: equal to it, or ending with it. Raises InvalidNameError for a
    malformed ref, NamespaceNotFoundError when none matches and InvalidArgumentError when
    several do (naming them)."""
    if not isinstance(ref, str) or _VERSION_REF_RE.fullmatch(ref) is None:
        raise InvalidNameError(f"version {describe_value(ref)} must match {VERSION_REF_PATTERN}")
    if ref in names:
        return ref
    if len(ref) < MIN_VERSION_REF:
        raise NamespaceNotFoundError(
            f"{owner} has no version {ref!r} (a short id has {MIN_VERSION_REF} characters or more)"
        )
    found = [n for n in names if n.endswith(ref)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise NamespaceNotFoundError(f"{owner} has no version {ref!r}")
    raise InvalidArgumentError(f"version {ref!r} of {owner} is ambiguous: {', '.join(sorted(found)[:3])}")


def closest(name: str, known: Iterable[str], *, cutoff: float = 0.6, fold_case: bool = False) -> str | None:
    """The one of ``known`` that ``name`` was most likely meant as (difflib's similarity of
    at least ``cutoff``), or None: what a refusal offers as "did you mean". With
    ``fold_case``, case is not compared (a time zone, a column a filter names) and the
    known spelling is returned."""
    import difflib

    candidates = list(known)
    if not fold_case:
        match = difflib.get_close_matches(name, candidates, n=1, cutoff=cutoff)
        return match[0] if match else None
    spelled: dict[str, str] = {}
    for candidate in candidates:
        spelled.setdefault(candidate.lower(), candidate)
    match = difflib.get_close_matches(name.lower(), list(spelled), n=1, cutoff=cutoff)
    return spelled[match[0]] if match else None


def did_you_mean(name: str, known: Iterable[str], *, cutoff: float = 0.6, fold_case: bool = False) -> str:
    """``did you mean 'x'?`` for the name ``closest`` finds, or "" when it finds none."""
    match = closest(name, known, cutoff=cutoff, fold_case=fold_case)
    return f"did you mean {match!r}?" if match is not None else ""
