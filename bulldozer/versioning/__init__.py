"""Versions of an alias over the KV DAL client: the typed run state kept with each version
(``run_state``), the flip (``flip``), rollback and retention."""

from bulldozer.versioning.retention import RetentionPlan, apply_retention, plan_retention
from bulldozer.versioning.rollback import previous_version, rollback

__all__ = ["RetentionPlan", "apply_retention", "plan_retention", "previous_version", "rollback"]
