"""Process tuning, in one place: what a ``bulldozer`` process started from the command line
may do to itself, and only then. The CLI's ``main`` calls ``before_imports`` and marks the
process as its own (``claim``); commands invoked in-process (tests, an embedding program,
an Airflow worker) leave the interpreter as they found it.

- BLAS threads (``before_imports``): OpenBLAS's worker threads spun for 0.08 s of CPU per
  process at start-up, and nothing here uses BLAS; the DAL a run starts inherits it.
- pydantic's plugins (``before_imports``): the first model pydantic builds looks for
  plugins in every installed distribution's entry points (183 in this project's
  environment: 11-13 ms), and Bulldozer uses none; an explicit (non-empty)
  ``PYDANTIC_DISABLE_PLUGINS`` stands (``bulldozer validate``: 290 -> 277 ms, medians of 20
  alternating).
- The cyclic collector (``claim``, ``started``, ``run_ended``, ``exiting``).
- The standard streams (``standard_streams``, from the entry point and ``claim``): open
  even when the process was started without one, and writing what their encoding lacks as
  an escape.
- SIGTERM (``claim``): a scheduler stops a task with it (Airflow on a timeout or a task
  marked failed). The command unwinds as from Ctrl-C, raising ``Terminated`` in the main
  thread: its run is recorded as failed, its DAL and data plane are stopped, its temporary
  files removed, and it exits 143 with one line. A second SIGTERM ends it at once.
- SIGHUP (``claim``): the terminal a command runs in closed (an SSH session dropped). It
  ended the process on the spot, saying nothing (exit 129): a run's version was left
  LOADING, "not heard from", its temporary files for the next process to sweep. It now stops
  the command as SIGTERM does (the run recorded as failed: "the process got SIGHUP"), exit
  129; the line goes nowhere when the terminal is gone.
- Open files (``claim``, ``raise_open_files_limit``): the soft limit on open file
  descriptors is raised to the hard one, as Go's runtime does for the native data plane and
  the JVM for Spark and Cassandra. Linux starts most sessions and services at a soft 1,024
  (systemd's default, its hard 524,288), and a Python data plane with as many clients then
  stopped accepting connections, gRPC saying "File descriptor limit reached" every second,
  while the hard limit allowed hundreds of times more. The DAL a run starts, the warm
  loader's children and Spark's workers inherit it.
- Where an interruption may not land (``bulldozer.interrupts``): Ctrl-C, SIGTERM, SIGHUP
  and the time limit are raised in the main thread wherever it is, except inside a section
  that ``interrupts.shielded`` marks (a gRPC call being created), where they are raised as
  the section ends.
- The time limit (``TimeLimit``): a run whose spec or operator sets one (``metadata.timeout``,
  ``BULLDOZER_RUN_TIMEOUT``) gets SIGALRM when it passes, which raises ``TimeLimitExceeded``
  in the main thread: the run unwinds as from SIGTERM (recorded as failed, its DAL stopped,
  its files removed) and exits 1 with one line saying which limit it passed. Airflow applies
  the same limit to each stage task (its ``execution_timeout``), in the same way.
- Lazy imports: pandas is kept out of a local run (``without_pandas``), and modules that
  build large tables when imported but that most commands never use are executed only when
  first used (``DEFERRED``, applied by ``claim``): pyiceberg's table module imports its
  string-filter parser, whose pyparsing grammar took ≈ 50 ms of every run's start-up (importing
  pyiceberg.table: 0.244 s → 0.193 s, medians of 8), while
  only a spec's ``filter`` needs it; pyiceberg's configuration module imports strictyaml
  (and dateutil with it: 25 ms, and 0.8 MB of source an empty bytecode cache compiles),
  which only a ``~/.pyiceberg.yaml`` needs. pyiceberg's pydantic models (about 200:
  table metadata, its updates and requirements, expressions, types) are built when first
  used, not when their modules are imported (``DEFERRED_MODELS``, applied by ``claim``:
  pydantic's ``defer_build`` set on pyiceberg's two model bases as their module is
  imported): a run uses a few dozen of them, and building all of them took ≈ 0.13 s of a
  one-shot run's imports (a 500 k-row run: 90-100 ms less CPU, 60-85 ms less time, its
  schema stage 0.174 → 0.157 s; medians of 10 and 12 pairs). A warm loader builds them all
  before it forks (``build_deferred_models``), so that its children do not build them again
  for every run.
- The end (``end_when_done``, ``ending``, applied by the ``bulldozer`` entry point): after
  a command has returned or exited with a code, and the interpreter has waited for its
  threads and run its other exit handlers (logging's flush among them), the process ends
  there, with the command's exit code, without the interpreter tearing itself down module
  by module and object by object to free memory the kernel frees at once (20-30 ms of a
  run's exit, measured side by side on a 500 k-row run). An unexpected exception, or a
  failed flush of stdout, ends the usual way. This module imports nothing heavy at import
  (the finders below are plain classes, their machinery imported when used; ``signal``,
  whose constants are an ``enum``, by the functions that use it), so that the entry point
  can use it before it hands a run over to a warm loader.
- Compiling ahead (``compile_ahead``, applied by the ``bulldozer`` entry point to a run that
  no warm loader took): when the bytecode cache holds none of a run's modules (an install
  that compiled nothing, an image built with ``PYTHONDONTWRITEBYTECODE``, a new
  ``PYTHONPYCACHEPREFIX``), the run compiles about 12 MB of source as it imports it, one
  module after another under the GIL: 2.5-2.6 s for a 100 k-row run whose warm run takes 1.0 s.
  A child process then compiles the run's modules (``RUN_MODULES``, written from a real run by
  scripts/gen_run_modules.py) into the cache from the last the run imports, while the run
  compiles from the first, so the second core takes half of the compiling: that run then
  takes 1.85-1.87 s.
- The allocator (``use_load_memory_pool``): a load decodes and encodes a stream of batches,
  every batch allocating tens of MiB and freeing them a moment later. pyarrow's default
  pool on Linux (mimalloc) hands such memory back to the kernel and takes fresh pages for
  the next batch, each zeroed by the kernel first: profiled on a 2 M-row load, the reader
  threads spent 75 % of their CPU (≈ 1.8 s) clearing pages. jemalloc keeps freed pages for
  reuse: the same load takes ≈ 1 s less CPU and ≈ 0.4 s less time. Spark's Python workers
  get the same pool through the session's ``spark.executorEnv``. ``pa.set_memory_pool`` sets
  the pool pyarrow's Python calls allocate from; Arrow's C++ allocates from its own default
  (the Parquet reader's decompression buffers, 13 MiB of a 500 k-row file), which only
  ``ARROW_DEFAULT_MEMORY_POOL`` chooses, read once as pyarrow is imported: ``before_imports``
  sets it. With mimalloc there, a one-shot 500 k-row run took 14 transparent huge pages
  (2 MiB each, cleared by the kernel as first touched: 4 % of the run's CPU in one profile),
  jemalloc none. Side by side on that run, alternating, 10 runs each: 0.73 → 0.61 s (system
  CPU 0.31 → 0.19 s, the load stage 0.27 → 0.14 s) right after the benchmark had freed
  memory, 0.80 → 0.73 s (0.25 → 0.21 s, 0.19 → 0.17 s) an hour later; in two other sessions
  the medians were within noise (0.655 → 0.660 s, the slowest run 0.88 → 0.77 s). What it
  saves depends on the huge pages the kernel has free.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import warnings

from bulldozer import interrupts

# typing.TYPE_CHECKING without importing typing: the entry point imports this module before
# it hands a run over to a warm loader, and that caller imports as little as it can
TYPE_CHECKING = False
if TYPE_CHECKING:
    import importlib.abc
    import importlib.machinery
    from collections.abc import Mapping, Sequence
    from types import ModuleType
    from typing import Any

__all__ = [
    "DEFERRED",
    "DEFERRED_MODELS",
    "RUN_MODULES",
    "Terminated",
    "TimeLimit",
    "TimeLimitExceeded",
    "before_imports",
    "build_deferred_models",
    "claim",
    "collect_again",
    "compile_ahead",
    "compile_run_modules",
    "end_when_done",
    "ending",
    "exit_status",
    "exiting",
    "interruption",
    "module_source",
    "owned",
    "raise_open_files_limit",
    "run_ended",
    "run_modules",
    "standard_streams",
    "started",
    "to_null",
    "unbuilt_models",
    "use_load_memory_pool",
    "without_pandas",
]

_owned = False
#: the exit status the command ended with, once it did (``end_when_done``)
_status: int | None = None

#: modules executed only when one of their attributes is first used (``claim``)
DEFERRED = ("pyiceberg.expressions.parser", "strictyaml")
#: module -> its pydantic model bases whose subclasses are built when first used (``claim``)
DEFERRED_MODELS = {"pyiceberg.typedef": ("IcebergBaseModel", "IcebergRootModel")}


#: the modules a one-shot run imports, one a line, in the order it starts importing them
#: (``compile_ahead``); written by scripts/gen_run_modules.py from a real run
RUN_MODULES = os.path.join(os.path.dirname(__file__), "run_modules.txt")


def standard_streams() -> None:
    """Standard input, output and error as a command needs them (called first by the
    ``bulldozer`` entry point, and by ``claim``):

    - the null device on each of descriptors 0, 1 and 2 the process was started without.
      Python leaves ``sys.stderr`` None then, and a run started with ``2>&-`` failed before
      it read a row, saying nothing; and the next file the process opened took the free
      descriptor, so whatever a library writes to "standard error" would have gone into it;
    - a character the output's encoding lacks written as an escape (``\u2713``): under a
      legacy locale or ``PYTHONIOENCODING=ascii``, a run that had flipped its alias printed
      its ``✓`` line, raised ``UnicodeEncodeError`` and exited 1 with a traceback, so a
      scheduler marked the successful run failed and ran it again."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            to_null(fd)
        stream = getattr(sys, name)
        if stream is None:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False, errors="backslashreplace"))  # noqa: SIM115
        elif fd and (reconfigure := getattr(stream, "reconfigure", None)) is not None:
            reconfigure(errors="backslashreplace")


