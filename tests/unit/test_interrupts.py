"""``bulldozer.interrupts``: an interruption is raised at once, or, in a shielded section of
its thread, as that section ends; a section of another thread shields nothing."""

from __future__ import annotations

import threading

import pytest

from bulldozer.interrupts import interrupt, shielded


class Stop(KeyboardInterrupt):
    pass


def test_an_interruption_outside_a_section_is_raised_at_once() -> None:
    with pytest.raises(Stop):
        interrupt(Stop())


def test_an_interruption_in_a_section_is_raised_as_the_outermost_ends() -> None:
    ran = []
    with pytest.raises(Stop, match="first"), shielded():
        with shielded():
            interrupt(Stop("first"))
            ran.append("inner")
        interrupt(Stop("second"))  # the first one wins
        ran.append("outer")
    assert ran == ["inner", "outer"]
    interrupt_again = Stop("later")
    with pytest.raises(Stop, match="later"):  # nothing is left pending
        interrupt(interrupt_again)


def test_a_section_of_another_thread_shields_nothing() -> None:
    entered, leave = threading.Event(), threading.Event()

    def other() -> None:
        with shielded():
            entered.set()
            leave.wait(10)

    worker = threading.Thread(target=other)
    worker.start()
    entered.wait(10)
    try:
        with pytest.raises(Stop):
            interrupt(Stop())
    finally:
        leave.set()
        worker.join()


def test_an_error_raised_as_an_interruption_unwinds_stands_for_it() -> None:
    """A library's clean-up that fails while an interruption unwinds through it (py4j's, as
    an RDD's collect() exits) hides the interruption: unwound_from finds it again."""
    from bulldozer.interrupts import unwound_from

    stop = Stop()
    try:
        try:
            raise stop
        finally:
            raise RuntimeError("Answer from Java side is empty")
    except RuntimeError as exc:
        hidden: BaseException = exc
    assert unwound_from(hidden) is stop
    try:
        try:
            raise ValueError("not an interruption")
        except ValueError:
            raise RuntimeError("handling it failed") from None
    except RuntimeError as exc:
        assert unwound_from(exc) is None
    assert unwound_from(stop) is None  # an interruption itself unwound from nothing
