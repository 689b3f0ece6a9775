package main

import "testing"

// A delete's keys are taken as they come only when they ascend strictly (byte order, each
// once); any other list is sorted and its repeats dropped first (lmdbStore.delete).
func TestAscendingTakesOnlyKeysInByteOrderEachOnce(t *testing.T) {
	keys := func(s ...string) [][]byte {
		out := make([][]byte, len(s))
		for i, k := range s {
			out[i] = []byte(k)
		}
		return out
	}
	for _, c := range []struct {
		keys [][]byte
		want bool
	}{
		{keys(), true},
		{keys("a"), true},
		{keys("a", "ab", "b", "\xff"), true},
		{keys("a", "a"), false},           // a repeat
		{keys("b", "a"), false},           // out of order
		{keys("ab", "a"), false},          // a prefix sorts first
		{keys("a", "c", "b", "d"), false}, // out of order in the middle
	} {
		if got := ascending(c.keys); got != c.want {
			t.Errorf("ascending(%q) = %v, want %v", c.keys, got, c.want)
		}
	}
}
