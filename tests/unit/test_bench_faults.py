"""The benchmark counts a run's major page faults (bench.measured_cli.major_faults): its
reads of pages the kernel had to fetch from the disk, which a delta run through a store
whose pages were evicted from memory waits for."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from pathlib import Path

from bench.measured_cli import major_faults
from bench.side_by_side import read_back

#: reads every page of the file named by argv[1] through a shared mapping
TOUCH = """
import mmap, sys
with open(sys.argv[1], "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
    m.madvise(mmap.MADV_RANDOM)  # one page a fault, no read-ahead
    print(sum(m[i] for i in range(0, len(m), mmap.PAGESIZE)))
"""


def evicted_file(path: Path, pages: int) -> None:
    """A file of ``pages`` pages on the disk and not in the page cache."""
    with path.open("wb") as f:
        f.write(os.urandom(pages * mmap.PAGESIZE))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def test_a_waited_for_child_s_reads_of_evicted_pages_count_as_its_parent_s_major_faults(tmp_path: Path) -> None:
    store = tmp_path / "data.mdb"
    evicted_file(store, 64)
    before, own = major_faults("self"), major_faults("self", children=False)
    subprocess.run([sys.executable, "-c", TOUCH, str(store)], stdout=subprocess.DEVNULL, check=True)
    # the child read the pages back from the disk: most of 64 faults (some may have stayed cached)
    assert major_faults("self") - before >= 32
    assert major_faults("self", children=False) - own < 32  # they were the child's, not this process's
    evicted_file(store, 64)  # and read again once in the page cache: no major fault
    subprocess.run([sys.executable, "-c", TOUCH, str(store)], stdout=subprocess.DEVNULL, check=True)
    cached = major_faults("self")
    subprocess.run([sys.executable, "-c", TOUCH, str(store)], stdout=subprocess.DEVNULL, check=True)
    assert major_faults("self") - cached < 8


def test_a_process_gone_has_no_faults() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert major_faults(child.pid) == 0


def test_a_delta_row_names_the_median_pages_read_back_of_its_runs_and_of_the_full_ones() -> None:
    entry = {"delta_major_faults": [10, 4_000, 12], "full_major_faults": [0, 3, 1]}
    assert read_back(entry, "delta_major_faults", "full_major_faults") == (
        "; pages read back from the disk (major faults), median 12, full runs 1"
    )
    assert read_back(entry, "delta_major_faults") == "; pages read back from the disk (major faults), median 12"
    assert read_back(entry, "steady_major_faults") == ""  # not measured: nothing said
