"""Fixtures of the integration tests."""

from tests.integration.kv_fixtures import dal, kv

__all__ = ["dal", "kv"]
