"""Configuration of each storage engine: one pydantic model per engine, joined in a
discriminated union on ``type`` (no heavy imports here: drivers load lazily)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["EmbeddedConfig", "EngineConfig", "MemoryConfig"]

_MODEL = ConfigDict(frozen=True, extra="forbid")


class MemoryConfig(BaseModel):
    """In-process dictionaries; for tests."""

    model_config = _MODEL
    type: Literal["memory"] = "memory"


class EmbeddedConfig(BaseModel):
    """LMDB on local disk: one sub-database per namespace."""

    model_config = _MODEL
    type: Literal["embedded"] = "embedded"
    path: str = Field(description="Directory of the store (created if missing).")
    map_size: int = Field(
        default=64 * 1024**3,
        ge=1024**2,
        description="Largest size the store may grow to (a sparse file; raise it when full).",
    )
    max_namespaces: int = Field(default=8192, ge=16, description="Namespaces one process may open.")
    writemap: bool = Field(
        default=False,
        description="Write pages in place in the memory map: about 1.8x faster random-key loads, but an "
        "operating-system crash (not a process crash) between syncs can corrupt the store (LMDB MDB_WRITEMAP "
        "without sync). Off by default.",
    )


EngineConfig = Annotated[MemoryConfig | EmbeddedConfig, Field(discriminator="type")]
