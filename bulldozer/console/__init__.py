"""The web console (``bulldozer ui``): aliases, versions, runs, lookups, rollback and pin,
served over the same KV DAL client as every command (its ACLs apply)."""

from bulldozer.console.app import LOOPBACK_HOSTS, create_app

__all__ = ["LOOPBACK_HOSTS", "create_app"]
