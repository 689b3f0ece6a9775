package lmdb

import (
	"fmt"
	"math/rand"
	"slices"
	"sort"
	"strings"
	"testing"

	"bulldozer/kvd/internal/shared"
)

// A merge of layers writes, per key, what the newest layer holding or deleting it says (a
// layer's own pair over its own tombstone), in key order — EmbeddedEngine._overlay's rule.
func TestMergeLayersTakesTheNewestLayersWordPerKey(t *testing.T) {
	env, err := Open(t.TempDir(), Options{MapSize: 256 << 20, MaxDBs: 32, MaxReaders: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	const into = "m__v4"
	layers := []string{"m__v3", "m__v2", "m__v1"}
	dbi := map[string]DBI{}
	names := []string{shared.StoreMetaStates, shared.StoreDataPrefix + into, shared.StoreTombstonePrefix + into}
	for _, l := range layers {
		names = append(names, shared.StoreDataPrefix+l, shared.StoreTombstonePrefix+l)
	}
	for _, name := range names {
		if err := env.createDB(name); err != nil {
			t.Fatal(err)
		}
		if dbi[name], err = env.DBI(name); err != nil {
			t.Fatal(err)
		}
	}
	states := dbi[shared.StoreMetaStates]
	if err := env.put(states, []byte(into), []byte(shared.StatesWritable)); err != nil {
		t.Fatal(err)
	}
	// want: the newest layer's word per key (a value, or "" for a tombstone)
	rng := rand.New(rand.NewSource(3))
	want := map[string]string{}
	decided := map[string]bool{}
	var data, tombs []DBI
	for i, l := range layers {
		data, tombs = append(data, dbi[shared.StoreDataPrefix+l]), append(tombs, dbi[shared.StoreTombstonePrefix+l])
		for j := 0; j < 3000; j++ {
			key := fmt.Sprintf("k%05d", rng.Intn(6000))
			value := fmt.Sprintf("layer %d value %d", i, j)
			kind := rng.Intn(3) // 0: a pair, 1: a tombstone, 2: both (the pair wins)
			if kind != 1 {
				if err := env.put(data[i], []byte(key), []byte(value)); err != nil {
					t.Fatal(err)
				}
			}
			if kind != 0 {
				if err := env.put(tombs[i], []byte(key), []byte(shared.StoreTombstone)); err != nil {
					t.Fatal(err)
				}
			}
		}
		// this layer's word on each key it holds, unless a newer layer spoke
		txn, _ := env.BeginRead()
		for j := 0; j < 6000; j++ {
			key := fmt.Sprintf("k%05d", j)
			if decided[key] {
				continue
			}
			if v, found, _ := txn.Get(data[i], []byte(key)); found {
				want[key], decided[key] = string(v), true
			} else if _, found, _ := txn.Get(tombs[i], []byte(key)); found {
				want[key], decided[key] = "", true
			}
		}
		txn.Abort()
	}
	own, ownTomb := dbi[shared.StoreDataPrefix+into], dbi[shared.StoreTombstonePrefix+into]
	loading, merged, err := env.MergeLayers(states, into, own, ownTomb, data, tombs)
	if err != nil || !loading || merged != uint64(len(want)) {
		t.Fatalf("merge: loading %v, %d merged (want %d), %v", loading, merged, len(want), err)
	}
	txn, err := env.BeginRead()
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Abort()
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		v, inData, _ := txn.Get(own, []byte(key))
		_, inTombs, _ := txn.Get(ownTomb, []byte(key))
		if want[key] == "" && (inData || !inTombs) || want[key] != "" && (!inData || inTombs || string(v) != want[key]) {
			t.Fatalf("%s: data %q (%v), tombstone %v; want %q", key, v, inData, inTombs, want[key])
		}
	}
	// a second merge finds the version holding records; one not LOADING is refused
	if _, _, err := env.MergeLayers(states, into, own, ownTomb, data, tombs); err == nil {
		t.Error("a merge into a version holding records went through")
	}
	if err := env.put(states, []byte(into), []byte("SEALED")); err != nil {
		t.Fatal(err)
	}
	if loading, _, err := env.MergeLayers(states, into, own, ownTomb, data, tombs); loading || err != nil {
		t.Errorf("a merge into a SEALED version: loading %v, %v", loading, err)
	}
}

// A merge that takes in the chain's bottom (a layer with no tombstones and nothing below)
// makes a flat version: every visible pair through the layers, and no tombstones at all —
// a key a layer deletes is simply not written, whether the bottom held it or not. A walk of
// the visible pairs (VisiblePairs) yields the same, in key order.
func TestMergeLayersIntoTheBottomMakesAFlatVersion(t *testing.T) {
	env, db, put := testEnv(t)
	const into = "m__v4"
	layers := []string{"m__v3", "m__v2", "m__v1"} // m__v1 is the bottom
	states := db(shared.StoreMetaStates)
	put(states, into, shared.StatesWritable)
	own := db(shared.StoreDataPrefix + into)
	rng := rand.New(rand.NewSource(5))
	var data, tombs []DBI
	for i, l := range layers {
		data = append(data, db(shared.StoreDataPrefix+l))
		bottom := i == len(layers)-1
		if !bottom {
			tombs = append(tombs, db(shared.StoreTombstonePrefix+l))
		}
		for j := 0; j < 3000; j++ {
			key := fmt.Sprintf("k%05d", rng.Intn(6000))
			kind := rng.Intn(3) // 0: a pair, 1: a tombstone, 2: both (the pair wins); the bottom: pairs
			if bottom || kind != 1 {
				put(data[i], key, fmt.Sprintf("layer %d value %d", i, j))
			}
			if !bottom && kind != 0 {
				put(tombs[i], key, shared.StoreTombstone)
			}
		}
	}
	// the last keys: the newest layer's pair ends its stream, then an older layer deletes a
	// key nothing else holds (not written: a stream's end must not stop the merge)
	put(data[0], "zy", "last")
	put(tombs[1], "zz", shared.StoreTombstone)
	// want: what a read through the layers sees (the first layer holding the key, unless a
	// newer layer's tombstone hides it)
	want := map[string]string{"zy": "last"}
	txn, _ := env.BeginRead()
	for j := 0; j < 6000; j++ {
		key := []byte(fmt.Sprintf("k%05d", j))
		for i := range layers {
			if v, found, _ := txn.Get(data[i], key); found {
				want[string(key)] = string(v)
				break
			}
			if i < len(tombs) {
				if _, found, _ := txn.Get(tombs[i], key); found {
					break
				}
			}
		}
	}
	txn.Abort()
	// a read through the chain (VisiblePairs: what a seal measures) sees the same, in key order
	seen := map[string]string{}
	var last []byte
	var order []string
	err := env.VisiblePairs(data, tombs, nil, 0, nil, func(keys, values [][]byte) error {
		for i, k := range keys {
			if last != nil && string(k) <= string(last) {
				return fmt.Errorf("%q after %q", k, last)
			}
			last = append(last[:0], k...)
			seen[string(k)] = string(values[i])
			order = append(order, string(k))
		}
		return nil
	})
	if err != nil || len(seen) != len(want) {
		t.Fatalf("visible pairs: %d, want %d (%v)", len(seen), len(want), err)
	}
	for k, v := range want {
		if seen[k] != v {
			t.Fatalf("visible %s: %q, want %q", k, seen[k], v)
		}
	}
	// read in pages (a scan's: each past the last key of the one before, limit pairs), the
	// walk yields the same pairs in the same order, whatever the page size
	for _, size := range []int{1, 7, 1024, 1025, 2500} {
		var paged []string
		var after []byte
		for {
			n := 0
			err := env.VisiblePairs(data, tombs, after, size, nil, func(keys, values [][]byte) error {
				for i, k := range keys {
					if seen[string(k)] != string(values[i]) {
						return fmt.Errorf("%s: %q", k, values[i])
					}
					paged = append(paged, string(k))
				}
				n += len(keys)
				return nil
			})
			if err != nil || n > size {
				t.Fatalf("a page of %d: %d pairs, %v", size, n, err)
			}
			if n < size {
				break
			}
			after = []byte(paged[len(paged)-1])
		}
		if !slices.Equal(paged, order) {
			t.Fatalf("in pages of %d: %d keys, want %d in the same order", size, len(paged), len(order))
		}
	}
	// past a key no layer holds, or one only a tombstone names: from the next visible key
	for _, after := range []string{"k00100a", "zz", "zy", "a"} {
		var first string
		_ = env.VisiblePairs(data, tombs, []byte(after), 1, nil, func(keys, _ [][]byte) error {
			first = string(keys[0])
			return nil
		})
		i, _ := slices.BinarySearch(order, after)
		if i < len(order) && order[i] == after {
			i++
		}
		wantFirst := "" // past the last key: nothing
		if i < len(order) {
			wantFirst = order[i]
		}
		if first != wantFirst {
			t.Fatalf("past %q: %q, want %q", after, first, wantFirst)
		}
	}
	loading, merged, err := env.MergeLayers(states, into, own, 0, data, tombs)
	if err != nil || !loading || merged != uint64(len(want)) {
		t.Fatalf("merge: loading %v, %d merged (want %d), %v", loading, merged, len(want), err)
	}
	txn, err = env.BeginRead()
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Abort()
	got := map[string]string{}
	for _, key := range append(keysUpTo(6000), "zy", "zz") {
		if v, found, _ := txn.Get(own, []byte(key)); found {
			got[key] = string(v)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("the flat version holds %d keys, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%s: %q, want %q", k, got[k], v)
		}
	}
	// the tombstone handles must be one fewer than the layers', or as many
	if _, _, err := env.MergeLayers(states, into, own, 0, data, tombs[:1]); err == nil {
		t.Error("a merge with two layers' tombstones missing went through")
	}
}

func keysUpTo(n int) []string {
	keys := make([]string, n)
	for j := range keys {
		keys[j] = fmt.Sprintf("k%05d", j)
	}
	return keys
}

// A walk through a large bottom and many small layers (what a chain at its depth limit is)
// sees, per key, the newest layer's word, in byte order, whatever the keys' lengths: keys
// that are prefixes of others, keys one layer holds alone for long runs, keys several layers
// hold at once. The merge takes the next key from the same layer while it stays below every
// other layer's, so runs from one layer and ties between layers both come up here.
func TestAWalkThroughLayersOfKeysOfEveryLength(t *testing.T) {
	env, db, put := testEnv(t)
	rng := rand.New(rand.NewSource(11))
	key := func() string {
		// "a", "ab", "abba", ...: many keys are prefixes of others; half of them after a
		// common prefix of 9 bytes, so that keys differ before, at and past their 8th byte
		b := make([]byte, 1+rng.Intn(12))
		for i := range b {
			b[i] = "ab"[rng.Intn(2)]
		}
		if rng.Intn(2) == 0 {
			return "shared---" + string(b)
		}
		return string(b)
	}
	const depth = 9 // 8 layers over the bottom
	var data, tombs []DBI
	words := make([]map[string]string, depth) // per layer: its pair's value, or "\x00" for a tombstone alone
	for i := 0; i < depth; i++ {
		name := fmt.Sprintf("w__v%d", depth-i)
		data = append(data, db(shared.StoreDataPrefix+name))
		bottom := i == depth-1
		if !bottom {
			tombs = append(tombs, db(shared.StoreTombstonePrefix+name))
		}
		n := 12 // a layer changes a few keys
		if bottom {
			n = 600
		}
		words[i] = map[string]string{}
		for j := 0; j < n; j++ {
			k := key()
			kind := rng.Intn(3) // 0: a pair, 1: a tombstone, 2: both (the pair wins); the bottom: pairs
			if bottom || kind != 1 {
				value := fmt.Sprintf("layer %d value %d", i, j)
				put(data[i], k, value)
				words[i][k] = value
			}
			if !bottom && kind != 0 {
				put(tombs[i], k, shared.StoreTombstone)
				if _, paired := words[i][k]; !paired {
					words[i][k] = "\x00"
				}
			}
		}
	}
	// want: the newest layer's word on each key, where it is a pair
	want := map[string]string{}
	decided := map[string]bool{}
	for i := range words {
		for k, w := range words[i] {
			if !decided[k] {
				decided[k] = true
				if w != "\x00" {
					want[k] = w
				}
			}
		}
	}
	wantOrder := make([]string, 0, len(want))
	for k := range want {
		wantOrder = append(wantOrder, k)
	}
	sort.Strings(wantOrder) // Go's string order is byte order, the shorter of a prefix first
	for _, size := range []int{0, 1, 5, 64} {
		var got []string
		var after []byte
		for {
			n := 0
			err := env.VisiblePairs(data, tombs, after, size, nil, func(keys, values [][]byte) error {
				for i, k := range keys {
					if want[string(k)] != string(values[i]) {
						return fmt.Errorf("%q: %q, want %q", k, values[i], want[string(k)])
					}
					got = append(got, string(k))
				}
				n += len(keys)
				return nil
			})
			if err != nil {
				t.Fatalf("pages of %d: %v", size, err)
			}
			if size == 0 || n < size {
				break
			}
			after = []byte(got[len(got)-1])
		}
		if !slices.Equal(got, wantOrder) {
			t.Fatalf("pages of %d: %d keys %q..., want %d %q...", size, len(got), got[:min(8, len(got))], len(wantOrder), wantOrder[:min(8, len(wantOrder))])
		}
	}
}

// A page copied in the walk (VisiblePage: what a scan sends) holds the pairs VisiblePairs
// sees, whatever the page's size, values empty or far larger than its first pairs' (its
// blobs sized from them then fall short and grow).
func TestAPageHoldsThePairsTheWalkSees(t *testing.T) {
	env, db, put := testEnv(t)
	bottom, layer, tombs := db(shared.StoreDataPrefix+"p__v1"), db(shared.StoreDataPrefix+"p__v2"), db(shared.StoreTombstonePrefix+"p__v2")
	for i := 0; i < 5000; i++ {
		value := ""
		switch {
		case i%7 == 0: // empty
		case i < 1500: // the first pairs small
			value = "v"
		default:
			value = strings.Repeat(string(rune('a'+i%26)), 200+i%900)
		}
		put(bottom, fmt.Sprintf("key%05d", i), value)
		if i%10 == 3 {
			put(layer, fmt.Sprintf("key%05d", i), "changed "+value)
		}
		if i%10 == 5 {
			put(tombs, fmt.Sprintf("key%05d", i), shared.StoreTombstone)
		}
	}
	data, tomb := []DBI{layer, bottom}, []DBI{tombs}
	var wantKeys, wantValues []string
	if err := env.VisiblePairs(data, tomb, nil, 0, nil, func(keys, values [][]byte) error {
		for i := range keys {
			wantKeys, wantValues = append(wantKeys, string(keys[i])), append(wantValues, string(values[i]))
		}
		return nil
	}); err != nil || len(wantKeys) != 4500 {
		t.Fatalf("the walk: %d pairs, %v", len(wantKeys), err)
	}
	for _, limit := range []int{1, 3, 1024, 1025, 4000, 10000} {
		var keys, values []string
		var after []byte
		for {
			pool := &countedBuffers{}
			page, err := env.VisiblePage(data, tomb, after, limit, nil, pool)
			if err != nil {
				t.Fatal(err)
			}
			if pool.lent != 2 { // the page's keys and values; every other buffer back
				t.Fatalf("a page of %d: %d buffers not handed back", limit, pool.lent)
			}
			n := len(page.KeyLengths)
			if n > limit || len(page.ValueLengths) != n {
				t.Fatalf("a page of %d: %d keys, %d values", limit, n, len(page.ValueLengths))
			}
			k, v := 0, 0
			for i := 0; i < n; i++ {
				kn, vn := int(page.KeyLengths[i]), int(page.ValueLengths[i])
				keys, values = append(keys, string((*page.Keys)[k:k+kn])), append(values, string((*page.Values)[v:v+vn]))
				k, v = k+kn, v+vn
			}
			if k != len(*page.Keys) || v != len(*page.Values) {
				t.Fatalf("a page of %d: lengths sum to %d and %d bytes, blobs hold %d and %d", limit, k, v, len(*page.Keys), len(*page.Values))
			}
			if n < limit {
				break
			}
			after = []byte(keys[len(keys)-1])
		}
		if !slices.Equal(keys, wantKeys) || !slices.Equal(values, wantValues) {
			t.Fatalf("pages of %d: %d pairs, not the walk's %d", limit, len(keys), len(wantKeys))
		}
	}
}

// countedBuffers lends fresh buffers and counts those not handed back.
type countedBuffers struct{ lent int }

func (c *countedBuffers) Get(size int) *[]byte {
	c.lent++
	b := make([]byte, size)
	return &b
}

func (c *countedBuffers) Put(*[]byte) { c.lent-- }
