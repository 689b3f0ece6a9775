"""Refresh ``tests/module_seconds.json``, the seconds each test module took in a whole run,
from the JUnit XML that ``scripts/test.sh`` writes (``build/pytest.xml``).

The two test workers take modules in that file's order, longest first (tests/conftest.py):
a long module started last would leave one worker running it alone at the end. A stale file
only orders less well; a module it lacks goes last. Refresh it after a whole run when modules
were added or grew:

    bash scripts/test.sh && .venv/bin/python scripts/test_weights.py
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WEIGHTS = REPO / "tests" / "module_seconds.json"


def module_of(classname: str) -> str | None:
    """``tests/unit/test_x.py`` for ``tests.unit.test_x`` or ``tests.unit.test_x.TestY``."""
    parts = classname.split(".")
    while parts:
        path = "/".join(parts) + ".py"
        if (REPO / path).is_file():
            return path
        parts.pop()
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", nargs="?", type=Path, default=REPO / "build" / "pytest.xml")
    args = parser.parse_args()
    if not args.junit.is_file():
        print(f"test_weights: no {args.junit}: run scripts/test.sh first", file=sys.stderr)
        return 2
    seconds: Counter[str] = Counter()
    for case in ET.parse(args.junit).iter("testcase"):
        module = module_of(case.get("classname", ""))
        if module is not None:
            seconds[module] += float(case.get("time", "0"))
    if len(seconds) < 10:
        print(f"test_weights: {args.junit} holds {len(seconds)} modules: not a whole run", file=sys.stderr)
        return 2
    WEIGHTS.write_text(json.dumps({m: round(s, 1) for m, s in sorted(seconds.items())}, indent=1) + "\n")
    print(f"test_weights: {len(seconds)} modules, {sum(seconds.values()):.0f} s in all → {WEIGHTS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
