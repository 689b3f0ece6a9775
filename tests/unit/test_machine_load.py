"""The machine's load the benchmark prints under its table (bench.machine_load)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.machine_load import LoadSampler, busy_share, cpu_times, describe, returned_to_host_kib


def test_busy_share_is_the_busy_part_of_the_time_that_passed() -> None:
    assert busy_share((100, 1000), (130, 1100)) == 0.3
    assert busy_share((100, 1000), (100, 1000)) == 0.0  # no time passed: not a division by zero
    busy, total = cpu_times()
    assert 0 < busy < total


def test_a_section_that_keeps_a_core_busy_is_seen_busy_and_described() -> None:
    with LoadSampler(interval=0.1) as sampler:
        with sampler.section("idle"):
            time.sleep(0.45)
        with sampler.section("spin"):
            until = time.perf_counter() + 0.6
            while time.perf_counter() < until:
                pass
        time.sleep(0.25)  # samples taken outside a section belong to none
    summary = sampler.summary()
    spin = summary["sections"]["spin"]
    assert spin["samples"] >= 3
    assert spin["cpu_busy"] >= 0.5 / (os.cpu_count() or 1)  # start to end
    # one core of os.cpu_count() spinning the whole time: half a core's share at the least
    assert spin["cpu_busy_max"] >= 0.5 / (os.cpu_count() or 1)
    assert sum(s["samples"] for s in summary["sections"].values()) <= 14
    said = describe(summary)
    assert said.startswith(f"Machine load ({os.cpu_count()} CPUs")
    assert "spin: CPU busy " in said and "idle: CPU busy " in said and "1-min load median" in said


def test_a_section_shorter_than_a_sample_has_its_busy_share_as_a_whole() -> None:
    with LoadSampler(interval=60, reported_kib=Path("/nonexistent")) as sampler, sampler.section("brief"):
        until = time.perf_counter() + 0.1
        while time.perf_counter() < until:
            pass
    brief = sampler.summary()["sections"]["brief"]
    assert brief["samples"] == 0 and brief["cpu_busy"] > 0
    assert describe(sampler.summary()).endswith("brief: CPU busy " + f"{brief['cpu_busy']:.0%}")


def test_the_background_is_measured_before_anything_starts() -> None:
    sampler = LoadSampler()
    sampler.measure_background(0.2)
    assert 0.0 <= sampler.background["cpu_busy"] <= 1.0
    assert sampler.background["load_1m"] >= 0.0
    assert describe(sampler.summary()).count("before the run") == 1


def test_memory_returned_to_the_host_is_counted_per_section_where_the_kernel_reports_it(tmp_path: Path) -> None:
    reported = tmp_path / "reported_kib"
    reported.write_text("1000\n")
    assert returned_to_host_kib(reported) == 1000
    assert returned_to_host_kib(tmp_path / "missing") is None
    sampler = LoadSampler(interval=60, reported_kib=reported)
    with sampler, sampler.section("quiet"):
        pass
    with sampler.section("churn"):
        reported.write_text(str(1000 + 3 * 2**20))  # 3 GiB handed back meanwhile
    sections = sampler.summary()["sections"]
    assert sections["quiet"]["returned_to_host_kib"] == 0
    assert sections["churn"]["returned_to_host_kib"] == 3 * 2**20
    assert describe(sampler.summary()).endswith(
        "returned to the host (free page reporting: its next first "
        "touch faults on the host, see bench.machine_load): quiet 0.0 GiB, "
        "churn 3.0 GiB"
    )


def test_no_host_memory_is_said_where_the_kernel_does_not_report_it(tmp_path: Path) -> None:
    sampler = LoadSampler(interval=60, reported_kib=tmp_path / "missing")
    with sampler, sampler.section("any"):
        pass
    assert "returned_to_host_kib" not in sampler.summary()["sections"]["any"]
    assert "host" not in describe(sampler.summary())
