package lmdb

import (
	"fmt"
	"testing"

	"bulldozer/kvd/internal/shared"
)

// layeredStore is a store whose LOADING version name reads through upper filtered layers
// (newest first, each holding its own keys) to a bottom holding bottom; it returns the
// store, what Delete takes and a database maker.
func layeredStore(tb testing.TB, name string, upper [][]string, bottom []string) (env *Env, own, stage, states, digests DBI, layers Layers, db func(string) DBI) {
	tb.Helper()
	env, err := Open(tb.TempDir(), Options{MapSize: 2 << 30, MaxDBs: 64, MaxReaders: 16})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(env.Close)
	db = func(name string) DBI {
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

// Deletes tombstone every key a layer below holds, whether a call's keys come after the
// tombstones already there (appended) or among them.
func TestDeletesTombstoneKeysInAnyOrderOfCalls(t *testing.T) {
	const name = "v__v20260102000000_abcdef"
	bottom := []string{"a", "b", "c", "d", "e", "f"}
	env, own, stage, states, digests, layers, _ := layeredStore(t, name, [][]string{{"x"}}, bottom)
	for _, call := range [][]string{{"b", "d"}, {"a", "c", "d", "f"}, {"e"}} {
		keys, klens := laidOut(call)
		if _, ok, err := env.Delete(own, stage, states, digests, name, layers, keys, klens, pairHash); err != nil || !ok {
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
// checked against the filter of every layer above the bottom, which holds it.
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
	var keys []byte
	var klens []uint32
	for k := 0; k < deleted; k++ { // bottom keys, in key order
		key := fmt.Sprintf("key-%012d", k*(bottomKeys/deleted)*3)
		keys, klens = append(keys, key...), append(klens, uint32(len(key)))
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		name := fmt.Sprintf("v__v20260102%06d_abcdef", i)
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
		if n, ok, err := env.Delete(own, stage, states, digests, name, layers, keys, klens, pairHash); err != nil || !ok || n != deleted {
			b.Fatal(n, ok, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*deleted), "ns/key")
}
