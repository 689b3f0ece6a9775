package lmdb

import (
	"fmt"
	"testing"

	"bulldozer/kvd/internal/shared"
)

// The cost of a delta version's deletes per key (go test -bench Delete ./lmdb): each key is
// checked against the filter of every layer above the bottom, which holds it.
func BenchmarkDeleteThroughLayers(b *testing.B) {
	const upper, bottomKeys, layerKeys, deleted = 4, 400_000, 20_000, 50_000
	env, err := Open(b.TempDir(), Options{MapSize: 2 << 30, MaxDBs: 64, MaxReaders: 16})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(env.Close)
	db := func(name string) DBI {
		if err := env.createDB(name); err != nil {
			b.Fatal(err)
		}
		dbi, err := env.DBI(name)
		if err != nil {
			b.Fatal(err)
		}
		return dbi
	}
	states, digests, stage, filters := db(shared.StoreMetaStates), db(shared.StoreMetaDigests), db(shared.StoreMetaStage), db(shared.StoreMetaFilters)
	put := func(dbi DBI, key, value string) {
		if err := env.put(dbi, []byte(key), []byte(value)); err != nil {
			b.Fatal(err)
		}
	}
	var below Layers
	below.Filters = filters
	for i := 0; i <= upper; i++ { // the upper layers, newest first, then the bottom
		name := fmt.Sprintf("v__v2026010100000%d_abcdef", upper-i)
		data := db(shared.StoreDataPrefix + name)
		put(states, name, "ACTIVE")
		n, step, first := layerKeys, bottomKeys/layerKeys*3, i+1 // an upper layer: keys of its own
		if i == upper {
			n, step, first = bottomKeys, 3, 0
		}
		for k := 0; k < n; k++ {
			put(data, fmt.Sprintf("key-%012d", first+k*step), "a value of some forty bytes, as a row's")
		}
		below.Names, below.Data = append(below.Names, name), append(below.Data, data)
		if i < upper {
			tomb := db(shared.StoreTombstonePrefix + name)
			below.Below = append(below.Below, tomb)
			if built, err := env.BuildFilter(filters, states, name, data, tomb, 1<<30); err != nil || built != FilterBuilt {
				b.Fatal(built, err)
			}
		}
	}
	var keys []byte
	var klens []uint32
	for k := 0; k < deleted; k++ { // bottom keys, in key order
		key := fmt.Sprintf("key-%012d", k*(bottomKeys/deleted)*3)
		keys, klens = append(keys, key...), append(klens, uint32(len(key)))
	}
	hash := func(key, value []byte) uint64 { return uint64(len(key) + len(value)) }
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		name := fmt.Sprintf("v__v20260102%06d_abcdef", i)
		own := db(shared.StoreDataPrefix + name)
		layers := below
		layers.Tombs = db(shared.StoreTombstonePrefix + name)
		put(states, name, shared.StatesWritable)
		put(digests, name, string(make([]byte, 24))+"\x01")
		b.StartTimer()
		if n, ok, err := env.Delete(own, stage, states, digests, name, layers, keys, klens, hash); err != nil || !ok || n != deleted {
			b.Fatal(n, ok, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*deleted), "ns/key")
}
