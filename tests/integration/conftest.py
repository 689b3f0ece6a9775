"""Fixtures of the integration tests."""

from collections.abc import Iterator

import pytest

from tests.integration import services
from tests.integration.kv_fixtures import dal, kv

__all__ = ["dal", "kv"]


@pytest.fixture(scope="session", autouse=True)
def _stop_services() -> Iterator[None]:
    """Stop the Redis / Cassandra servers the session started (if any)."""
    yield
    services.stop_all()
