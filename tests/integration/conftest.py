"""Fixtures of the integration tests."""

from tests.integration.kv_fixtures import kv

__all__ = ["kv"]
