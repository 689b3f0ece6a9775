"""Storage engines behind the KV DAL: one ABC, one config model each, and a registry
that imports an engine only when it is asked for."""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import TypeAdapter, ValidationError

from bulldozer.errors import BackendUnavailableError, InvalidArgumentError
from bulldozer.kv.backends.base import StorageEngine
from bulldozer.kv.backends.config import CassandraConfig, EmbeddedConfig, EngineConfig, MemoryConfig, RedisConfig

__all__ = [
    "ENGINES",
    "CassandraConfig",
    "EmbeddedConfig",
    "MemoryConfig",
    "RedisConfig",
    "StorageEngine",
    "create_engine",
    "engine_config",
]

#: name → (module, class, the extra that installs its driver)
ENGINES: dict[str, tuple[str, str, str | None]] = {
    "memory": ("bulldozer.kv.backends.memory", "MemoryEngine", None),
    "embedded": ("bulldozer.kv.backends.embedded", "EmbeddedEngine", None),
    "redis": ("bulldozer.kv.backends.redis", "RedisEngine", "redis"),
    "cassandra": ("bulldozer.kv.backends.cassandra", "CassandraEngine", "cassandra"),
}

_ADAPTER: TypeAdapter[Any] = TypeAdapter(EngineConfig)


def engine_config(data: dict[str, Any]) -> Any:
    """Validate an engine configuration mapping (``{"type": "embedded", "path": ...}``)."""
    if data.get("type") not in ENGINES:
        raise InvalidArgumentError(f"unknown storage engine {data.get('type')!r}; known: {', '.join(sorted(ENGINES))}")
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:]) or 'config'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors(include_url=False)
        )
        raise InvalidArgumentError(f"invalid {data.get('type')} engine configuration: {problems}") from None


def create_engine(config: Any) -> StorageEngine:
    """The engine for ``config``, importing its module (and driver) only now."""
    if isinstance(config, dict):
        config = engine_config(config)
    module_name, class_name, extra = ENGINES[config.type]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"; install it with: pip install 'bulldozer[{extra}]'" if extra else ""
        raise BackendUnavailableError(f"the {config.type} engine cannot be loaded ({exc}){hint}") from exc
    engine: StorageEngine = getattr(module, class_name)(config)
    return engine
