"""bulldozer.versioning.run_state.RunRecord as a version keeps it: what a run writes reads
back the same, and a record whose parts are not of their type is none."""

from __future__ import annotations

import pytest

from bulldozer.load.shadow_read import ShadowReadReport
from bulldozer.versioning.run_state import RunRecord


def test_a_record_with_a_shadow_read_and_a_delta_reads_back_the_same() -> None:
    shadow = ShadowReadReport(live="a__v1", seed=7, sampled=1_000, missing=2, added=3, changed=40, same=955)
    delta = {"base": "a__v1", "base_snapshot": 5, "files_removed": 1, "files_added": 2, "rows_read": 9}
    record = RunRecord(
        run_id="r", job="a", alias="a", mode="delta", shadow_read=shadow.as_dict(),
        delta={**delta, "deleted": 1, "changed": 2, "added": 3, "unchanged": 4},  # type: ignore[typeddict-item]
    )  # fmt: skip
    assert RunRecord.from_json(record.to_json()) == record
    assert RunRecord.from_json(RunRecord(run_id="r", job="a", alias="a").to_json()).shadow_read == {}


@pytest.mark.parametrize(
    "part", ['"shadow_read": {"sampled": 3}', '"delta": {"base": "a__v1"}', '"shadow_read": {"sampled": "many"}']
)
def test_a_part_its_readers_cannot_use_makes_it_no_record(part: str) -> None:
    with pytest.raises(ValueError):
        RunRecord.from_json('{"run_id": "r", "job": "a", "alias": "a", ' + part + "}")


def test_a_delta_run_says_how_many_records_it_took_by_key(capsys: pytest.CaptureFixture[str]) -> None:
    """``bulldozer run``'s line of a delta: files read, records taken by key (an older
    record has neither of the fields that say which), and what changed."""
    from bulldozer.cli.run_cmds import _say_outcome

    delta = {"base": "a__v1", "base_snapshot": 5, "files_removed": 0, "files_added": 1, "rows_read": 9}
    delta |= {"deleted": 1, "changed": 2, "added": 3, "unchanged": 4}
    for extra, said in (
        ({"files_reread": 2, "deleted_by_key": 1_500}, "9 rows read from 3 changed files and 1,500 records by key; "),
        ({}, "9 rows read from 1 changed files; "),
    ):
        record = RunRecord(run_id="r", job="a", alias="a", version="a__v2", mode="delta", delta={**delta, **extra})  # type: ignore[typeddict-item]
        _say_outcome(record, "embedded", None, as_json=False, quiet=True)
        out = " ".join(capsys.readouterr().out.split())
        assert said + "3 keys added, 2 changed, 1 deleted" in out, out