def to_null(fd: int) -> None:
    """Point descriptor ``fd`` at the null device (what is written to it goes nowhere)."""
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)


def before_imports() -> None:
    """Called first thing by the CLI's entry point, before anything imports numpy."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if not os.environ.get("PYDANTIC_DISABLE_PLUGINS"):  # an explicit setting stands
        os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
    # gRPC's core logs its errors only: its INFO notice when a process with channels forks
    # (starting Spark's JVM does) is not for users
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    # Arrow's C++ allocator (see the module's docstring); an explicit setting stands. Linux's
    # pyarrow builds ship jemalloc (elsewhere Arrow would warn that it has none)
    if sys.platform == "linux" and not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "jemalloc"


def use_load_memory_pool() -> str:
    """Make jemalloc Arrow's default pool in this process (when pyarrow was built with it
    and the environment chose no pool: an explicit ``ARROW_DEFAULT_MEMORY_POOL`` stands);
    returns the name of the pool in use."""
    import contextlib

    import pyarrow as pa

    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        with contextlib.suppress(NotImplementedError):  # a pyarrow without jemalloc keeps its default
            pa.set_memory_pool(pa.jemalloc_memory_pool())
    name = str(pa.default_memory_pool().backend_name)
    import logging

    logging.getLogger(__name__).debug("Arrow memory pool: %s", name)
    return name


def claim() -> None:
    """Called by the CLI's ``main``: this interpreter runs one command and exits. The cyclic
    collector is off until the command says otherwise (``collect_again`` for most, as soon
    as it is known; ``started`` for a run, once it is set up): what start-up allocates
    (imported modules, pyiceberg's objects) lives to the end, and the full
    collections it set off walked all of it for nothing, 0.15-0.2 s of a run."""
    import signal

    global _owned
    _owned = True
    gc.disable()
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # an ignored SIGINT stays ignored
        signal.signal(signal.SIGINT, _interrupt)
    standard_streams()
    raise_open_files_limit()
    warnings.showwarning = _one_line_warning
    if not any(isinstance(f, _Deferred) for f in sys.meta_path):
        sys.meta_path.insert(0, _Deferred(DEFERRED, DEFERRED_MODELS))


def raise_open_files_limit() -> None:
    """Raise this process's soft limit on open files to its hard limit (what it may raise
    it to without privilege). A hard limit the kernel does not take as a soft one
    (unlimited, above ``fs.nr_open``) leaves the soft limit as it was."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:  # noqa: SIM105 (this module imports no contextlib: see its docstring)
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def _one_line_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """A library's warning (``warnings.warn``) as a command shows it: ``warning: MESSAGE`` on
    one line, its control characters escaped (``redaction.visible``). Python's own display
    is two lines, the library's file and line and then its source line (SQLAlchemy's about
    an operator's catalog URI, under the one line a failed command prints)."""
    import contextlib

    from bulldozer.redaction import visible

    out = sys.stderr if file is None else file
    if out is not None:
        with contextlib.suppress(OSError, ValueError):  # as Python's own: a closed or broken stream loses it
            out.write(f"warning: {visible(str(message).strip())}\n")


