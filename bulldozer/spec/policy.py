"""What the operator lets a job spec reach: the Iceberg catalogs and the DALs it configured,
and the time a run may take.

A job spec is untrusted input from any team: it may name the operator's catalogs and DALs,
never define its own (``bulldozer.warehouse.catalog.catalog_issues``: a catalog's properties
reach files, modules and hosts; ``bulldozer.kv.connect.endpoint_issues``: a job's data goes
wherever its endpoint says), and it may ask for a shorter time limit than the operator's,
never a longer one (``time_limit``). ``validate`` and ``submit`` report these as located
issues before a spec is placed; ``run`` refuses at the point it would open a catalog or a
DAL, or start.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from bulldozer.errors import SpecError

if TYPE_CHECKING:
    from bulldozer.errors import SpecIssue
    from bulldozer.spec.loader import LoadedSpec

__all__ = ["policy_issues", "time_limit", "time_limit_issues"]

_TIMEOUT = ("metadata", "timeout")


def policy_issues(loaded: LoadedSpec) -> list[SpecIssue]:
    """Every place ``loaded`` reaches beyond what the operator configured, as located issues."""
    from bulldozer.kv.connect import endpoint_issues
    from bulldozer.warehouse.catalog import catalog_issues

    return [*catalog_issues(loaded), *endpoint_issues(loaded), *time_limit_issues(loaded)]


def time_limit_issues(loaded: LoadedSpec) -> list[SpecIssue]:
    """A spec's ``metadata.timeout`` longer than the operator's ``BULLDOZER_RUN_TIMEOUT``."""
    from bulldozer.settings import load_settings
    from bulldozer.spec.models import format_duration

    asked, allowed = loaded.spec.metadata.timeout, load_settings().run_timeout
    if asked is None or allowed is None or asked <= allowed:
        return []
    return [
        loaded.issue(
            _TIMEOUT,
            f"{format_duration(asked)} is longer than a run may take here: at most {format_duration(allowed)} "
            "(the operator's BULLDOZER_RUN_TIMEOUT)",
        )
    ]


def time_limit(loaded: LoadedSpec) -> tuple[timedelta, str] | None:
    """The time a run of ``loaded`` (under a scheduler, each of its stages) may take, and
    where that limit is set: the spec's ``metadata.timeout``, else the operator's
    ``BULLDOZER_RUN_TIMEOUT``; None when neither sets one. A spec asking for more than the
    operator allows is refused (SpecError)."""
    from bulldozer.settings import load_settings

    if issues := time_limit_issues(loaded):
        raise SpecError(issues)
    if (asked := loaded.spec.metadata.timeout) is not None:
        return asked, "metadata.timeout"
    if (allowed := load_settings().run_timeout) is not None:
        return allowed, "BULLDOZER_RUN_TIMEOUT"
    return None
