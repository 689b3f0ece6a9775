"""What a ``bulldozer`` process started from the command line may do to itself, and only
then: the CLI's ``main`` marks the process as its own; commands invoked in-process (tests,
an embedding program) leave the interpreter as they found it."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["claim", "owned", "without_pandas"]

_owned = False


def claim() -> None:
    """Called by the CLI's ``main``: this interpreter runs one command and exits."""
    global _owned
    _owned = True


def owned() -> bool:
    return _owned


def without_pandas() -> bool:
    """Tell pyarrow that pandas is absent, in a process of ours that has not imported either
    yet; True when done. pyarrow imports pandas (0.25-0.3 s) the first time it checks whether
    a value is a pandas object (importing ``pyarrow.dataset`` does), and remembers the answer.
    Nothing on the local engine's path uses pandas; the Spark engine does (its driver
    converts through it), so only a local run calls this."""
    if not _owned or "pandas" in sys.modules or "pyarrow.dataset" in sys.modules:
        return False
    sys.meta_path.insert(0, _NoPandas())  # not sys.modules["pandas"] = None: Cython's import takes that None
    return True


class _NoPandas(importlib.abc.MetaPathFinder):
    """``import pandas`` fails as if pandas were not installed."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> None:
        if fullname == "pandas" or fullname.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {fullname!r} (a local run does without it)", name=fullname)
        return None
