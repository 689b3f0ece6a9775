package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"bulldozer/kvd/internal/kvpb"
)

// pagedStore is a store whose version "s__v1" (alias "s") holds keys k000..k(n-1), readable
// for the first readablePages scan calls.
type pagedStore struct {
	store
	n, readablePages, calls int
	targets                 []string
}

func (p *pagedStore) scan(_ context.Context, target *kvpb.Target, after []byte, limit int) (string, *scanRecords, bool) {
	p.calls++
	p.targets = append(p.targets, show(target))
	if p.calls > p.readablePages {
		return "", nil, false
	}
	var records []*kvpb.KeyValue
	for i := 0; i < p.n && len(records) < limit; i++ {
		if k := []byte(fmt.Sprintf("k%03d", i)); string(k) > string(after) {
			records = append(records, &kvpb.KeyValue{Key: k, Value: []byte("v")})
		}
	}
	return "s__v1", &scanRecords{ColumnarRecords: columnar(records)}, true
}

// sentPages records what a scan sent its caller.
type sentPages struct {
	grpc.ServerStream
	pages []*kvpb.ScanResponse
}

func (s *sentPages) Send(r *kvpb.ScanResponse) error { s.pages = append(s.pages, r); return nil }
func (s *sentPages) Context() context.Context        { return context.Background() }
func (s *sentPages) SetTrailer(metadata.MD)          {}

// dal is the reference DAL's side: it records the scans forwarded to it and answers with
// one empty page.
type dal struct {
	kvpb.KvDataClient
	forwarded []*kvpb.ScanRequest
}

type onePage struct {
	grpc.ClientStream
	sent bool
}

func (o *onePage) Recv() (*kvpb.ScanResponse, error) {
	if o.sent {
		return nil, io.EOF
	}
	o.sent = true
	return &kvpb.ScanResponse{Namespace: "from the DAL"}, nil
}

func (d *dal) Scan(_ context.Context, req *kvpb.ScanRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[kvpb.ScanResponse], error) {
	d.forwarded = append(d.forwarded, req)
	return &onePage{}, nil
}

// show is a target as the cases name it.
func show(t *kvpb.Target) string {
	if ns := t.GetNamespace(); ns != "" {
		return "namespace " + ns
	}
	return "alias " + t.GetAlias()
}

func byAlias(a string) *kvpb.Target { return &kvpb.Target{Target: &kvpb.Target_Alias{Alias: a}} }

// pageKeys are a page's keys, in whichever form it holds its records.
func pageKeys(p *kvpb.ScanResponse) (keys []string) {
	for _, r := range p.Records {
		keys = append(keys, string(r.Key))
	}
	if c := p.Columnar; c != nil {
		at := 0
		for i, n := range c.KeyLengths {
			keys = append(keys, string(c.Keys[at:at+int(n)]))
			if string(c.Values[i:i+1]) != "v" || len(c.ValueLengths) != len(c.KeyLengths) {
				keys = append(keys, "a value not laid out")
			}
			at += int(n)
		}
	}
	return keys
}

func keysOf(pages []*kvpb.ScanResponse) (keys []string) {
	for _, p := range pages {
		keys = append(keys, pageKeys(p)...)
	}
	return keys
}

