"""How many Spark write tasks a load has, and whether they read the snapshot's splits
themselves or Spark reads the table by key (bulldozer.load.engines.spark.write_tasks)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from bulldozer.load.engines.spark import BYTES_PER_PARTITION, write_tasks

MIB = 1024 * 1024


def plan(total_bytes: int, partitions: int | None = None) -> Any:
    """A load plan whose snapshot's data files hold ``total_bytes``."""
    snapshot = SimpleNamespace(summary={"total-files-size": str(total_bytes)})
    table = SimpleNamespace(snapshot_by_id=lambda _id: snapshot)
    write = SimpleNamespace(partitions=partitions)
    return SimpleNamespace(table=table, snapshot_id=1, spec=SimpleNamespace(key_value_dal=SimpleNamespace(write=write)))


@pytest.mark.parametrize(
    ("splits", "split_bytes", "expected"),
    [
        (1, 5 * MIB, (1, True)),  # one small file: its task reads it, one core idle
        (1, BYTES_PER_PARTITION, (1, True)),  # one task's worth exactly
        (3, 3 * BYTES_PER_PARTITION, (3, True)),  # on 4 cores, each split a task's worth
        (1, BYTES_PER_PARTITION + 1, (4, False)),  # larger: spread over every core by key
        (2, 3 * BYTES_PER_PARTITION, (4, False)),
        (0, 0, (1, True)),  # nothing to read (a filter kept no file): one empty task
        (1, None, (4, False)),  # the splits cannot be read here (Spark's reader reads them)
        (4, 4 * MIB, (4, True)),  # as many splits as cores: always in place
    ],
)
def test_splits_of_a_tasks_worth_are_read_in_place_with_a_core_idle(
    splits: int, split_bytes: int | None, expected: tuple[int, bool]
) -> None:
    assert write_tasks(plan(split_bytes or 0), 4, splits, split_bytes=split_bytes) == expected


def test_the_specs_partitions_still_decide() -> None:
    """``write.partitions`` more than the splits: by key, however small they are."""
    assert write_tasks(plan(MIB, partitions=4), 2, 1, split_bytes=MIB) == (4, False)
    assert write_tasks(plan(MIB, partitions=1), 2, 1, split_bytes=MIB) == (1, True)