def unbuilt_models() -> list[type]:
    """The models ``claim`` left to be built when first used that are not built yet, of the
    modules imported so far."""
    unbuilt: list[type] = []
    for module, bases in DEFERRED_MODELS.items():
        if module not in sys.modules:
            continue
        todo: list[type] = [getattr(sys.modules[module], base) for base in bases]
        seen: set[type] = set()
        while todo:
            model = todo.pop()
            if model not in seen:
                seen.add(model)
                todo.extend(model.__subclasses__())
                if not model.__dict__.get("__pydantic_complete__", True):
                    unbuilt.append(model)
    return unbuilt


def build_deferred_models() -> int:
    """Build every model ``claim`` left to be built when first used, of the modules imported
    so far (a warm loader, before it forks its children); how many it built."""
    built = 0
    for model in unbuilt_models():
        if model.__dict__.get("__pydantic_complete__", True):
            continue  # built along with one built before it
        # one that cannot be built yet (an unresolved annotation) is left to its first use, as in a one-shot run
        built += bool(model.model_rebuild(raise_errors=False))  # type: ignore[attr-defined]
    return built


def compile_ahead(argv: Sequence[str]) -> int | None:
    """Called by the entry point before a run (``bulldozer ARGV``) imports its modules: when
    the bytecode cache has the last of them (``RUN_MODULES``) not yet compiled and this
    interpreter may write the cache, start a child that compiles the run's modules, from the
    last to the first, while the run imports (and compiles what it finds uncompiled) from the
    first. Python writes each cache file whole (written aside, then renamed), so either
    process reads a complete one or compiles the module itself. Nothing is started on a
    single core, for any other command, where the cache may not be written, or when the flags
    or the environment the child would inherit could resolve modules differently. The
    child's pid, or None."""
    from bulldozer.cli.commands import invoked

    flags = sys.flags
    if invoked(argv) != "run" or sys.dont_write_bytecode or flags.optimize or flags.isolated:
        return None
    if flags.ignore_environment or flags.no_site or flags.no_user_site or len(os.sched_getaffinity(0)) < 2:
        return None
    names = run_modules()
    last = module_source(names[-1]) if names else None
    if last is None or not _uncompiled(last):
        return None
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    if sys.pycache_prefix:  # also when set with -X pycache_prefix
        env["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix
    child = "from bulldozer.cli import process; process.compile_run_modules()"
    devnull = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
    try:  # its output goes nowhere: a caller reading ours to its end must not wait for it
        # -P: nothing of the working directory is imported (bulldozer.settings.python_command)
        return os.posix_spawn(sys.executable, [sys.executable, "-P", "-c", child], env, file_actions=devnull)
    except OSError:
        return None


def compile_run_modules() -> None:
    """The child ``compile_ahead`` starts: compile the run's modules into the bytecode cache,
    the last the run imports first; one whose cache is current (the run got there first) is
    skipped."""
    import compileall

    for name in reversed(run_modules()):
        path = module_source(name)
        if path is not None:
            compileall.compile_file(path, quiet=2)


def module_source(name: str) -> str | None:
    """The source file module ``name`` is imported from, found as the import system finds it
    but without importing anything (its top-level package is looked up, the rest of its name
    is a path in it); None when it has none (built in, frozen, an extension) or is not found."""
    import importlib.util

    top, _, rest = name.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not rest:
        origin = spec.origin if spec.has_location else None
        return origin if origin and origin.endswith(".py") else None
    for root in spec.submodule_search_locations or ():
        base = os.path.join(root, *rest.split("."))
        for path in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(path):
                return path
    return None


def run_modules(path: str = RUN_MODULES) -> list[str]:
    """The module names a list such as ``RUN_MODULES`` holds (none when it is missing)."""
    try:
        with open(path, encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip() and not line.startswith("#")]
    except OSError:
        return []


def _uncompiled(source: str) -> bool:
    """Whether the bytecode cache has no file for ``source`` yet (a stale one counts as one: a
    run then does not find the cache empty) and one could be written there: a cache nobody may
    write (a read-only install) would have the child compile for nothing at every run."""
    import importlib.util

    try:
        cached = importlib.util.cache_from_source(source)
    except (NotImplementedError, ValueError):
        return False  # no cache to fill
    if os.path.exists(cached):
        return False
    folder = os.path.dirname(cached)
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)  # the folders Python would create, up to one that exists
    return os.path.isdir(folder) and os.access(folder, os.W_OK)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached a command-line process (``claim``): raised in its main
    thread, so the command unwinds as from Ctrl-C."""

    def __init__(self, signum: int) -> None:
        import signal

        super().__init__(f"the process got {signal.Signals(signum).name}")
        self.signum = signum


class TimeLimitExceeded(KeyboardInterrupt):
    """The command's time limit passed (``TimeLimit``): raised in its main thread, so the
    command unwinds as from Ctrl-C, then fails."""


def interruption(exc: KeyboardInterrupt) -> tuple[str, int]:
    """The one line and the exit code of a command stopped by ``exc`` (SIGINT, SIGTERM,
    SIGHUP or its time limit)."""
    if isinstance(exc, TimeLimitExceeded):
        return str(exc), 1
    if isinstance(exc, Terminated):
        import signal

        said = "terminated" if exc.signum == signal.SIGTERM else "terminated (SIGHUP: the terminal it ran in hung up)"
        return said, 128 + exc.signum
    return "interrupted", 130


class TimeLimit:
    """``with TimeLimit(seconds, message)``: raise ``TimeLimitExceeded(message)`` in the main
    thread once ``seconds`` have passed in the block (SIGALRM), in a command-line process
    (``claim``); a command invoked in-process (an Airflow task: its ``execution_timeout``)
    leaves the process's alarm to its host. (A class: this module imports no contextlib.)"""

    def __init__(self, seconds: float | None, message: str) -> None:
        self.seconds, self.message = seconds, message
        self.previous: Any = None
        self.armed = False

    def __enter__(self) -> None:
        if self.seconds is None or not _owned:
            return
        import signal

        try:
            self.previous = signal.signal(signal.SIGALRM, self._expired)
        except ValueError:  # not the main thread: no signal reaches this block
            return
        self.armed = True
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc: object) -> None:
        if self.armed:
            import signal

            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
            self.armed = False

    def _expired(self, signum: int, frame: object) -> None:
        interrupts.interrupt(TimeLimitExceeded(self.message))


