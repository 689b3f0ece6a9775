"""The load-engine ABC and what an engine reports back.

An engine reads the source at the plan's pinned snapshot, split by split (Iceberg
file-scan tasks), encodes each batch with the shared encoder, writes it through the DAL
client, and reports per split: rows, the (order-independent) digest of the pairs it
sent, null counts per column (for the quality gates) and the key hashes (for duplicate
detection). Splits already in the plan's ledger are skipped (resume).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from bulldozer.codec.digest import Digest
from bulldozer.kv.client import KvClient
from bulldozer.schema.model import ProtoFile
from bulldozer.spec.models import JobSpec

__all__ = ["LoadEngine", "LoadPlan", "LoadResult", "SplitResult"]


@dataclass
class SplitResult:
    split_id: str
    rows: int
    digest: Digest
    null_counts: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> list[Any]:
        return [self.rows, self.digest.value, self.digest.bytes, self.null_counts]

    @classmethod
    def from_json(cls, split_id: str, data: list[Any]) -> SplitResult:
        rows, value, nbytes, nulls = data
        return cls(split_id, int(rows), Digest(int(rows), int(value), int(nbytes)), dict(nulls))


@dataclass
class LoadPlan:
    spec: JobSpec
    table: Any  # pyiceberg Table
    snapshot_id: int
    proto: ProtoFile
    version: str
    #: split id → result, for splits loaded by an earlier attempt of this version
    done: dict[str, SplitResult] = field(default_factory=dict)
    #: the embedded state folder the run uses (for engines that open the catalog themselves)
    home: str | None = None
    #: set for query sources and keep_latest: DuckDB runs this instead of a table scan
    sql: Any = None

    @property
    def columns(self) -> list[str]:
        cols = [f.column for f in self.proto.key.fields] + [f.column for f in self.proto.value.fields]
        order_by = self.spec.data_movement.duplicate_keys.order_by
        if order_by and order_by not in cols:
            cols.append(order_by)
        return cols


@dataclass
class LoadResult:
    splits: dict[str, SplitResult] = field(default_factory=dict)
    key_hashes: list[np.ndarray[Any, Any]] = field(default_factory=list)
    #: seconds of the load spent waiting for the engine to be ready before it read a row
    #: (Spark: its driver, and its executors' Python workers when ``prepare`` started them)
    engine_start: float = 0.0

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.splits.values())

    @property
    def digest(self) -> Digest:
        total = Digest()
        for s in self.splits.values():
            total.add(s.digest)
        return total

    @property
    def null_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.splits.values():
            for col, n in s.null_counts.items():
                out[col] = out.get(col, 0) + n
        return out


#: Called after each split is acknowledged by the DAL (the runner records the ledger).
SplitDone = Callable[[SplitResult], None]
#: Called with (rows done, rows expected) as the load advances.
Progress = Callable[[int, int], None]


class LoadEngine(ABC):
    name: ClassVar[str]
    #: Whether a resumed run can skip the splits in the ledger (else it re-sends all rows).
    resumes_splits: ClassVar[bool] = True
    #: Whether the engine runs query sources and keep_latest.
    runs_sql: ClassVar[bool] = False
    #: Whether the engine spreads the load over ``key_value_dal.write.partitions`` tasks.
    writes_partitions: ClassVar[bool] = False
    #: Iceberg types some way of the engine's to read a table cannot read, and why
    unreadable_types: ClassVar[dict[str, str]] = {}
    #: Set by a load whose writers could not see each other's keys (rows sharing a key may
    #: have gone to different writers): the seal's count finds such rows, the runner names them.
    shared_keys_unchecked: bool = False

    def unreadable(self, columns: list[Any]) -> str | None:
        """Why this engine cannot read one of ``columns`` (Iceberg NestedFields), or None."""
        from pyiceberg.schema import index_by_id

        for column in columns:
            nested = [f.field_type for f in index_by_id(column.field_type).values()]
            for t in (column.field_type, *nested):
                if str(t) in self.unreadable_types:
                    return f"column {column.name!r} holds a {t}, and {self.unreadable_types[str(t)]}"
        return None

    def refuse(self, spec: JobSpec) -> None:
        """Raise, in one line, what of ``spec`` this engine cannot run at all (Spark: a
        catalog its JVM cannot open), before the run reads or writes anything. Default:
        nothing."""
        return None

    def prepare(self, spec: JobSpec, home: str | None) -> None:
        """Start, in the background, what a load of ``spec`` will need (Spark: its driver and
        its executors' Python workers), while the run reads the source's schema and creates
        the version; the load waits for it and counts the wait as ``engine_start``. Called
        once the spec is valid, for full runs. Default: nothing to start."""
        return None

    @abstractmethod
    def load(self, plan: LoadPlan, client: KvClient, on_split: SplitDone, progress: Progress) -> LoadResult:
        """Load every split not in ``plan.done`` into ``plan.version``."""

    @abstractmethod
    def key_hashes_of(self, plan: LoadPlan, split_ids: set[str] | None) -> list[np.ndarray[Any, Any]]:
        """Key hashes of splits loaded earlier (a resumed run re-reads only their keys), or
        of every split (None)."""

    @abstractmethod
    def find_keys(self, plan: LoadPlan, hashes: set[int], limit: int = 3) -> list[dict[str, Any]]:
        """Key values (column → value) whose hash is in ``hashes`` (to name duplicates)."""
