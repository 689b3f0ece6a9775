package lmdb

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"bulldozer/kvd/internal/shared"
)

// loadingVersion opens a store in a fresh folder with one LOADING version, name (its
// running digest exact), and returns the store and the states, digests, stage and data
// databases.
func loadingVersion(t testing.TB, name string) (env *Env, states, digests, stage, data DBI) {
	t.Helper()
	return loadingVersionIn(t, name, 4<<30) // a sparse file
}

// loadingVersionIn is loadingVersion in a store whose map holds mapSize bytes.
func loadingVersionIn(t testing.TB, name string, mapSize int64) (env *Env, states, digests, stage, data DBI) {
	t.Helper()
	env, err := Open(t.TempDir(), Options{MapSize: mapSize, MaxDBs: 16, MaxReaders: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Close)
	dbis := map[string]DBI{}
	for _, db := range []string{shared.StoreMetaStates, shared.StoreMetaDigests, shared.StoreMetaStage, shared.StoreDataPrefix + name} {
		if err := env.createDB(db); err != nil {
			t.Fatal(err)
		}
		if dbis[db], err = env.DBI(db); err != nil {
			t.Fatal(err)
		}
	}
	states, digests, stage, data = dbis[shared.StoreMetaStates], dbis[shared.StoreMetaDigests], dbis[shared.StoreMetaStage], dbis[shared.StoreDataPrefix+name]
	if err := env.put(states, []byte(name), []byte(shared.StatesWritable)); err != nil {
		t.Fatal(err)
	}
	exact := make([]byte, 25)
	exact[24] = 1
	if err := env.put(digests, []byte(name), exact); err != nil {
		t.Fatal(err)
	}
	return env, states, digests, stage, data
}

// stage stages one run of keys[i] = values[i].
func stage(t *testing.T, env *Env, stage, states, digests DBI, name string, keys, values []string) {
	t.Helper()
	var b Batch
	for i, key := range keys {
		b.Keys, b.Values = append(b.Keys, key...), append(b.Values, values[i]...)
		b.KeyLengths, b.ValueLengths = append(b.KeyLengths, uint32(len(key))), append(b.ValueLengths, uint32(len(values[i])))
	}
	if loading, err := env.StageBatch(stage, states, digests, name, b, Digest{Count: uint64(len(keys))}); err != nil || !loading {
		t.Fatalf("stage: %v %v", loading, err)
	}
}

// An ingest that commits its merged data in many small chunks stores what one transaction
// would: every key once, with the newest run's value, in key order, and deletes the runs.
func TestAnIngestInChunksStoresWhatOneTransactionWould(t *testing.T) {
	const name = "v__v20260101000000_abcdef"
	env, states, digests, stage_, data := loadingVersion(t, name)
	want := map[string]string{}
	for run := 0; run < 5; run++ { // overlapping runs, keys in no order: the later run wins
		var keys, values []string
		for i := 0; i < 3000; i++ {
			key := fmt.Sprintf("key-%06d", (i*7919+run*1000)%9000)
			value := fmt.Sprintf("run %d value %d", run, i)
			want[key] = value
			keys, values = append(keys, key), append(values, value)
		}
		stage(t, env, stage_, states, digests, name, keys, values)
	}
	env.IngestChunkBytes = 1024 // a commit every few dozen records
	loading, runs, records, err := env.Ingest(data, stage_, states, digests, name, Layers{})
	if err != nil || !loading || runs != 5 || records != 15000 {
		t.Fatalf("ingest: loading %v, %d runs, %d records, %v", loading, runs, records, err)
	}
	txn, err := env.BeginRead()
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Abort()
	for key, value := range want {
		got, found, err := txn.Get(data, []byte(key))
		if err != nil || !found || string(got) != value {
			t.Fatalf("%s: %q %v %v, want %q", key, got, found, err, value)
		}
	}
	got, _, _ := txn.Get(digests, []byte(name))
	if len(got) != 25 || got[24] != 0 {
		t.Errorf("keys repeated across runs leave the running digest exact: %v", got)
	}
	var number [8]byte
	for run := uint64(0); run < 5; run++ {
		binary.BigEndian.PutUint64(number[:], run)
		if _, found, _ := txn.Get(stage_, bytes.Join([][]byte{[]byte(name), number[:]}, []byte{0})); found {
			t.Errorf("run %d is still staged", run)
		}
	}
}

// The merge orders runs by their keys' first 8 bytes where those differ, and by the whole
// keys where they do not: keys that are prefixes of others, hold zero bytes, or share their
// first 8 bytes come out in byte order (an append out of order fails the ingest), each with
// the newest run's value (and a batch's last, of a key it holds twice).
func TestAnIngestMergesKeysInByteOrderWhateverTheirFirstBytes(t *testing.T) {
	const name = "v__v20260101000000_abcdef"
	env, states, digests, stage_, data := loadingVersion(t, name)
	keys := []string{"\x00", "\x00\x00", "A", "AB", "AB\x00", "AB\x00\x01", "AB\x01", "ABCDEFGH", "ABCDEFGH\x00",
		"ABCDEFGHI", "ABCDEFGI", "\x08\x80\x01", "\x08\x81\x01", "\x08\xff\xff\xff\xff\xff\xff\xff\x7f", "\xff"}
	want := map[string]string{}
	for run := 0; run < 4; run++ { // each run a different part of the keys, overlapping
		var ks, vs []string
		for i, key := range keys {
			if (i+run)%3 != 0 {
				ks, vs = append(ks, key), append(vs, fmt.Sprintf("run %d", run))
				want[key] = vs[len(vs)-1]
			}
		}
		// a key twice in one batch: its last value is the batch's
		ks, vs = append(ks, ks[run]), append(vs, fmt.Sprintf("run %d again", run))
		want[ks[run]] = vs[len(vs)-1]
		stage(t, env, stage_, states, digests, name, ks, vs)
	}
	if loading, _, records, err := env.Ingest(data, stage_, states, digests, name, Layers{}); err != nil || !loading || records == 0 {
		t.Fatalf("ingest: loading %v, %d records, %v", loading, records, err)
	}
	txn, err := env.BeginRead()
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Abort()
	for key, value := range want {
		if got, found, err := txn.Get(data, []byte(key)); err != nil || !found || string(got) != value {
			t.Fatalf("%q: %q %v %v, want %q", key, got, found, err, value)
		}
	}
}

// An ingest that fails midway, its chunks partly committed (the map is full: a store out of
// space), returns the error and leaves every run staged for the next ingest.
func TestAnIngestThatFailsMidwayReturnsItsErrorAndLeavesTheRunsStaged(t *testing.T) {
	const name = "v__v20260101000000_abcdef"
	env, states, digests, stage_, data := loadingVersionIn(t, name, 17<<20)
	value := strings.Repeat("v", 40)
	for run := 0; run < 5; run++ { // about 14 MiB staged in a 17 MiB map: merged beside them, the map overflows early
		var keys, values []string
		for i := 0; i < 50_000; i++ {
			keys, values = append(keys, fmt.Sprintf("k%07d", i*5+run)), append(values, value)
		}
		stage(t, env, stage_, states, digests, name, keys, values)
	}
	env.IngestChunkBytes = 1 << 20
	if _, _, _, err := env.Ingest(data, stage_, states, digests, name, Layers{}); err == nil || !strings.Contains(err.Error(), "MDB_MAP_FULL") {
		t.Fatalf("an ingest overflowing the map: %v", err)
	}
	txn, err := env.BeginRead()
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Abort()
	if _, found, _ := txn.Get(data, []byte("k0000000")); !found {
		t.Fatal("no chunk was committed before the map was full: the test overflows too early")
	}
	var number [8]byte
	for run := uint64(0); run < 5; run++ {
		binary.BigEndian.PutUint64(number[:], run)
		if _, found, _ := txn.Get(stage_, bytes.Join([][]byte{[]byte(name), number[:]}, []byte{0})); !found {
			t.Errorf("run %d is no longer staged after a failed ingest", run)
		}
	}
}

// An ingest of 2 M records of 200 bytes in 20 staged runs (a nested 2 M-row version's seal):
// the merge and the appends into a B-tree three levels deep.
func BenchmarkIngest(b *testing.B) {
	benchmarkIngest(b, 20, 100_000, 190, func(j, run int) []byte {
		return binary.AppendUvarint(nil, uint64(j*20+run)*2654435761%(1<<40))
	})
}

// An ingest of 5 M flat records (a 4-byte varint key, 35-byte values) in 50 staged runs of
// 100 k (a flat 5 M-row version's seal): the merge's comparisons and the appends dominate.
func BenchmarkIngestFlat(b *testing.B) {
	benchmarkIngest(b, 50, 100_000, 35, func(j, run int) []byte {
		return append([]byte{0x08}, binary.AppendUvarint(nil, uint64(j*50+run))...)
	})
}

// benchmarkIngest times the ingest of runs staged runs of perRun records, the j-th of run
// run keyed key(j, run), each value valueLen bytes.
func benchmarkIngest(b *testing.B, runs, perRun, valueLen int, key func(j, run int) []byte) {
	const name = "v__v20260101000000_abcdef"
	value := bytes.Repeat([]byte{'v'}, valueLen)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		env, states, digests, stage_, data := loadingVersion(b, name)
		for run := 0; run < runs; run++ {
			var batch Batch
			for j := 0; j < perRun; j++ {
				k := key(j, run)
				batch.Keys, batch.Values = append(batch.Keys, k...), append(batch.Values, value...)
				batch.KeyLengths, batch.ValueLengths = append(batch.KeyLengths, uint32(len(k))), append(batch.ValueLengths, uint32(len(value)))
			}
			if _, err := env.StageBatch(stage_, states, digests, name, batch, Digest{Count: uint64(perRun)}); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		if _, _, records, err := env.Ingest(data, stage_, states, digests, name, Layers{}); err != nil || records != uint64(runs*perRun) {
			b.Fatalf("ingest: %d records, %v", records, err)
		}
		b.StopTimer()
		env.Close()
	}
}

// The store's written pages are handed to the disk a tick after a staged run, every tick
// while an ingest runs, and not at all while nothing is written; Close stops it.
func TestWritesAreHandedToTheDiskAsTheyCommitAndNotWhileIdle(t *testing.T) {
	var calls atomic.Int32
	before := startWriteback
	startWriteback = func(e *Env) { calls.Add(1); before(e) }
	t.Cleanup(func() { startWriteback = before })
	const name = "v__v20260101000000_abcdef"
	env, states, digests, stage_, data := loadingVersion(t, name)
	idle := func() { time.Sleep(4 * WritebackEvery) }
	// reaching wants within 5 s (a loaded machine may run the goroutine late)
	eventually := func(what string, want func(int32) bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !want(calls.Load()); {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d writebacks", what, calls.Load())
			}
			time.Sleep(WritebackEvery / 5)
		}
	}

	idle()
	if n := calls.Load(); n != 0 {
		t.Fatalf("%d writebacks before anything was written", n)
	}
	stage(t, env, stage_, states, digests, name, []string{"a", "b"}, []string{"1", "2"})
	eventually("after one staged run", func(n int32) bool { return n == 1 })
	idle()
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d writebacks after one staged run and a pause, want 1", n)
	}
	done := env.long() // a long write running (an ingest, a merge): every tick
	eventually("while a long write runs", func(n int32) bool { return n >= 4 })
	done()
	idle()
	settled := calls.Load()
	idle()
	if n := calls.Load(); n != settled {
		t.Fatalf("%d writebacks after the long write ended and one more", n-settled)
	}
	if _, _, _, err := env.Ingest(data, stage_, states, digests, name, Layers{}); err != nil {
		t.Fatal(err)
	}
	eventually("after an ingest", func(n int32) bool { return n > settled })
	env.Close()
	closed := calls.Load()
	env.wrote.Store(true)
	idle()
	if n := calls.Load(); n != closed {
		t.Fatalf("%d writebacks after Close", n-closed)
	}
}