def _terminate(signum: int, frame: object) -> None:
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM or SIGHUP ends the process at once
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    if signum == signal.SIGHUP:
        _off_a_hung_up_terminal()
    interrupts.interrupt(Terminated(signum))


def _interrupt(signum: int, frame: object) -> None:
    """Ctrl-C: ``KeyboardInterrupt``, as Python's own handler raises it, but not inside a
    section that may not be interrupted (``bulldozer.interrupts``)."""
    interrupts.interrupt(KeyboardInterrupt())


def _off_a_hung_up_terminal() -> None:
    """Point each standard stream whose terminal has hung up at the null device: every write
    to it fails (EIO), and the command's last lines and the libraries' (a progress bar's
    last refresh, logging) then raised in the middle of its clean-up. A stream that is no
    terminal, or one still there (``kill -HUP``), is left alone."""
    import errno

    for fd in (0, 1, 2):
        try:
            os.tcgetpgrp(fd)
        except OSError as exc:
            if exc.errno == errno.EIO:  # else no terminal
                to_null(fd)


def collect_again() -> None:
    gc.enable()


def started() -> None:
    """The command's long-lived objects are built: keep later collections from walking them
    (they move to the permanent generation), and collect from here on."""
    gc.freeze()
    gc.enable()


def run_ended() -> None:
    """A run is over, or failed before its load stage: collect as usual again."""
    gc.unfreeze()
    gc.enable()


