"""Versions of an alias over the KV DAL client: retention and rollback."""

from bulldozer.versioning.retention import RetentionPlan, apply_retention, plan_retention

__all__ = ["RetentionPlan", "apply_retention", "plan_retention"]
