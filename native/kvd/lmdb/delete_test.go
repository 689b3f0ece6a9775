package lmdb

import (
	"fmt"
	"runtime"
	"testing"

	"bulldozer/kvd/internal/shared"
)

// testEnv is a new store, a database maker and a writer of one record.
func testEnv(tb testing.TB) (*Env, func(string) DBI, func(DBI, string, string)) {
	env, err := Open(tb.TempDir(), Options{MapSize: 4 << 30, MaxDBs: 4096, MaxReaders: 16})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(env.Close)
	db := func(name string) DBI {
		if err := env.createDB(name); err != nil {
			tb.Fatal(err)
		}
		dbi, err := env.DBI(name)
		if err != nil {
			tb.Fatal(err)
		}
		return dbi
	}
	put := func(dbi DBI, key, value string) {
		if err := env.put(dbi, []byte(key), []byte(value)); err != nil {
			tb.Fatal(err)
		}
	}
	return env, db, put
}

// layeredStore is a store whose LOADING version name reads through upper filtered layers
// (newest first, each holding its own keys) to a bottom holding bottom; it returns the
// store, what Delete takes and a database maker.
func layeredStore(tb testing.TB, name string, upper [][]string, bottom []string) (env *Env, own, stage, states, digests DBI, layers Layers, db func(string) DBI) {
	tb.Helper()
	env, db, put := testEnv(tb)
	states, digests, stage = db(shared.StoreMetaStates), db(shared.StoreMetaDigests), db(shared.StoreMetaStage)
	layers.Filters = db(shared.StoreMetaFilters)
	for i, keys := range append(upper, bottom) {
		layer := fmt.Sprintf("v__v2026010100%04d_abcdef", len(upper)-i)
		data := db(shared.StoreDataPrefix + layer)
		put(states, layer, "ACTIVE")
		for _, k := range keys {
			put(data, k, "a value of some forty bytes, as a row's")
		}
		layers.Names, layers.Data = append(layers.Names, layer), append(layers.Data, data)
		if i < len(upper) {
			tomb := db(shared.StoreTombstonePrefix + layer)
			layers.Below = append(layers.Below, tomb)
			if built, err := env.BuildFilter(layers.Filters, states, layer, data, tomb, 1<<30); err != nil || built != FilterBuilt {
				tb.Fatal(built, err)
			}
		}
	}
	own, layers.Tombs = db(shared.StoreDataPrefix+name), db(shared.StoreTombstonePrefix+name)
	put(states, name, shared.StatesWritable)
	put(digests, name, string(make([]byte, 24))+"\x01")
	return env, own, stage, states, digests, layers, db
}

func pairHash(key, value []byte) uint64 { return uint64(len(key) + len(value)) }

func pairHashes() func(key, value []byte) uint64 { return pairHash }

