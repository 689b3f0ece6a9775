package main

// The order-independent digest of (key, value) pairs, as bulldozer/codec/digest.py defines
// it: XXH64 of the key (seed 0) and of the value (seed valueSeed), mixed by a splitmix64
// finaliser, summed modulo 2^64. The Python runner and DAL compute the same number; the
// contract suite's seal checks compare the two on every batch this process stores.

import (
	"encoding/binary"
	"math/bits"
)

const (
	prime1    uint64 = 11400714785074694791
	prime2    uint64 = 14029467366897019727
	prime3    uint64 = 1609587929392839161
	prime4    uint64 = 9650029242287828579
	prime5    uint64 = 2870177450012600261
	mixC1     uint64 = 0x9E3779B97F4A7C15
	mixC2     uint64 = 0xBF58476D1CE4E5B9
	mixC3     uint64 = 0x94D049BB133111EB
	valueSeed uint64 = 0x5BD1E995
)

func round64(acc, lane uint64) uint64 {
	acc += lane * prime2
	return bits.RotateLeft64(acc, 31) * prime1
}

func merge64(acc, val uint64) uint64 {
	acc ^= round64(0, val)
	return acc*prime1 + prime4
}

// xxh64 is XXH64 of b with seed.
func xxh64(b []byte, seed uint64) uint64 {
	n := len(b)
	var h uint64
	if n >= 32 {
		v1, v2, v3, v4 := seed+prime1+prime2, seed+prime2, seed, seed-prime1
		for len(b) >= 32 {
			v1 = round64(v1, binary.LittleEndian.Uint64(b[0:8]))
			v2 = round64(v2, binary.LittleEndian.Uint64(b[8:16]))
			v3 = round64(v3, binary.LittleEndian.Uint64(b[16:24]))
			v4 = round64(v4, binary.LittleEndian.Uint64(b[24:32]))
			b = b[32:]
		}
		h = bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		h = merge64(h, v1)
		h = merge64(h, v2)
		h = merge64(h, v3)
		h = merge64(h, v4)
	} else {
		h = seed + prime5
	}
	h += uint64(n)
	for len(b) >= 8 {
		h ^= round64(0, binary.LittleEndian.Uint64(b[:8]))
		h = bits.RotateLeft64(h, 27)*prime1 + prime4
		b = b[8:]
	}
	if len(b) >= 4 {
		h ^= uint64(binary.LittleEndian.Uint32(b[:4])) * prime1
		h = bits.RotateLeft64(h, 23)*prime2 + prime3
		b = b[4:]
	}
	for _, c := range b {
		h ^= uint64(c) * prime5
		h = bits.RotateLeft64(h, 11) * prime1
	}
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return h
}

// pairHash is one pair's contribution to the digest.
func pairHash(key, value []byte) uint64 {
	x := xxh64(key, 0)*mixC1 + bits.RotateLeft64(xxh64(value, valueSeed), 17) + mixC3
	x = (x ^ (x >> 30)) * mixC2
	x = (x ^ (x >> 27)) * mixC3
	return x ^ (x >> 31)
}
