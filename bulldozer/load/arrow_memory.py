"""The Arrow memory pool a load allocates from.

A load decodes and encodes a stream of batches: every batch allocates tens of MiB and frees
them a moment later. pyarrow's default pool on Linux (mimalloc) hands such memory back to
the kernel and takes fresh pages for the next batch, and each fresh (transparent huge) page
is zeroed by the kernel first: profiled on a 2 M-row load, the reader threads spent 75 % of
their CPU (≈ 1.8 s) in the kernel's page clearing. jemalloc keeps freed pages for reuse:
the same load takes ≈ 1 s less CPU and ≈ 0.4 s less time. An explicit
``ARROW_DEFAULT_MEMORY_POOL`` (jemalloc, mimalloc or system) is left as the user set it.
"""

from __future__ import annotations

import contextlib
import logging
import os

__all__ = ["use_load_memory_pool"]

log = logging.getLogger(__name__)


def use_load_memory_pool() -> str:
    """Make jemalloc Arrow's default pool in this process (when pyarrow was built with it
    and the environment chose no pool); returns the name of the pool in use."""
    import pyarrow as pa

    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        with contextlib.suppress(NotImplementedError):  # a pyarrow without jemalloc keeps its default
            pa.set_memory_pool(pa.jemalloc_memory_pool())
    name = str(pa.default_memory_pool().backend_name)
    log.debug("Arrow memory pool: %s", name)
    return name
