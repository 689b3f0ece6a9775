"""javac for tests that build many small Java sources: one JVM (tests/java/Javac.java) runs
javac's own compiler (``javax.tools``) for each build, with the javac command's arguments and
messages. Starting the javac command costs 2-3 CPU-s a build here, most of it the JVM's start
and warm-up; ``test_reader_names`` builds about 45 times."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from types import TracebackType

from tests import jvm

SOURCE = Path(__file__).resolve().parent / "java" / "Javac.java"


class JavaCompiler:
    """A running ``Javac.java``; ``javac(args)`` is ``subprocess.run(["javac", *args])``'s
    exit code and stderr (one build at a time, in the order asked)."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(jvm.java(str(SOURCE)), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._lock = threading.Lock()

    def javac(self, args: list[str]) -> tuple[int, str]:
        assert all("\0" not in a and "\n" not in a for a in args), args
        assert self._process.stdin is not None and self._process.stdout is not None
        with self._lock:
            self._process.stdin.write("\0".join(args).encode() + b"\n")
            self._process.stdin.flush()
            head = self._process.stdout.readline()
            assert head, f"the Java compiler ended (exit code {self._process.wait()})"
            code, size = map(int, head.split())
            return code, self._process.stdout.read(size).decode()

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def __enter__(self) -> JavaCompiler:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
