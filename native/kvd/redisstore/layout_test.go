package redisstore

import (
	"bytes"
	"fmt"
	"testing"
)

// layOut's arguments are every pair of the batch, grouped by bucket in bucket order, each
// bucket's pairs in batch order (a key repeated in the batch keeps its later value last).
func TestLayOutGroupsPairsByBucketInBatchOrder(t *testing.T) {
	s := &Store{buckets: 7}
	var b Batch
	var want [][2][]byte
	add := func(k, v string) {
		b.Keys, b.Values = append(b.Keys, k...), append(b.Values, v...)
		b.KeyLengths, b.ValueLengths = append(b.KeyLengths, uint32(len(k))), append(b.ValueLengths, uint32(len(v)))
		want = append(want, [2][]byte{[]byte(k), []byte(v)})
	}
	for i := range 500 {
		add(fmt.Sprintf("key-%d", i%400), fmt.Sprintf("value-%d", i)) // 100 keys twice
	}
	add("empty", "")
	raw, starts := s.layOut(b)
	if len(raw) != 2*len(want) || len(starts) != int(s.buckets)+1 || starts[s.buckets] != len(raw) {
		t.Fatalf("%d arguments, starts %v, for %d pairs", len(raw), starts, len(want))
	}
	at := 0
	for bucket := range s.buckets {
		if starts[bucket] != at {
			t.Fatalf("bucket %d starts at %d, not %d", bucket, starts[bucket], at)
		}
		for _, p := range want { // the pairs of this bucket, in batch order
			if s.Bucket(p[0]) != bucket {
				continue
			}
			if !bytes.Equal(raw[at], p[0]) || !bytes.Equal(raw[at+1], p[1]) {
				t.Fatalf("argument %d: %q=%q, want %q=%q", at, raw[at], raw[at+1], p[0], p[1])
			}
			at += 2
		}
	}
	if at != len(raw) {
		t.Fatalf("%d arguments checked of %d", at, len(raw))
	}
}

func TestLayOutOfAnEmptyBatch(t *testing.T) {
	raw, starts := (&Store{buckets: 3}).layOut(Batch{})
	if len(raw) != 0 || len(starts) != 4 || starts[3] != 0 {
		t.Fatalf("%d arguments, starts %v", len(raw), starts)
	}
}
