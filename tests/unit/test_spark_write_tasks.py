"""How many Spark write tasks a load has, and whether they read the snapshot's splits
themselves or Spark reads the table by key (bulldozer.load.engines.spark.write_tasks)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from bulldozer.load.engines.spark import BY_KEY_COST, BYTES_PER_PARTITION, write_tasks

MIB = 1024 * 1024


def plan(total_bytes: int, partitions: int | None = None) -> Any:
    """A load plan whose snapshot's data files hold ``total_bytes``."""
    snapshot = SimpleNamespace(summary={"total-files-size": str(total_bytes)})
    table = SimpleNamespace(snapshot_by_id=lambda _id: snapshot)
    write = SimpleNamespace(partitions=partitions)
    return SimpleNamespace(table=table, snapshot_id=1, spec=SimpleNamespace(key_value_dal=SimpleNamespace(write=write)))


@pytest.mark.parametrize(
    ("cores", "sizes", "expected"),
    [
        (4, [5 * MIB], (1, True)),  # one small file: its task reads it, cores idle
        (4, [], (1, True)),  # nothing to read (a filter kept no file): one empty task
        (2, [2048 * MIB], (1, True)),  # one large file on two cores: the read by key costs more
        (12, [BYTES_PER_PARTITION + 1], (1, True)),  # ... and on twelve
        (13, [BYTES_PER_PARTITION + 1], (13, False)),  # on thirteen it is faster spread by key
        (64, [BYTES_PER_PARTITION], (1, True)),  # a task's worth: never by key
        (24, [96 * MIB, 96 * MIB], (2, True)),  # two files: by key takes more than 24 cores
        (25, [96 * MIB, 96 * MIB], (25, False)),
        (25, [48 * MIB, 48 * MIB], (2, True)),  # ... and a file larger than 64 MiB
        (32, [2048 * MIB, 2048 * MIB], (64, False)),  # one task per 64 MiB, by key
        (16, [1024 * MIB, MIB], (17, False)),  # the largest file sets the pace
        (4, [4 * MIB] * 4, (4, True)),  # as many splits as cores: always in place
    ],
)
def test_fewer_splits_than_cores_are_read_in_place_unless_by_key_ends_sooner(
    cores: int, sizes: list[int], expected: tuple[int, bool]
) -> None:
    assert BY_KEY_COST == 12
    assert write_tasks(plan(sum(sizes)), cores, sizes) == expected


def test_splits_spark_s_reader_must_read_are_read_by_key() -> None:
    """No split sizes: the local reader cannot read the snapshot (Avro files, equality
    deletes it cannot apply exactly): Spark's reader reads it, by key."""
    assert write_tasks(plan(MIB), 4, None) == (4, False)


def test_the_specs_partitions_still_decide() -> None:
    """``write.partitions`` more than the splits: by key, however small they are."""
    assert write_tasks(plan(MIB, partitions=4), 2, [MIB]) == (4, False)
    assert write_tasks(plan(MIB, partitions=1), 2, [MIB]) == (1, True)
