package main

import "testing"

func TestMallocArenasAreCappedAtTheCores(t *testing.T) {
	if !limitMallocArenas() {
		t.Fatal("glibc refused M_ARENA_MAX")
	}
}
