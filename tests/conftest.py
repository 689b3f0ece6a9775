"""Shared fixtures: the repository root and a small embedded sample warehouse."""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "tests" / "specs"

#: seconds after which a test still running ends its whole process, every thread's stack
#: printed first: the last resort behind pytest-timeout (``timeout`` in pyproject.toml), whose
#: SIGALRM is handled only once the main thread gets the GIL back, so a test whose threads
#: deadlocked on the GIL itself ran until CI's limit and said nothing (one did: an LMDB handle
#: opened holding the GIL, tests/unit/test_embedded_handles.py). faulthandler's watchdog is a
#: C thread that needs no GIL.
LAST_RESORT_SECONDS = 900
_original_stderr: list[Any] = []


def pytest_configure(config: pytest.Config) -> None:
    # the stream this process started with: a test's own stderr is captured to a file,
    # which a process that ends this way never shows
    _original_stderr.append(os.fdopen(os.dup(2), "w"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    faulthandler.dump_traceback_later(LAST_RESORT_SECONDS, exit=True, file=_original_stderr[0])
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order the two workers take modules in (``--dist loadfile --no-loadscope-reorder``,
    scripts/test.sh): first the modules marked ``slow`` as a whole, then the others by most
    tests first (xdist's own order), each module's tests in their own order. In xdist's order
    the 190-s benchmark module, a few tests, started last and ran alone on one worker (a run's
    module times simulated: 1260 s a worker against 1198 s). Longest first (1180 s simulated)
    ran the Spark, Cassandra and Airflow modules side by side and every one slower: 2788 s of
    tests against 2360 s, 1410 s a worker."""
    counts: dict[Path, int] = {}
    slow: dict[Path, bool] = {}
    for item in items:
        counts[item.path] = counts.get(item.path, 0) + 1
        if item.path not in slow:
            module = item.getparent(pytest.Module)
            slow[item.path] = module is not None and any(m.name == "slow" for m in module.own_markers)
    items.sort(key=lambda item: (not slow[item.path], -counts[item.path]))  # stable


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test touches the developer's ./.bulldozer by accident."""
    monkeypatch.setenv("BULLDOZER_HOME", str(tmp_path / "bulldozer-home"))


@pytest.fixture(autouse=True)
def _no_profile_selected() -> Iterator[None]:
    """A command invoked in this process (typer's CliRunner) with ``--profile`` selects that
    profile for the process (``settings.select_profile``), as a command's own process would:
    no later test of the worker inherits it."""
    yield
    from bulldozer.settings import select_profile

    select_profile(None)


@pytest.fixture(scope="session")
def sample_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An embedded warehouse with a 2 000-row sample table (shared, treat as read-only)."""
    from bulldozer.warehouse.sample import create_sample_warehouse

    home = tmp_path_factory.mktemp("sample-home")
    create_sample_warehouse(home, rows=2_000)
    return home


@pytest.fixture(scope="session")
def sample_table(sample_home: Path):  # type: ignore[no-untyped-def]
    from bulldozer.spec.models import CatalogConfig
    from bulldozer.warehouse.catalog import open_catalog

    return open_catalog(CatalogConfig(), sample_home).load_table("sample.user_item_scores")


def update_goldens() -> bool:
    return os.environ.get("BULLDOZER_UPDATE_GOLDENS") == "1"


def _hypothesis_profiles() -> None:
    """CI replays a fixed set of examples (a landing never depends on luck); local runs
    explore new ones (set BULLDOZER_HYPOTHESIS_EXAMPLES to explore more). No deadline:
    this small machine's timings are too noisy for one."""
    from hypothesis import settings

    settings.register_profile("dev", deadline=None)
    settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
    settings.load_profile("ci" if os.environ.get("CI") else "dev")


_hypothesis_profiles()
