package main

// #include <malloc.h>
import "C"

import "runtime"

// Process-wide tuning of this binary, applied by main before it serves.

// limitMallocArenas caps glibc's malloc arenas at the cores Go runs goroutines on
// (GOMAXPROCS) instead of glibc's 8 per core; false when glibc refused. The C side of this
// process (LMDB's write transactions allocate their dirty pages, the searches their result
// arrays) mallocs on whichever OS thread cgo runs it on, and glibc gives a thread that
// finds the arenas busy one of its own, each keeping what was freed in it. Over a load the
// arenas multiplied: on the benchmark's 10 M nested rows into a fresh store (2 cores),
// this process's peak anonymous memory 340 → 296 MiB with 2 arenas, the whole run
// 32.2 → 32.5 s (medians of 3, alternating).
func limitMallocArenas() bool {
	return C.mallopt(C.M_ARENA_MAX, C.int(runtime.GOMAXPROCS(0))) == 1
}
