"""Load engines: ``local`` (pyiceberg + Arrow, no JVM) and ``spark``, behind one ABC."""

from __future__ import annotations

import importlib
from typing import Any

from bulldozer.errors import BackendUnavailableError, InvalidArgumentError
from bulldozer.load.engines.base import LoadEngine, LoadPlan, LoadResult, SplitResult

__all__ = ["ENGINES", "LoadEngine", "LoadPlan", "LoadResult", "SplitResult", "create_load_engine"]

#: name → (module, class, the extra that installs it)
ENGINES: dict[str, tuple[str, str, str | None]] = {
    "local": ("bulldozer.load.engines.local", "LocalEngine", None),
    "spark": ("bulldozer.load.engines.spark", "SparkEngine", "spark"),
}


def create_load_engine(name: str, **options: Any) -> LoadEngine:
    """The load engine called ``name``, made with ``options`` (e.g. Spark's ``master``)."""
    if name not in ENGINES:  # a setting, not the engine's state: trying again cannot help
        raise InvalidArgumentError(f"unknown load engine {name!r}; known: {', '.join(sorted(ENGINES))}")
    module_name, class_name, extra = ENGINES[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"; install it with: pip install 'bulldozer[{extra}]'" if extra else ""
        raise BackendUnavailableError(f"the {name} engine cannot be loaded ({exc}){hint}") from exc
    engine: LoadEngine = getattr(module, class_name)(**options)
    return engine
