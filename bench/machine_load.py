"""The machine's load while a benchmark runs, to print beside its table.

The machines are small and shared: a ratio means little without the load it was measured
under. Three things are read from the kernel:

- **CPU busy**: the share of the machine's CPU time (all cores) spent outside idle and
  I/O wait, from ``/proc/stat``, over each interval; the benchmark's own processes count
  in it while it runs. Measured for a few seconds before anything starts, it is what
  *else* keeps the machine busy (the background).
- **1-minute load average** (``os.getloadavg``): runnable and waiting tasks, smoothed.
- **Memory returned to the host** (a virtual machine's virtio-balloon *free page
  reporting*, ``/sys/module/page_reporting/parameters/reported_kib``): memory the guest
  freed and handed back. Its next first touch faults on the host, which is slow: on the
  2-core machine, touching 16 GiB took 35 s the first time and 2.8 s the second, and
  whole 2 M-row local runs took 2.74-3.16 s (median 2.83) with reporting on against
  2.64-2.66 s with it off and the memory touched once (three runs each, one store), the
  seal's merge of a Spark run 1.33 s against 0.55 s once the memory was touched. Where a
  section's processes free and allocate much (Spark's JVM, the stores' page cache), its
  times carry that cost. The setting is the machine's: the benchmark reports it, and
  changes nothing.

``LoadSampler`` samples both once a second on a thread; ``section(name)`` attributes the
samples taken meanwhile to that section and measures its CPU busy share start to end, and ``summary()`` is the JSON the results file
keeps, ``describe(summary)`` its one paragraph under the printed table.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["REPORTED_KIB", "LoadSampler", "busy_share", "cpu_times", "describe", "returned_to_host_kib"]

#: /proc/stat's cpu columns: user nice system idle iowait irq softirq steal (guest time is in user)
_IDLE_COLUMNS = (3, 4)

#: what the kernel's free page reporting has handed back to the host, KiB since boot
REPORTED_KIB = Path("/sys/module/page_reporting/parameters/reported_kib")


def returned_to_host_kib(path: Path = REPORTED_KIB) -> int | None:
    """KiB of freed memory the kernel has returned to the host since boot (None where it
    does not report free pages: not a virtual machine, or no balloon device)."""
    try:
        return int(path.read_text(encoding="ascii"))
    except (OSError, ValueError):
        return None


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat's first line."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(x) for x in stat.readline().split()[1:9]]
    idle = sum(fields[i] for i in _IDLE_COLUMNS)
    total = sum(fields)
    return total - idle, total


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The fraction of CPU time busy between two ``cpu_times`` readings (0 when none passed)."""
    busy, total = after[0] - before[0], after[1] - before[1]
    return busy / total if total > 0 else 0.0


class LoadSampler:
    """Samples CPU busy and the 1-minute load average every ``interval`` seconds."""

    def __init__(self, interval: float = 1.0, reported_kib: Path = REPORTED_KIB) -> None:
        self.interval = interval
        self.reported_kib = reported_kib
        self._returned: dict[str, int] = {}  # per section: KiB returned to the host, start to end
        self.background: dict[str, float] = {}
        self._sections: dict[str, list[tuple[float, float]]] = {}
        self._whole: dict[str, float] = {}  # per section: its CPU busy share, start to end
        self._current: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def measure_background(self, seconds: float = 3.0) -> None:
        """The load before the benchmark starts anything: CPU busy over ``seconds``."""
        before = cpu_times()
        time.sleep(seconds)
        self.background = {"cpu_busy": busy_share(before, cpu_times()), "load_1m": os.getloadavg()[0]}

    def __enter__(self) -> LoadSampler:
        self._thread = threading.Thread(target=self._run, name="bench-load", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Attribute the samples taken meanwhile to ``name``, and measure its CPU busy share
        as a whole (a section shorter than a sample has that alone)."""
        with self._lock:
            self._current = name
            self._sections.setdefault(name, [])
        before, returned = cpu_times(), returned_to_host_kib(self.reported_kib)
        try:
            yield
        finally:
            self._whole[name] = busy_share(before, cpu_times())
            if returned is not None and (now := returned_to_host_kib(self.reported_kib)) is not None:
                self._returned[name] = now - returned
            with self._lock:
                self._current = None

    def _run(self) -> None:
        last = cpu_times()
        while not self._stop.wait(self.interval):
            now = cpu_times()
            sample = (busy_share(last, now), os.getloadavg()[0])
            last = now
            with self._lock:
                if self._current is not None:
                    self._sections[self._current].append(sample)

    def summary(self) -> dict[str, Any]:
        """The background and, per section, its CPU busy share as a whole and the median and
        largest of its samples' CPU busy share and load."""
        with self._lock:
            sections = {name: list(samples) for name, samples in self._sections.items()}
        out: dict[str, Any] = {"cpus": os.cpu_count(), "background": dict(self.background), "sections": {}}
        for name, samples in sections.items():
            entry: dict[str, Any] = {"cpu_busy": self._whole.get(name, 0.0), "samples": len(samples)}
            if name in self._returned:
                entry["returned_to_host_kib"] = self._returned[name]
            if samples:
                busy, load = [s[0] for s in samples], [s[1] for s in samples]
                entry |= {
                    "cpu_busy_median": statistics.median(busy),
                    "cpu_busy_max": max(busy),
                    "load_1m_median": statistics.median(load),
                    "load_1m_max": max(load),
                }
            out["sections"][name] = entry
        return out


def describe(summary: dict[str, Any]) -> str:
    """One paragraph: the load before the run and during each section."""
    parts = []
    if background := summary.get("background"):
        parts.append(
            f"before the run (nothing of the benchmark running) CPU busy {background['cpu_busy']:.0%}, "
            f"1-min load {background['load_1m']:.2f}"
        )
    for name, s in summary.get("sections", {}).items():
        said = f"{name}: CPU busy {s['cpu_busy']:.0%}"
        if s["samples"]:
            said += (
                f" (a second's median {s['cpu_busy_median']:.0%}, max {s['cpu_busy_max']:.0%}), "
                f"1-min load median {s['load_1m_median']:.2f} (max {s['load_1m_max']:.2f})"
            )
        parts.append(said)
    returned = [
        f"{name} {s['returned_to_host_kib'] / 2**20:.1f} GiB"
        for name, s in summary.get("sections", {}).items()
        if "returned_to_host_kib" in s
    ]
    cpus = summary.get("cpus")
    said = f"Machine load ({cpus} CPUs; during a section the benchmark's own processes count): " + "; ".join(parts)
    if returned:
        said += (
            ". Freed memory the kernel returned to the host (free page reporting: its next first touch "
            "faults on the host, see bench.machine_load): " + ", ".join(returned)
        )
    return said
