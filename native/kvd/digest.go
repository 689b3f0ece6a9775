package main

// The order-independent digest of (key, value) pairs, as bulldozer/codec/digest.py defines
// it: XXH64 of the key (seed 0) and of the value (seed valueSeed), mixed by a splitmix64
// finaliser, summed modulo 2^64. The Python runner and DAL compute the same number; the
// contract suite's seal checks compare the two on every batch this process stores.

import (
	"math/bits"

	"github.com/cespare/xxhash/v2"

	"bulldozer/kvd/internal/shared"
)

// The digest's constants, shared with Python and the Rust kernels (proto/bulldozer/kv/v1/shared.yaml).
const (
	mixC1     uint64 = shared.DigestMixC1
	mixC2     uint64 = shared.DigestMixC2
	mixC3     uint64 = shared.DigestMixC3
	valueSeed uint64 = shared.DigestValueSeed
)

// pairHasher computes pairs' contributions to the digest with XXH64 from
// github.com/cespare/xxhash; it reuses one seeded digest for the values, so it belongs to
// one goroutine at a time.
type pairHasher struct{ value *xxhash.Digest }

func newPairHasher() pairHasher { return pairHasher{xxhash.NewWithSeed(valueSeed)} }

// hash is one pair's contribution to the digest.
func (p pairHasher) hash(key, value []byte) uint64 {
	p.value.ResetWithSeed(valueSeed)
	_, _ = p.value.Write(value)
	x := xxhash.Sum64(key)*mixC1 + bits.RotateLeft64(p.value.Sum64(), 17) + mixC3
	x = (x ^ (x >> 30)) * mixC2
	x = (x ^ (x >> 27)) * mixC3
	return x ^ (x >> 31)
}
