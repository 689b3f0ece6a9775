package main

// A version's seeded sample on the fast path (the Sample call a shadow read makes, which
// reads the whole version once): bulldozer.kv.backends.base.StorageEngine.sample's rule,
// the pairs whose keys have the smallest XXH64(key, seed), smallest first, ties by key.

import (
	"bytes"
	"container/heap"
	"context"
	"errors"
	"slices"

	"github.com/cespare/xxhash/v2"

	"bulldozer/kvd/internal/kvpb"
	"bulldozer/kvd/lmdb"
)

// sampled is one pair of a sample and its key's seeded hash.
type sampled struct {
	hash       uint64
	key, value []byte
}

func (a sampled) before(b sampled) bool {
	return a.hash < b.hash || a.hash == b.hash && bytes.Compare(a.key, b.key) < 0
}

// largestFirst is a heap of the sample so far, its last pair (the largest) on top.
type largestFirst []sampled

func (h largestFirst) Len() int           { return len(h) }
func (h largestFirst) Less(i, j int) bool { return h[j].before(h[i]) }
func (h largestFirst) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *largestFirst) Push(x any)        { *h = append(*h, x.(sampled)) }
func (h *largestFirst) Pop() any {
	old := *h
	last := old[len(old)-1]
	*h = old[:len(old)-1]
	return last
}

var errNotReadable = errors.New("not readable")

// readableNow is the check a read's transaction makes first: version name is readable
// (errNotReadable when it is not).
func (m *lmdbStore) readableNow(name string) func(*lmdb.Txn) error {
	return func(txn *lmdb.Txn) error {
		state, found, err := txn.Get(m.meta.states, []byte(name))
		if err == nil && (!found || !readable[string(state)]) {
			err = errNotReadable
		}
		return err
	}
}

// sample reads the readable version target addresses through its layers in one read
// transaction and keeps its count pairs of smallest seeded key hash; scanned is the pairs
// it holds. ok is false when the reference DAL must answer.
func (m *lmdbStore) sample(_ context.Context, target *kvpb.Target, count int, seed uint64) (name string, pairs []sampled, scanned uint64, ok bool) {
	name, _, data, tombs, ok := m.target(target)
	if !ok {
		return "", nil, 0, false
	}
	hasher := xxhash.NewWithSeed(seed)
	top := make(largestFirst, 0, count)
	err := m.env.VisiblePairs(data, tombs, nil, 0, m.readableNow(name), func(keys, values [][]byte) error {
		for i, key := range keys {
			hasher.ResetWithSeed(seed)
			_, _ = hasher.Write(key)
			candidate := sampled{hash: hasher.Sum64(), key: key}
			if len(top) == count && !candidate.before(top[0]) {
				continue
			}
			candidate.key, candidate.value = slices.Clone(key), slices.Clone(values[i])
			if len(top) < count {
				heap.Push(&top, candidate)
			} else {
				top[0] = candidate
				heap.Fix(&top, 0)
			}
		}
		scanned += uint64(len(keys))
		return nil
	})
	if err != nil {
		return "", nil, 0, false
	}
	slices.SortFunc(top, func(a, b sampled) int {
		if a.before(b) {
			return -1
		}
		if b.before(a) {
			return 1
		}
		return 0
	})
	return name, top, scanned, true
}
