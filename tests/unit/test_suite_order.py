"""The suite's module lengths (``tests/module_seconds.json``), by which the two workers take
modules longest first (tests/conftest.py), name exactly the test modules there are."""

from __future__ import annotations

import json

from tests.conftest import REPO


def test_the_module_lengths_name_every_test_module_and_no_other() -> None:
    listed = set(json.loads((REPO / "tests" / "module_seconds.json").read_text()))
    present = {p.relative_to(REPO).as_posix() for p in (REPO / "tests").glob("*/test_*.py")}
    assert sorted(present - listed) == [], (
        "modules without a length go last: run scripts/test_weights.py after a whole run, or add them by hand"
    )
    assert sorted(listed - present) == [], "lengths of modules that are gone (renamed?)"
