"""Where an interruption may not land: a command-line process turns Ctrl-C, SIGTERM, SIGHUP
and its time limit into an exception raised in its main thread wherever that thread is
(bulldozer.cli.process), so that a run unwinds: its version recorded as failed, its DAL
stopped, its files removed. Some library code is not safe to interrupt at an arbitrary
point. gRPC's channel counts the calls its polling thread must wait for, and starts that
thread, as it creates a call: an exception raised between the two left a call no thread
would ever complete, and the run hung for ever in its clean-up, waiting for that call's
acknowledgement or for the channel to close (3 runs of 30 given SIGTERM mid-load).

``shielded()`` marks such a section: an interruption that arrives in it is raised as the
section ends (``interrupt``, called by the signal handlers, raises it at once otherwise).
Sections are short (the creation of a call, not its wait), so a signal waits microseconds.
A section in another thread shields nothing: handlers run in the main thread only.

This module imports nothing heavy: the command line's entry point imports it (through its
process tuning) before it hands a run over to a warm loader.
"""

from __future__ import annotations

import _thread

__all__ = ["interrupt", "shielded", "unwound_from"]

#: thread id -> how many shielded sections it is in
_depth: dict[int, int] = {}
#: thread id -> the interruption that arrived in its shielded section, raised as it ends
_pending: dict[int, BaseException] = {}


class shielded:
    """``with shielded():`` a section an interruption may not land in (see the module's docstring)."""

    __slots__ = ("_thread",)

    def __enter__(self) -> None:
        self._thread = _thread.get_ident()
        _depth[self._thread] = _depth.get(self._thread, 0) + 1

    def __exit__(self, *_: object) -> None:
        left = _depth.pop(self._thread) - 1
        if left:
            _depth[self._thread] = left
        elif (exc := _pending.pop(self._thread, None)) is not None:
            raise exc


def interrupt(exc: BaseException) -> None:
    """Raise ``exc`` (from a signal handler, in the main thread): now, or, when the thread is
    in a shielded section, as the section ends (the first interruption wins)."""
    thread = _thread.get_ident()
    if _depth.get(thread):
        _pending.setdefault(thread, exc)
        return
    raise exc


def unwound_from(exc: BaseException) -> BaseException | None:
    """The interruption (a ``KeyboardInterrupt``: Ctrl-C, SIGTERM, SIGHUP, a time limit)
    that ``exc`` was raised while unwinding from, if any. A library's clean-up can fail as
    an interruption unwinds through it and hide the interruption behind its own error:
    pyspark's ``RDD.collect`` resets its call site on the JVM as it exits, over py4j, whose
    interrupted call has just shut the connections down ("Answer from Java side is empty").
    What stopped the run is the interruption, not that error."""
    seen: set[int] = set()
    context = exc.__context__
    while context is not None and id(context) not in seen:
        if isinstance(context, KeyboardInterrupt):
            return context
        seen.add(id(context))
        context = context.__context__
    return None
