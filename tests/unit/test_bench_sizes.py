"""``bench/run``'s flags reach the sizes they name (bench.side_by_side.sizes_from)."""

from __future__ import annotations

import dataclasses

from bench.side_by_side import Sizes, argument_parser, sizes_from


def test_every_size_flag_lands_in_the_field_of_its_name() -> None:
    """A field once added to ``Sizes`` between two others shifted the flags passed after it
    by position: a full run's delta table had 6 files (``--delta-steady``) where it should
    have had 100, and its steady deltas numbered 80 (``--delta-cycle``)."""
    flags = ["--repeat", "--feast-rows", "--read-calls", "--limit-rows", "--spark-rows", "--delta-rows",
             "--delta-remote-rows", "--delta-steady", "--delta-cycle", "--upsert-rows"]  # fmt: skip
    fields = {f.name for f in dataclasses.fields(Sizes)}
    argv: list[str] = []
    for n, flag in enumerate(flags):
        assert flag[2:].replace("-", "_") in fields, flag
        argv += [flag, str(1_000 + n)]
    sizes = sizes_from(argument_parser().parse_args(argv))
    for n, flag in enumerate(flags):
        assert getattr(sizes, flag[2:].replace("-", "_")) == 1_000 + n, flag


def test_a_full_run_without_flags_has_the_documented_sizes() -> None:
    sizes = sizes_from(argument_parser().parse_args([]))
    defaults = Sizes(feast_rows=0, read_calls=0, limit_rows=0, spark_rows=0, scale_rows=[], flip_sizes=[], repeat=0)
    assert (sizes.delta_files, sizes.delta_steady, sizes.delta_cycle) == (100, 6, 80)
    for field in ("delta_files", "spark_cluster", "spark_one_file_rows", "shared_servers", "upsert_files"):
        assert getattr(sizes, field) == getattr(defaults, field), field
    assert sizes_from(argument_parser().parse_args(["--quick"])).delta_files == 10