// A scan's pages on the fast path: the page size asked for (the default when none, never
// more than the limit of a page), a token naming the version and the last key on every page
// but the last, the request's limit; past the first page, and from a page token, the
// version is read pinned. A version that stops being readable partway goes on at the DAL
// from the last key sent, pinned; a request the fast path cannot take goes to it whole.
func TestScanPagesAndWhereTheyGoOn(t *testing.T) {
	alias := byAlias("s")
	cases := []struct {
		name            string
		req             *kvpb.ScanRequest
		n, readable     int
		wantSizes       []int
		wantTargets     int
		wantForwarded   *kvpb.ScanRequest
		wantFirstTarget string
	}{
		{"pages of 4", &kvpb.ScanRequest{Target: alias, PageSize: 4}, 10, 9, []int{4, 4, 2}, 3, nil, "alias s"},
		{"a full last page ends with an empty one", &kvpb.ScanRequest{Target: alias, PageSize: 5}, 10, 9, []int{5, 5, 0}, 3, nil, "alias s"},
		{"the default page", &kvpb.ScanRequest{Target: alias}, 10, 9, []int{10}, 1, nil, "alias s"},
		{"no page over the limit", &kvpb.ScanRequest{Target: alias, PageSize: 100}, 10, 9, []int{3, 3, 3, 1}, 4, nil, "alias s"},
		{"a limit", &kvpb.ScanRequest{Target: alias, PageSize: 4, Limit: 6}, 10, 9, []int{4, 2}, 2, nil, "alias s"},
		{"a limit at a page's end", &kvpb.ScanRequest{Target: alias, PageSize: 3, Limit: 6}, 10, 9, []int{3, 3}, 2, nil, "alias s"},
		{"from a token", &kvpb.ScanRequest{Target: alias, PageSize: 5, PageToken: []byte("s__v1\x00k005")}, 10, 9, []int{4}, 1, nil, "alias s@s__v1"},
		{"from a token, by name", &kvpb.ScanRequest{Target: &kvpb.Target{Target: &kvpb.Target_Namespace{Namespace: "other"}}, PageToken: []byte("s__v1\x00k005")}, 10, 9, []int{4}, 1, nil, "namespace s__v1"},
		{"unreadable partway", &kvpb.ScanRequest{Target: alias, PageSize: 4, Limit: 9}, 10, 1, []int{4, 0}, 2,
			&kvpb.ScanRequest{Target: byAlias("s@s__v1"), Limit: 5, PageToken: []byte("s__v1\x00k003"), PageSize: 4}, "alias s"},
		{"columnar pages", &kvpb.ScanRequest{Target: alias, PageSize: 4, Columnar: true}, 10, 9, []int{4, 4, 2}, 3, nil, "alias s"},
		{"unreadable partway, columnar", &kvpb.ScanRequest{Target: alias, PageSize: 4, Columnar: true}, 10, 1, []int{4, 0}, 2,
			&kvpb.ScanRequest{Target: byAlias("s@s__v1"), PageToken: []byte("s__v1\x00k003"), PageSize: 4, Columnar: true}, "alias s"},
		{"unreadable at once", &kvpb.ScanRequest{Target: alias, PageSize: 4}, 10, 0, []int{0}, 1,
			&kvpb.ScanRequest{Target: alias, PageSize: 4}, "alias s"},
		{"a malformed token", &kvpb.ScanRequest{Target: alias, PageToken: []byte("no separator")}, 10, 9, []int{0}, 0,
			&kvpb.ScanRequest{Target: alias, PageToken: []byte("no separator")}, ""},
		{"no target", &kvpb.ScanRequest{PageSize: 4}, 10, 9, []int{0}, 0, &kvpb.ScanRequest{PageSize: 4}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			store := &pagedStore{n: c.n, readablePages: c.readable}
			backend := &dal{}
			s := &dataServer{store: store, backend: backend, stats: newStats(), limits: Limits{MaxScanPage: 3}}
			if c.name != "no page over the limit" {
				s.limits.MaxScanPage = 1000
			}
			stream := &sentPages{}
			if err := s.Scan(c.req, stream); err != nil {
				t.Fatal(err)
			}
			var sizes []int
			for i, p := range stream.pages {
				keys := pageKeys(p)
				sizes = append(sizes, len(keys))
				last := i == len(stream.pages)-1
				if p.Namespace == "from the DAL" {
					continue
				}
				if c.req.Columnar && len(p.Records) > 0 || !c.req.Columnar && p.Columnar != nil {
					t.Errorf("page %d: %d records, columnar %v, for a request columnar %v", i, len(p.Records), p.Columnar != nil, c.req.Columnar)
				}
				if want := len(keys) > 0 && !last; (len(p.NextPageToken) > 0) != want {
					t.Errorf("page %d: token %q", i, p.NextPageToken)
				}
				if len(p.NextPageToken) > 0 && string(p.NextPageToken) != "s__v1\x00"+keys[len(keys)-1] {
					t.Errorf("page %d: token %q", i, p.NextPageToken)
				}
			}
			if !slices.Equal(sizes, c.wantSizes) {
				t.Errorf("pages of %v, want %v", sizes, c.wantSizes)
			}
			if keys := keysOf(stream.pages); len(keys) > 0 && !slices.IsSorted(keys) || len(slices.Compact(slices.Clone(keys))) != len(keys) {
				t.Errorf("keys %v", keys)
			}
			if len(store.targets) != c.wantTargets || c.wantTargets > 0 && store.targets[0] != c.wantFirstTarget {
				t.Errorf("the store was read at %v", store.targets)
			}
			for _, later := range store.targets[min(1, len(store.targets)):] {
				if later != "alias s@s__v1" && later != "namespace s__v1" {
					t.Errorf("a later page read %s, not the version pinned", later)
				}
			}
			switch {
			case c.wantForwarded == nil && len(backend.forwarded) > 0:
				t.Errorf("forwarded %v", backend.forwarded)
			case c.wantForwarded != nil && (len(backend.forwarded) != 1 || !proto.Equal(backend.forwarded[0], c.wantForwarded)):
				t.Errorf("forwarded %v, want %s", backend.forwarded, c.wantForwarded)
			}
		})
	}
}