// Deletes tombstone every key a layer below holds, whether a call's keys come after the
// tombstones already there (appended) or among them.
func TestDeletesTombstoneKeysInAnyOrderOfCalls(t *testing.T) {
	const name = "v__v20260102000000_abcdef"
	bottom := []string{"a", "b", "c", "d", "e", "f"}
	env, own, stage, states, digests, layers, _ := layeredStore(t, name, [][]string{{"x"}}, bottom)
	for _, call := range [][]string{{"b", "d"}, {"a", "c", "d", "f"}, {"e"}} {
		keys, klens := laidOut(call)
		if _, ok, err := env.Delete(own, stage, states, digests, name, layers, keys, klens, pairHashes); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	txn, err := env.BeginRead()
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Abort()
	for _, k := range bottom {
		if v, found, err := txn.Get(layers.Tombs, []byte(k)); err != nil || !found || string(v) != shared.StoreTombstone {
			t.Errorf("key %q: tombstone %q found %v (%v)", k, v, found, err)
		}
	}
}

// The cost of a delta version's deletes per key (go test -bench Delete ./lmdb): each key is
// checked against the filter of every layer above the bottom, which holds it (the bottom's
// own filter, built as a delta's first ingest builds it, is not consulted: kvd_delete_filters).
func BenchmarkDeleteThroughLayers(b *testing.B) {
	const upper, bottomKeys, layerKeys, deleted = 4, 400_000, 20_000, 50_000
	layerKeysOf := func(first, n, step int) []string {
		keys := make([]string, n)
		for k := range keys {
			keys[k] = fmt.Sprintf("key-%012d", first+k*step)
		}
		return keys
	}
	var layers [][]string
	for i := 0; i < upper; i++ { // keys of their own, interleaved with the bottom's
		layers = append(layers, layerKeysOf(i+1, layerKeys, bottomKeys/layerKeys*3))
	}
	env, _, stage, states, digests, below, db := layeredStore(b, "v__v20260102999999_abcdef", layers, layerKeysOf(0, bottomKeys, 3))
	bottom := len(below.Data) - 1 // with its filter, as a delta's first ingest builds it
	if built, err := env.BuildFilter(below.Filters, states, below.Names[bottom], below.Data[bottom], 0, 1<<30); err != nil || built != FilterBuilt {
		b.Fatal(built, err)
	}
	var keys []byte
	var klens []uint32
	for k := 0; k < deleted; k++ { // bottom keys, in key order
		key := fmt.Sprintf("key-%012d", k*(bottomKeys/deleted)*3)
		keys, klens = append(keys, key...), append(klens, uint32(len(key)))
	}
	saved := DeleteSplitMin
	b.Cleanup(func() { DeleteSplitMin = saved })
	for _, way := range []struct {
		name     string
		splitMin int
	}{{"searched in the write transaction", 1 << 30}, {"searched first on every core", saved}} {
		b.Run(way.name, func(b *testing.B) {
			DeleteSplitMin = way.splitMin
			deleteThroughLayers(b, env, stage, states, digests, below, db, keys, klens, deleted)
		})
	}
}

var benchVersions int

func deleteThroughLayers(b *testing.B, env *Env, stage, states, digests DBI, below Layers, db func(string) DBI,
	keys []byte, klens []uint32, deleted uint64) {
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		benchVersions++ // a new version each time, over every round and way
		name := fmt.Sprintf("v__v20260102%06d_abcdef", benchVersions)
		own := db(shared.StoreDataPrefix + name)
		layers := below
		layers.Tombs = db(shared.StoreTombstonePrefix + name)
		if err := env.put(states, []byte(name), []byte(shared.StatesWritable)); err != nil {
			b.Fatal(err)
		}
		if err := env.put(digests, []byte(name), append(make([]byte, 24), 1)); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if n, ok, err := env.Delete(own, stage, states, digests, name, layers, keys, klens, pairHashes); err != nil || !ok || n != deleted {
			b.Fatal(n, ok, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(uint64(b.N)*deleted), "ns/key")
}

// A delete whose layers below are searched first on several goroutines (searchBelow) takes
// away the same pairs, leaves the same tombstones and own pairs, and the same running digest,
// as one that searches them in its write transaction: keys the namespace holds itself, keys
// its own tombstones hide already, keys an upper layer holds or hides with a tombstone, keys
// the bottom holds, and keys nothing holds. Both take the same whether the bottom has its
// filter (built by a delta's first ingest, which a delete does not consult) or not.
func TestDeletesSearchingBelowFirstTakeWhatTheWriteTransactionWould(t *testing.T) {
	const name = "v__v20260102000000_abcdef"
	key := func(i int) string { return fmt.Sprintf("k%05d", i) }
	var universe, doomed []string
	for i := 0; i < 3000; i++ {
		universe = append(universe, key(i))
		if i%3 != 2 {
			doomed = append(doomed, key(i))
		}
	}
	type store struct {
		env                         *Env
		own, stage, states, digests DBI
		layers                      Layers
	}
	open := func(bottomFilter bool) store {
		env, db, put := testEnv(t)
		s := store{env: env, states: db(shared.StoreMetaStates), digests: db(shared.StoreMetaDigests), stage: db(shared.StoreMetaStage)}
		s.layers.Filters = db(shared.StoreMetaFilters)
		for depth := 0; depth < 3; depth++ { // two upper layers, then the bottom
			layer := fmt.Sprintf("v__v2026010100%04d_abcdef", 3-depth)
			data := db(shared.StoreDataPrefix + layer)
			put(s.states, layer, "ACTIVE")
			s.layers.Names, s.layers.Data = append(s.layers.Names, layer), append(s.layers.Data, data)
			for i := range universe {
				switch {
				case depth == 2 && i%7 != 0: // the bottom holds most keys
					put(data, key(i), fmt.Sprintf("bottom value %d", i))
				case depth < 2 && i%11 == 3+depth: // an upper layer's own
					put(data, key(i), fmt.Sprintf("layer %d value %d", depth, i))
				}
			}
			var tomb DBI // the bottom has no tombstones
			if depth < 2 {
				tomb = db(shared.StoreTombstonePrefix + layer)
				for i := depth; i < len(universe); i += 13 { // an upper layer hides these
					put(tomb, key(i), shared.StoreTombstone)
				}
				s.layers.Below = append(s.layers.Below, tomb)
			}
			if depth < 2 || bottomFilter {
				if built, err := env.BuildFilter(s.layers.Filters, s.states, layer, data, tomb, 1<<30); err != nil || built != FilterBuilt {
					t.Fatal(built, err)
				}
			}
		}
		s.own, s.layers.Tombs = db(shared.StoreDataPrefix+name), db(shared.StoreTombstonePrefix+name)
		for i := range universe {
			if i%17 == 5 {
				put(s.own, key(i), fmt.Sprintf("own value %d", i))
			}
			if i%19 == 6 {
				put(s.layers.Tombs, key(i), shared.StoreTombstone)
			}
		}
		put(s.states, name, shared.StatesWritable)
		put(s.digests, name, string(make([]byte, 24))+"\x01")
		return s
	}
	hashes := func() func(k, v []byte) uint64 {
		return func(k, v []byte) uint64 { return uint64(len(k))*1_000_003 + uint64(len(v))*7 + uint64(v[len(v)-1]) }
	}
	saved, procs := DeleteSplitMin, runtime.GOMAXPROCS(4)
	t.Cleanup(func() { DeleteSplitMin = saved; runtime.GOMAXPROCS(procs) })
	// what a store holds after the deletes: how many each call took away, the namespace's own
	// pairs and tombstones, and its running digest
	outcome := func(splitMin int, bottomFilter bool) []string {
		DeleteSplitMin = splitMin
		s := open(bottomFilter)
		var got []string
		for start := 0; start < len(doomed); start += 1000 { // three calls: later ones among tombstones
			keys, klens := laidOut(doomed[start:min(start+1000, len(doomed))])
			n, ok, err := s.env.Delete(s.own, s.stage, s.states, s.digests, name, s.layers, keys, klens, hashes)
			if err != nil || !ok {
				t.Fatal(ok, err)
			}
			got = append(got, fmt.Sprint("deleted ", n))
		}
		txn, err := s.env.BeginRead()
		if err != nil {
			t.Fatal(err)
		}
		defer txn.Abort()
		for _, k := range universe {
			v, found, err := txn.Get(s.own, []byte(k))
			tomb, tombed, err2 := txn.Get(s.layers.Tombs, []byte(k))
			if err != nil || err2 != nil {
				t.Fatal(err, err2)
			}
			got = append(got, fmt.Sprintf("%s own %q %v tomb %q %v", k, v, found, tomb, tombed))
		}
		digest, _, err := txn.Get(s.digests, []byte(name))
		if err != nil {
			t.Fatal(err)
		}
		return append(got, fmt.Sprintf("digest %x", digest))
	}
	inTxn := outcome(1<<30, false)
	for _, way := range []struct {
		name         string
		splitMin     int
		bottomFilter bool
		procs        int
	}{
		{"searched first", 1, false, 4},
		{"with the bottom's filter", 1 << 30, true, 4},
		{"searched first with the bottom's filter", 1, true, 4},
		// one part of a call's 1000 keys: searched and hashed searchChunk keys at a time
		{"searched first on one core", 1, true, 1},
	} {
		runtime.GOMAXPROCS(way.procs)
		got := outcome(way.splitMin, way.bottomFilter)
		if len(inTxn) != len(got) {
			t.Fatalf("%s: %d lines vs %d", way.name, len(got), len(inTxn))
		}
		for i := range inTxn {
			if inTxn[i] != got[i] {
				t.Errorf("searched in the write transaction: %s; %s: %s", inTxn[i], way.name, got[i])
			}
		}
	}
	if inTxn[0] == "deleted 0" {
		t.Error("nothing was deleted: the test proves nothing")
	}
}

// A flat LOADING version (no layer below: a chain compacted into one, EmbeddedEngine's
// major compaction) deletes its own pairs, puts no tombstone, and takes them off its
// running digest.
func TestDeletesInAFlatVersionTakeItsOwnPairs(t *testing.T) {
	const name = "v__v20260102000000_abcdef"
	env, db, put := testEnv(t)
	states, digests, stage := db(shared.StoreMetaStates), db(shared.StoreMetaDigests), db(shared.StoreMetaStage)
	own := db(shared.StoreDataPrefix + name)
	put(states, name, shared.StatesWritable)
	put(digests, name, string(make([]byte, 24))+"\x01")
	for _, k := range []string{"a", "b", "c", "d"} {
		put(own, k, "value")
	}
	keys, klens := laidOut([]string{"b", "d", "z"})
	deleted, ok, err := env.Delete(own, stage, states, digests, name, Layers{}, keys, klens, pairHashes)
	if err != nil || !ok || deleted != 2 {
		t.Fatalf("delete: %d deleted, ok %v, %v", deleted, ok, err)
	}
	txn, err := env.BeginRead()
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Abort()
	for k, want := range map[string]bool{"a": true, "b": false, "c": true, "d": false} {
		if _, found, err := txn.Get(own, []byte(k)); err != nil || found != want {
			t.Errorf("key %q: found %v, want %v (%v)", k, found, want, err)
		}
	}
	if raw, found, err := txn.Get(digests, []byte(name)); err != nil || !found || raw[24] != 1 || raw[0] != 0xfe {
		t.Errorf("running digest after the delete: %x (%v)", raw, err) // count 0 - 2, still exact
	}
}
