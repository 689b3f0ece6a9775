package lmdb

import (
	"bytes"
	"math/rand"
	"sort"
	"testing"
)

// GetMany (kvd_search_many: many keys' searches overlapped) finds what Get finds key by key:
// in a tree of three levels, keys present and absent (before the first, between, after the
// last), values on overflow pages, a key asked twice, more keys than one call's chunk; and
// nothing in an empty database.
func TestGetManyFindsWhatGetFindsKeyByKey(t *testing.T) {
	env, db, put := testEnv(t)
	full, empty := db("full"), db("empty")
	rng := rand.New(rand.NewSource(7))
	keys := randomKeys(rng, 20000)
	for i, k := range keys {
		value := bytes.Repeat([]byte{byte(i)}, 1+rng.Intn(40))
		if i%500 == 0 {
			value = bytes.Repeat([]byte{byte(i)}, 5000+rng.Intn(20000)) // an overflow page's
		}
		put(full, k, string(value))
	}
	sorted := append([]string(nil), keys...)
	sort.Strings(sorted)
	asked := []string{"\x00", sorted[0], sorted[len(sorted)-1], sorted[len(sorted)-1] + "\x00", "\xff\xff\xff", sorted[10], sorted[10]}
	for i := 0; i < 1000; i++ {
		asked = append(asked, keys[rng.Intn(len(keys))], "absent"+keys[rng.Intn(len(keys))], sorted[rng.Intn(len(sorted))]+"\x01")
	}
	txn, err := env.BeginRead()
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Abort()
	if depth, err := txn.depth(full); err != nil || depth < 3 {
		t.Fatalf("the test's tree has depth %d (%v), not the three levels it means to search", depth, err)
	}
	for _, dbi := range []DBI{full, empty} {
		for _, order := range []string{"as asked", "ascending"} {
			ask := append([]string(nil), asked...)
			if order == "ascending" {
				sort.Strings(ask)
			}
			var blob []byte
			lens := make([]uint32, len(ask))
			for i, k := range ask {
				blob = append(blob, k...)
				lens[i] = uint32(len(k))
			}
			got, err := txn.GetMany(dbi, blob, lens)
			if err != nil {
				t.Fatal(err)
			}
			hits := 0
			for i, k := range ask {
				want, found, err := txn.Get(dbi, []byte(k))
				if err != nil {
					t.Fatal(err)
				}
				if found != (got[i] != nil) || !bytes.Equal(want, got[i]) {
					t.Fatalf("key %d (%q) %s: GetMany %q, Get %q (found %v)", i, k, order, got[i], want, found)
				}
				if found {
					hits++
				}
			}
			if dbi == full && hits < len(ask)/3 || dbi == empty && hits != 0 {
				t.Fatalf("%d of %d keys found", hits, len(ask))
			}
		}
	}
}
