package lmdb

import (
	"testing"

	"bulldozer/kvd/internal/shared"
)

// The C code writes and reads the store's records in fixed layouts; they must be the ones
// shared.yaml states (Python packs the same records with these struct formats).
func TestLayoutsAreTheSharedOnes(t *testing.T) {
	for _, c := range []struct{ name, got, want string }{
		{"digest record", shared.StoreDigestRecord, "<QQQB"},
		{"staged run header", shared.StoreStageRunHeader, "<I"},
		{"staged record header", shared.StoreStageRecordHeader, "<II"},
	} {
		if c.got != c.want {
			t.Errorf("%s: shared.yaml says %q, the C code in lmdb.go writes %q", c.name, c.got, c.want)
		}
	}
}