def exiting() -> None:
    """The process is about to exit: move every object to the permanent generation, so the
    interpreter's final collections skip them (they cost 0.4-0.6 s after a large run: tens
    of thousands of objects from pyiceberg, grpc, pydantic). Not after DuckDB ran a
    query: its (nanobind) types would then still be alive when its module is torn down, and
    nanobind reports each one as a leak on stderr."""
    if "duckdb" not in sys.modules:
        gc.freeze()


def owned() -> bool:
    return _owned


def end_when_done() -> None:
    """Called first thing by the ``bulldozer`` entry point: once the command has ended
    (``ending``), end the process there, as the interpreter's last exit handler (registered
    first, it runs last: after the interpreter waited for the command's threads and ran every
    other exit handler), skipping its teardown."""
    atexit.register(_end)


def exit_status(code: object) -> int:
    """The exit status ``sys.exit(code)`` gives: 0 for None, the number, else 1 (a message)."""
    return code if isinstance(code, int) else 0 if code is None else 1


def ending(code: object) -> None:
    """The command ended as it means to, with ``sys.exit(code)``'s status."""
    global _status
    _status = exit_status(code)


def _end() -> None:
    if _status is None:
        return  # an unexpected exception: the usual way
    if "logging" in sys.modules:  # its own exit handler has flushed it, unless it came first
        sys.modules["logging"].shutdown()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:  # None: the descriptor was closed when the process started
                stream.flush()
    except (OSError, ValueError):
        return  # the interpreter's own exit says so (a closed pipe: exit code 120)
    os._exit(_status)


