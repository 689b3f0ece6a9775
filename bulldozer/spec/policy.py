"""What the operator lets a job spec reach: the Iceberg catalogs and the DALs it configured.

A job spec is untrusted input from any team: it may name the operator's catalogs and DALs,
never define its own (``bulldozer.warehouse.catalog.catalog_issues``: a catalog's properties
reach files, modules and hosts; ``bulldozer.kv.connect.endpoint_issues``: a job's data goes
wherever its endpoint says). ``validate`` and ``submit`` report both as located issues before
a spec is placed; ``run`` refuses at the point it would open either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bulldozer.errors import SpecIssue
    from bulldozer.spec.loader import LoadedSpec

__all__ = ["policy_issues"]


def policy_issues(loaded: LoadedSpec) -> list[SpecIssue]:
    """Every place ``loaded`` reaches beyond what the operator configured, as located issues."""
    from bulldozer.kv.connect import endpoint_issues
    from bulldozer.warehouse.catalog import catalog_issues

    return [*catalog_issues(loaded), *endpoint_issues(loaded)]
