package lmdb

import (
	"fmt"
	"math/rand"
	"testing"

	"bulldozer/kvd/internal/shared"
)

// filterStore is a store with one layer, name, holding data and tombstone keys, in state.
func filterStore(t testing.TB, name, state string, data, tombs []string) (env *Env, filters, states, dataDBI, tombDBI DBI) {
	t.Helper()
	env, err := Open(t.TempDir(), Options{MapSize: 256 << 20, MaxDBs: 16, MaxReaders: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Close)
	dbis := map[string]DBI{}
	for _, db := range []string{shared.StoreMetaFilters, shared.StoreMetaStates, shared.StoreDataPrefix + name, shared.StoreTombstonePrefix + name} {
		if err := env.createDB(db); err != nil {
			t.Fatal(err)
		}
		if dbis[db], err = env.DBI(db); err != nil {
			t.Fatal(err)
		}
	}
	filters, states = dbis[shared.StoreMetaFilters], dbis[shared.StoreMetaStates]
	dataDBI, tombDBI = dbis[shared.StoreDataPrefix+name], dbis[shared.StoreTombstonePrefix+name]
	if state != "" {
		if err := env.put(states, []byte(name), []byte(state)); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range data {
		if err := env.put(dataDBI, []byte(k), []byte("value")); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range tombs {
		if err := env.put(tombDBI, []byte(k), []byte(shared.StoreTombstone)); err != nil {
			t.Fatal(err)
		}
	}
	return env, filters, states, dataDBI, tombDBI
}

// randomKeys are n distinct keys of 1 to 100 bytes, none starting with prefix "absent".
func randomKeys(rng *rand.Rand, n int) []string {
	seen := map[string]bool{}
	var keys []string
	for len(keys) < n {
		b := make([]byte, 1+rng.Intn(100))
		rng.Read(b)
		if k := string(b); !seen[k] && (len(k) < 6 || k[:6] != "absent") {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	return keys
}

// A layer's filter lets through every key its data or its tombstones hold (a filter that
// ruled one out would make a read miss it), and rules out most keys it does not hold.
func TestAFilterLetsEveryKeyOfItsLayerThrough(t *testing.T) {
	const name = "f__v20260101000000_abcdef"
	rng := rand.New(rand.NewSource(1))
	keys := randomKeys(rng, 30_000)
	data, tombs := keys[:20_000], keys[20_000:]
	env, filters, states, dataDBI, tombDBI := filterStore(t, name, "ACTIVE", data, tombs)
	built, err := env.BuildFilter(filters, states, name, dataDBI, tombDBI, 1_000_000)
	if err != nil || built != FilterBuilt {
		t.Fatalf("build: %v %v", built, err)
	}
	txn, err := env.BeginRead()
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Abort()
	blob, lengths := laidOut(keys)
	mask, ok, err := txn.FilterMask(filters, name, blob, lengths)
	if err != nil || !ok {
		t.Fatalf("mask: %v %v", ok, err)
	}
	for i, m := range mask {
		if m == 0 {
			t.Fatalf("the filter rules out %q, which the layer holds", keys[i])
		}
	}
	absent := make([]string, 100_000)
	for i := range absent {
		absent[i] = fmt.Sprintf("absent-%d", i)
	}
	blob, lengths = laidOut(absent)
	mask, _, _ = txn.FilterMask(filters, name, blob, lengths)
	passed := 0
	for _, m := range mask {
		passed += int(m)
	}
	if rate := float64(passed) / float64(len(absent)); rate > 0.03 {
		t.Errorf("%.1f %% of absent keys pass the filter; about 1 %% is expected at 10 bits a key", 100*rate)
	}
	if has, _ := txn.HasFilter(filters, "other__v20260101000000_abcdef"); has {
		t.Error("a layer never filtered has a filter")
	}
}

// Only a readable layer gets a filter (a LOADING one still changes; a name without a
// state is gone), once, and not when it holds more keys than the limit.
func TestOnlyAReadableLayerOfAtMostTheLimitGetsAFilter(t *testing.T) {
	const name = "f__v20260101000000_abcdef"
	keys := randomKeys(rand.New(rand.NewSource(2)), 1000)
	for _, c := range []struct {
		state string
		limit uint64
		want  int
	}{
		{shared.StatesWritable, 1_000_000, FilterNotBuilt},
		{"", 1_000_000, FilterNotBuilt},
		{"FAILED", 1_000_000, FilterNotBuilt},
		{"SEALED", 999, FilterTooLarge},
		{"SEALED", 1000, FilterBuilt},
		{"RETIRED", 1000, FilterBuilt},
	} {
		env, filters, states, dataDBI, tombDBI := filterStore(t, name, c.state, keys[:600], keys[600:])
		built, err := env.BuildFilter(filters, states, name, dataDBI, tombDBI, c.limit)
		if err != nil || built != c.want {
			t.Errorf("state %q, limit %d: %d %v, want %d", c.state, c.limit, built, err, c.want)
		}
		if c.want == FilterBuilt {
			if again, err := env.BuildFilter(filters, states, name, dataDBI, tombDBI, c.limit); err != nil || again != FilterNotBuilt {
				t.Errorf("a second build: %d %v, want none (it has one)", again, err)
			}
		}
		txn, err := env.BeginRead()
		if err != nil {
			t.Fatal(err)
		}
		if has, _ := txn.HasFilter(filters, name); has != (c.want == FilterBuilt) {
			t.Errorf("state %q, limit %d: has a filter %v", c.state, c.limit, has)
		}
		txn.Abort()
	}
}

// A record under a layer's name that is not a filter this build reads (another version's
// layout, a truncated one) is ignored, never read past its end.
func TestARecordThatIsNoFilterIsIgnored(t *testing.T) {
	const name = "f__v20260101000000_abcdef"
	env, filters, _, _, _ := filterStore(t, name, "ACTIVE", []string{"a"}, nil)
	for _, record := range [][]byte{[]byte("KVF1"), append([]byte("KVF1\x07\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00"), make([]byte, 64)...)} {
		if err := env.put(filters, []byte(name), record); err != nil {
			t.Fatal(err)
		}
		txn, err := env.BeginRead()
		if err != nil {
			t.Fatal(err)
		}
		if has, err := txn.HasFilter(filters, name); has || err != nil {
			t.Errorf("%d-byte record taken for a filter (%v)", len(record), err)
		}
		txn.Abort()
	}
}

// The cost of a filter's build per key (go test -bench Filter ./lmdb).
func BenchmarkFilterBuild(b *testing.B) {
	keys := make([]string, 200_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%012d", i*7)
	}
	env, filters, states, dataDBI, tombDBI := filterStore(b, "f__v0", "ACTIVE", keys, nil)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		name := fmt.Sprintf("f__v%d", i+1)
		if err := env.put(states, []byte(name), []byte("ACTIVE")); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if built, err := env.BuildFilter(filters, states, name, dataDBI, tombDBI, 1<<30); err != nil || built != FilterBuilt {
			b.Fatal(built, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(keys)), "ns/key")
}