// failingPages is a caller that takes sendable pages and then goes away: its next Send fails.
type failingPages struct {
	sentPages
	sendable int
}

func (f *failingPages) Send(r *kvpb.ScanResponse) error {
	if len(f.pages) == f.sendable {
		return io.ErrClosedPipe
	}
	return f.sentPages.Send(r)
}

// The next page is read while the last one is sent, never more than one ahead: a caller
// that goes away gets the send's error, and the scan returns only once its reader has
// stopped reading (no page read after it returns, none more than one past the failed send).
func TestAScanReadsOnePageAheadAndStopsWithItsCaller(t *testing.T) {
	for sendable := 0; sendable < 4; sendable++ {
		store := &pagedStore{n: 100, readablePages: 100}
		s := &dataServer{store: store, backend: &dal{}, stats: newStats(), limits: Limits{MaxScanPage: 10}}
		stream := &failingPages{sendable: sendable}
		err := s.Scan(&kvpb.ScanRequest{Target: byAlias("s"), PageSize: 10}, stream)
		if err != io.ErrClosedPipe {
			t.Fatalf("%d pages sendable: %v", sendable, err)
		}
		read := store.calls
		if read < sendable+1 || read > sendable+2 {
			t.Errorf("%d pages sendable: %d read", sendable, read)
		}
		time.Sleep(10 * time.Millisecond)
		if store.calls != read {
			t.Errorf("%d pages sendable: a page read after the scan returned", sendable)
		}
	}
}

// reusedPages is a caller whose sent pages' keys are overwritten once sent, as a page's
// buffer is once gRPC has written it and handed it back to the pool; sent says a page went.
type reusedPages struct {
	sentPages
	keys []string
	sent chan struct{}
}

func (r *reusedPages) Send(resp *kvpb.ScanResponse) error {
	r.keys = append(r.keys, pageKeys(resp)...)
	for i := range resp.Columnar.Keys {
		resp.Columnar.Keys[i] = 0xff
	}
	r.sent <- struct{}{}
	return nil
}

// gatedStore reads each page after the first only once the page before it has been sent.
type gatedStore struct {
	pagedStore
	sent chan struct{}
}

func (g *gatedStore) scan(ctx context.Context, target *kvpb.Target, after []byte, limit int) (string, *scanRecords, bool) {
	if g.calls > 0 {
		<-g.sent
	}
	return g.pagedStore.scan(ctx, target, after, limit)
}

// The next page starts past the last key sent, whatever became of the page's buffer once
// it was sent: the reader keeps its own copy of that key.
func TestAScanGoesOnPastItsLastKeyWhateverBecomesOfThePageSent(t *testing.T) {
	sent := make(chan struct{}, 100)
	store := &gatedStore{pagedStore: pagedStore{n: 25, readablePages: 100}, sent: sent}
	s := &dataServer{store: store, backend: &dal{}, stats: newStats(), limits: Limits{MaxScanPage: 10}}
	stream := &reusedPages{sent: sent}
	if err := s.Scan(&kvpb.ScanRequest{Target: byAlias("s"), PageSize: 10, Columnar: true}, stream); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := 0; i < 25; i++ {
		want = append(want, fmt.Sprintf("k%03d", i))
	}
	if !slices.Equal(stream.keys, want) {
		t.Fatalf("keys %v, want %v", stream.keys, want)
	}
}
