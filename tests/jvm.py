"""Options for the JVMs tests start as tools — Maven's builds, a generated Java client's one
lookup, javac (tests/java_compiler.py) — not for the components the tests check for real
(Spark, Cassandra), which run as an operator runs them.

Such a JVM lives a few seconds, and most of its CPU went to its own start and warm-up: C2
compiling hot code for a process that ends before the compiled code pays off, and a
collector with threads per core. With the C1 compiler only (``-XX:TieredStopAtLevel=1``)
and the serial collector, ``test_java_client_builds_and_reads_a_key`` (``mvn package`` and
six ``java -jar`` lookups) took 30 and 36 CPU-s (user + system) against 46 and 52, the test
alone, runs alternating; ``test_reader_names``' javac JVM, 35-36 against 46-50."""

from __future__ import annotations

import os

SHORT_LIVED = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


def java(*args: str) -> list[str]:
    """The ``java`` command line for ``args``, with the options above."""
    return ["java", *SHORT_LIVED, *args]


def maven_env() -> dict[str, str]:
    """The environment entries that start Maven's JVM with the options above (after the
    caller's own ``MAVEN_OPTS``, which Maven's launcher puts on its command line)."""
    return {"MAVEN_OPTS": " ".join([*os.environ.get("MAVEN_OPTS", "").split(), *SHORT_LIVED])}
