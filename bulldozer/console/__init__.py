"""The web console (``bulldozer ui``): aliases, versions, runs, lookups, rollback and pin,
served over the same KV DAL client as every command (its ACLs apply)."""

from bulldozer.console.app import create_app

__all__ = ["create_app"]
