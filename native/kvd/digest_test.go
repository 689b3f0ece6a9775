package main

import (
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

func xxh64(b []byte, seed uint64) uint64 {
	d := xxhash.NewWithSeed(seed)
	_, _ = d.Write(b)
	return d.Sum64()
}

// Reference values from the xxhash library's XXH64 and from bulldozer.codec.digest.
func TestXXH64(t *testing.T) {
	cases := []struct {
		in   string
		seed uint64
		want uint64
	}{
		{"", 0, 0xef46db3751d8e999},
		{"a", 0, 0xd24ec4f1a98c6e5b},
		{"abc", 0, 0x44bc2cf5ad770999},
		{"Nobody inspects the spammish repetition", 0, 0xfbcea83c8a378bf1},
		{"0123456789abcdef0123456789abcdef0123456789", 0x5BD1E995, 0x7d4c51bcaa3f40b8},
		{strings.Repeat("x", 100), 7, 0xae5ad321e4fe6127},
	}
	for _, c := range cases {
		if got := xxh64([]byte(c.in), c.seed); got != c.want {
			t.Errorf("xxh64(%q, %d) = %#x, want %#x", c.in, c.seed, got, c.want)
		}
	}
}

// digest_pairs([(b"k1", b"v1"), (b"key-two" * 9, b"value" * 20)]).value in Python.
func TestPairDigest(t *testing.T) {
	h := newPairHasher()
	got := h.hash([]byte("k1"), []byte("v1")) + h.hash([]byte(strings.Repeat("key-two", 9)), []byte(strings.Repeat("value", 20)))
	if got != 0xd22bd4c694605206 {
		t.Errorf("digest = %#x", got)
	}
}
