"""Run ``bulldozer ARGS`` in this process and print, at exit, a line ``RSS <self>``: the peak
resident set (VmHWM, KiB) of this process, and a line ``FAULTS <n>``: the major page faults
of this process and of the children it waited for (``major_faults``).
``peak_of_descendants`` is what the benchmark polls meanwhile: the peak RSS of the
command's descendants together (the embedded DAL with its bulldozer-kvd, or Spark's JVM and
workers: the largest sum of their peaks seen while polling /proc), and the largest sum of
their anonymous (private) resident memory. The last one matters for the DAL: LMDB maps its
data file, so every page of the store the DAL touched counts in its RSS as file-backed page
cache, which the kernel can drop; its anonymous memory is what the processes themselves
hold.

VmHWM, not ``getrusage``'s ``ru_maxrss``: on Linux the latter keeps the high-water mark of
the process that forked the child, so a benchmark holding gigabytes would be charged to
every command it starts.

The measured command runs in this module's process, so the module imports only what Python
imports anyway to run it (``os``, ``sys``, ``runpy``): no pathlib or threading, which a
command handed to a warm loader does not import itself (pathlib alone took 13 ms of the
28 ms this module's import took with it)."""

from __future__ import annotations

import os
import runpy
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading


def status_kib(pid: int | str, field: str) -> int:
    """A ``/proc/PID/status`` memory field (``VmHWM``, ``RssAnon``…) in KiB, 0 if gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def vm_hwm_kib(pid: int | str) -> int:
    return status_kib(pid, "VmHWM")


def stat_fields(pid: int | str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (the state first, the parent's
    pid second…); none if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def major_faults(pid: int | str, children: bool = True) -> int:
    """The major page faults of ``pid`` (its reads of pages the kernel had to fetch from the
    disk: for the DAL, pages of the store's file not in the page cache), with ``children``
    those of the children it has waited for too (the embedded DAL and its bulldozer-kvd, for
    a run); 0 if gone."""
    fields = stat_fields(pid)
    if not fields:
        return 0
    return int(fields[9]) + (int(fields[10]) if children else 0)  # majflt, cmajflt


def descendants(root: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            ppid = int(stat_fields(name)[1])
        except (IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def peak_of_descendants(root: int, done: threading.Event, every: float = 0.25) -> tuple[int, int, int]:
    """Poll ``root`` and its descendants until ``done`` is set; the largest sum of the
    descendants' peak RSS (VmHWM) and of their anonymous resident memory seen, and the
    largest anonymous resident memory of ``root`` itself, in KiB. Run from the process that
    started ``root`` (the benchmark), so the polling costs the measured command nothing: in
    the command's own process, reading /proc every 0.25 s took its GIL (≈ 2 % of a 5 s run)."""
    peak = peak_anon = root_anon = 0
    while True:
        pids = descendants(root)
        peak = max(peak, sum(vm_hwm_kib(pid) for pid in pids))
        peak_anon = max(peak_anon, sum(status_kib(pid, "RssAnon") for pid in pids))
        root_anon = max(root_anon, status_kib(root, "RssAnon"))
        if done.wait(every):
            return peak, peak_anon, root_anon


def main() -> None:
    """``python -m bench.measured_cli ARGS``: ``bulldozer ARGS`` run by the ``bulldozer``
    command's entry point in this process, with ``BULLDOZER_LOADER=off``, so no loader takes
    it (a run handed over is started as the installed command: ``bench.common.run_cli``)."""
    args = sys.argv[1:]
    os.environ["BULLDOZER_LOADER"] = "off"
    module = "bulldozer.cli.entry"
    sys.argv = ["bulldozer", *args]
    try:
        runpy.run_module(module, run_name="__main__")
    finally:
        sys.stderr.write(f"\nRSS {vm_hwm_kib('self')}\nFAULTS {major_faults('self')}\n")


if __name__ == "__main__":
    main()