def without_pandas() -> bool:
    """Tell pyarrow that pandas is absent, in a process of ours that has not imported either
    yet; True when done. pyarrow imports pandas (0.25-0.3 s) the first time it checks whether
    a value is a pandas object (importing ``pyarrow.dataset`` does), and remembers the answer.
    Nothing on the local engine's path uses pandas; the Spark engine does (its driver
    converts through it), so only a local run calls this."""
    if not _owned or "pandas" in sys.modules or "pyarrow.dataset" in sys.modules:
        return False
    sys.meta_path.insert(0, _NoPandas())  # not sys.modules["pandas"] = None: Cython's import takes that None
    return True


class _NoPandas:
    """``import pandas`` fails as if pandas were not installed."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> None:
        if fullname == "pandas" or fullname.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {fullname!r} (a local run does without it)", name=fullname)
        return None


class _Deferred:
    """Import the modules named in ``lazy`` with ``importlib.util.LazyLoader`` (the module
    object exists at once, its code runs when an attribute of it is first read), and set
    pydantic's ``defer_build`` on the model bases ``models`` names of a module as the module
    is imported (before any subclass of them is defined)."""

    def __init__(self, lazy: Sequence[str], models: Mapping[str, Sequence[str]]) -> None:
        self.lazy, self.models = frozenset(lazy), dict(models)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.lazy and fullname not in self.models:
            return None
        import importlib.machinery
        import importlib.util

        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        if fullname in self.lazy:
            spec.loader = importlib.util.LazyLoader(spec.loader)
        else:
            spec.loader = _deferring_loader(spec.loader, self.models[fullname])
        return spec


def _deferring_loader(loader: importlib.abc.Loader, bases: Sequence[str]) -> importlib.abc.Loader:
    """``loader``, then ``defer_build`` set on the module's model bases ``bases``."""
    import importlib.abc

    class DeferringLoader(importlib.abc.Loader):
        def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
            return loader.create_module(spec)

        def exec_module(self, module: ModuleType) -> None:
            loader.exec_module(module)
            for base in bases:
                model = getattr(module, base, None)
                if model is not None:
                    model.model_config["defer_build"] = True

    return DeferringLoader()
