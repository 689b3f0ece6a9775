"""What a ``bulldozer`` process started from the command line may do to itself, and only
then: the CLI's ``main`` marks the process as its own; commands invoked in-process (tests,
an embedding program) leave the interpreter as they found it."""

from __future__ import annotations

import gc
import importlib.abc
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["claim", "collect_again", "exiting", "owned", "run_ended", "started", "without_pandas"]

_owned = False


def claim() -> None:
    """Called by the CLI's ``main``: this interpreter runs one command and exits. The cyclic
    collector is off until the command says otherwise (``collect_again`` for most, as soon
    as it is known; ``started`` for a run, once it is set up): what start-up allocates
    (imported modules, pyiceberg's objects) lives to the end, and the full
    collections it set off walked all of it for nothing, 0.15-0.2 s of a run."""
    global _owned
    _owned = True
    gc.disable()


def collect_again() -> None:
    gc.enable()


def started() -> None:
    """The command's long-lived objects are built: keep later collections from walking them
    (they move to the permanent generation), and collect from here on."""
    gc.freeze()
    gc.enable()


def run_ended() -> None:
    """A run is over, or failed before its load stage: collect as usual again."""
    gc.unfreeze()
    gc.enable()


def exiting() -> None:
    """The process is about to exit: move every object to the permanent generation, so the
    interpreter's final collections skip them (they cost 0.4-0.6 s after a large run: tens
    of thousands of objects from pyiceberg, grpc, pydantic). Not after DuckDB ran a
    query: its (nanobind) types would then still be alive when its module is torn down, and
    nanobind reports each one as a leak on stderr."""
    if "duckdb" not in sys.modules:
        gc.freeze()


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
