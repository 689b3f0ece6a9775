package lmdb

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"bulldozer/kvd/internal/shared"
)

// An ingest that commits its merged data in many small chunks stores what one transaction
// would: every key once, with the newest run's value, in key order, and deletes the runs.
func TestAnIngestInChunksStoresWhatOneTransactionWould(t *testing.T) {
	env, err := Open(t.TempDir(), Options{MapSize: 256 << 20, MaxDBs: 16, MaxReaders: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	const name = "v__v20260101000000_abcdef"
	dbis := map[string]DBI{}
	for _, db := range []string{shared.StoreMetaStates, shared.StoreMetaDigests, shared.StoreMetaStage, shared.StoreDataPrefix + name} {
		if err := env.createDB(db); err != nil {
			t.Fatal(err)
		}
		if dbis[db], err = env.DBI(db); err != nil {
			t.Fatal(err)
		}
	}
	states, digests, stage, data := dbis[shared.StoreMetaStates], dbis[shared.StoreMetaDigests], dbis[shared.StoreMetaStage], dbis[shared.StoreDataPrefix+name]
	if err := env.put(states, []byte(name), []byte(shared.StatesWritable)); err != nil {
		t.Fatal(err)
	}
	exact := make([]byte, 25)
	exact[24] = 1
	if err := env.put(digests, []byte(name), exact); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for run := 0; run < 5; run++ { // overlapping runs, keys in no order: the later run wins
		var b Batch
		for i := 0; i < 3000; i++ {
			key := fmt.Sprintf("key-%06d", (i*7919+run*1000)%9000)
			value := fmt.Sprintf("run %d value %d", run, i)
			want[key] = value
			b.Keys, b.Values = append(b.Keys, key...), append(b.Values, value...)
			b.KeyLengths, b.ValueLengths = append(b.KeyLengths, uint32(len(key))), append(b.ValueLengths, uint32(len(value)))
		}
		if loading, err := env.StageBatch(stage, states, digests, name, b, Digest{Count: 3000}); err != nil || !loading {
			t.Fatalf("stage: %v %v", loading, err)
		}
	}
	env.IngestChunkBytes = 1024 // a commit every few dozen records
	loading, runs, records, err := env.Ingest(data, stage, states, digests, name, Layers{})
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
		if _, found, _ := txn.Get(stage, bytes.Join([][]byte{[]byte(name), number[:]}, []byte{0})); found {
			t.Errorf("run %d is still staged", run)
		}
	}
}