// A layered version's ingest keeps its running digest exact for puts of keys it deleted
// first (their tombstones walked in key order, kvd_tomb_walk) and of keys no layer below
// holds, however the two interleave, before the first tombstone, past the last, and across
// chunk commits; one put of a key a layer below holds that it did not delete (between two tombstones) makes the
// digest inexact.
func TestALayeredIngestIsExactOnlyForPutsOfKeysItDeletedOrNothingBelowHolds(t *testing.T) {
	const name = "v__v20260102000000_abcdef"
	var bottom []string
	for i := 0; i < 4000; i++ {
		bottom = append(bottom, fmt.Sprintf("key-%06d", 2*i+1)) // odd keys: even ones are fresh
	}
	upper := [][]string{{"key-000003", "key-002001"}}
	// the hiding put alone (checked by the last check before the commit), or among hundreds
	// of fresh ones (the puts are checked below 256 at a time and before each commit: it
	// lands in neither the first nor the last check)
	hidingAlone := []string{"key-003003"}
	hidingAmong := []string{"key-003003"}
	for i := 1000; i < 2000; i++ {
		if i%5 != 0 {
			hidingAmong = append(hidingAmong, fmt.Sprintf("key-%06d", 2*i))
		}
	}
	for _, c := range []struct {
		chunk  int
		hiding []string
	}{{1 << 30, hidingAlone}, {256, hidingAlone}, {1 << 30, hidingAmong}, {256, hidingAmong}} {
		chunk := c.chunk
		env, own, stage_, states, digests, layers, _ := layeredStore(t, name, upper, bottom)
		env.IngestChunkBytes = chunk
		var doomed []byte
		var dlens []uint32
		var puts []string
		for i := 500; i < 3500; i++ {
			if i%3 == 0 { // a changed key: deleted, then put
				key := fmt.Sprintf("key-%06d", 2*i+1)
				doomed, dlens = append(doomed, key...), append(dlens, uint32(len(key)))
				puts = append(puts, key)
			}
			if i%5 == 0 { // a fresh key
				puts = append(puts, fmt.Sprintf("key-%06d", 2*i))
			}
		}
		puts = append(puts, "key-000000", "key-999999", "key-zzz") // before the first tombstone, past the last
		if _, ok, err := env.Delete(own, stage_, states, digests, name, layers, doomed, dlens, pairHashes); err != nil || !ok {
			t.Fatal(ok, err)
		}
		values := make([]string, len(puts))
		for i := range values {
			values[i] = "a new value"
		}
		stage(t, env, stage_, states, digests, name, puts[:len(puts)/2], values[:len(puts)/2])
		stage(t, env, stage_, states, digests, name, puts[len(puts)/2:], values[len(puts)/2:])
		exact := func() bool {
			t.Helper()
			if loading, _, _, err := env.Ingest(own, stage_, states, digests, name, layers); err != nil || !loading {
				t.Fatal(loading, err)
			}
			txn, err := env.BeginRead()
			if err != nil {
				t.Fatal(err)
			}
			defer txn.Abort()
			got, _, _ := txn.Get(digests, []byte(name))
			return len(got) == 25 && got[24] == 1
		}
		if !exact() {
			t.Fatalf("chunks of %d bytes: puts of deleted and fresh keys made the running digest inexact", chunk)
		}
		hidingValues := make([]string, len(c.hiding))
		for i := range hidingValues {
			hidingValues[i] = "hides the bottom's pair, or is fresh"
		}
		stage(t, env, stage_, states, digests, name, c.hiding, hidingValues)
		if exact() {
			t.Fatalf("chunks of %d bytes, %d puts: a put hiding a pair below that was not deleted left the digest exact",
				chunk, len(c.hiding))
		}
	}
}
