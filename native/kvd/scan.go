package main

// Scan on the fast path: a version's pairs in key order, a page at a time, read through its
// layers by the compiled merged walk (lmdb.Env.VisiblePage), the next page read while the
// last one is sent (readPages) — the reference DAL's
// DataServicer.Scan rule, page for page: the first page resolves the target; every later
// one, and a page token's, reads the version the scan started on (a new version going live
// meanwhile changes nothing), each page in a read transaction of its own that finds it
// still readable. A request the fast path does not take (a malformed token or name, a
// target it cannot resolve, a version not readable, an engine without it) goes to the
// reference DAL, which answers with the canonical error; a scan whose version stops being
// readable partway goes on there from its last key, where the DAL refuses it.

import (
	"bytes"
	"context"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc/status"

	"bulldozer/kvd/internal/kvpb"
	"bulldozer/kvd/internal/shared"
)

// scanRecords are a page of a scan: its records column-wise, and the buffers of
// batchBuffers their keys and values are (nil when they are not), the page's to hand back
// (release), or to gRPC with the page (scanPage).
type scanRecords struct {
	*kvpb.ColumnarRecords
	keys, values *[]byte
}

// release hands the page's buffers back to batchBuffers; its records must not be used after.
func (r *scanRecords) release() {
	if r.keys != nil {
		batchBuffers.Put(r.keys)
		batchBuffers.Put(r.values)
		r.keys, r.values, r.ColumnarRecords = nil, nil, nil
	}
}

// scan is up to limit of the readable version's pairs past after (from its first key when
// after is empty), copied out of the store into one page laid out column-wise, in buffers
// of batchBuffers; ok is false when the reference DAL must answer.
func (m *lmdbStore) scan(_ context.Context, target *kvpb.Target, after []byte, limit int) (name string, page *scanRecords, ok bool) {
	name, _, data, tombs, ok := m.target(target)
	if !ok {
		return "", nil, false
	}
	read, err := m.env.VisiblePage(data, tombs, after, limit, m.readableNow(name), &batchBuffers)
	if err != nil {
		return "", nil, false
	}
	records := &kvpb.ColumnarRecords{Keys: *read.Keys, KeyLengths: read.KeyLengths, Values: *read.Values, ValueLengths: read.ValueLengths}
	return name, &scanRecords{ColumnarRecords: records, keys: read.Keys, values: read.Values}, true
}

// scanStart is where a scan request starts: its target and the key it resumes past (a page
// token, name NUL last key, pins the version it names); ok is false when the reference DAL
// must answer (no target, a malformed token or name).
func scanStart(req *kvpb.ScanRequest) (target *kvpb.Target, after []byte, ok bool) {
	target = req.GetTarget()
	if target.GetNamespace() == "" && target.GetAlias() == "" {
		return nil, nil, false
	}
	token := req.GetPageToken()
	if len(token) == 0 {
		return target, nil, true
	}
	pinned, last, found := bytes.Cut(token, []byte{0})
	if !found || !namespaceRE.Match(pinned) {
		return nil, nil, false
	}
	return pinnedTarget(target, string(pinned)), last, true
}

// pinnedTarget addresses the version name the way target does: by its alias pinned to it,
// or by its name.
func pinnedTarget(target *kvpb.Target, name string) *kvpb.Target {
	if alias := target.GetAlias(); alias != "" {
		alias, _, _ = strings.Cut(alias, "@")
		return &kvpb.Target{Target: &kvpb.Target_Alias{Alias: alias + "@" + name}}
	}
	return &kvpb.Target{Target: &kvpb.Target_Namespace{Namespace: name}}
}

// scanned is one page of a scan as the store read it (ok false: the fast path could not, and
// the reference DAL must answer from where the scan stood: target, after, remaining).
type scanned struct {
	name      string
	records   *scanRecords
	ok, done  bool
	target    *kvpb.Target
	after     []byte
	remaining uint64
}

// readPages reads a scan's pages in order into out, one page ahead of the one being sent:
// the store walks page n+1 while Scan marshals and sends page n (a 10 M-record scan was one
// core's walk, copy, marshal and send in turn). It ends after the last page, a page the
// fast path could not read, or when ctx ends.
func (s *dataServer) readPages(ctx context.Context, target *kvpb.Target, after []byte, page int, limit uint64, out chan<- scanned) {
	remaining := limit // 0: every record
	for ctx.Err() == nil {
		want := page
		if remaining > 0 && remaining < uint64(want) {
			want = int(remaining)
		}
		name, records, ok := s.store.scan(ctx, target, after, want)
		read := scanned{name: name, records: records, ok: ok, target: target, after: after, remaining: remaining}
		if ok {
			got := len(records.KeyLengths)
			if remaining > 0 {
				remaining -= uint64(got)
			}
			read.done = got < want || limit > 0 && remaining == 0
			if got > 0 { // the page's last key, copied: the page's buffer goes back to the pool once sent
				after = append([]byte(nil), records.Keys[len(records.Keys)-int(records.KeyLengths[got-1]):]...)
			}
		}
		select {
		case out <- read:
		case <-ctx.Done():
			return
		}
		if !ok || read.done {
			return
		}
		target = pinnedTarget(target, name)
	}
}

func (s *dataServer) Scan(req *kvpb.ScanRequest, stream kvpb.KvData_ScanServer) error {
	started := time.Now()
	target, after, ok := scanStart(req)
	if !ok {
		return s.forwardScan(req, stream)
	}
	page := int(req.GetPageSize())
	if page == 0 {
		page = shared.LimitsDefaultScanPage
	}
	page = min(page, s.limits.MaxScanPage)
	ctx, cancel := context.WithCancel(stream.Context())
	pages := make(chan scanned)
	reader := make(chan struct{})
	go func() {
		defer close(reader)
		defer close(pages)
		s.readPages(ctx, target, after, page, req.GetLimit(), pages)
	}()
	defer func() { // the reader ends before the scan does
		cancel()
		for read := range pages {
			if read.ok {
				read.records.release()
			}
		}
		<-reader
	}()
	pinned := "" // the version the scan reads, from its first page on
	for read := range pages {
		if !read.ok && pinned == "" {
			return s.forwardScan(req, stream)
		}
		if !read.ok {
			// the version stopped being readable between pages: the DAL goes on from the
			// last key sent (and refuses, with its error)
			return s.forwardScan(&kvpb.ScanRequest{Target: read.target, Limit: read.remaining, PageSize: req.GetPageSize(),
				PageToken: append([]byte(pinned+"\x00"), read.after...), Columnar: req.GetColumnar()}, stream)
		}
		records := read.records
		got := len(records.KeyLengths)
		var token []byte
		if !read.done && got > 0 {
			last := records.Keys[len(records.Keys)-int(records.KeyLengths[got-1]):]
			token = append([]byte(read.name+"\x00"), last...)
		}
		var err error
		switch {
		case req.GetColumnar() && records.keys != nil: // its buffers go to gRPC with it
			err = stream.SendMsg(&scanPage{namespace: read.name, token: token, records: records})
		case req.GetColumnar():
			err = stream.Send(&kvpb.ScanResponse{Namespace: read.name, Columnar: records.ColumnarRecords, NextPageToken: token})
		default:
			err = stream.Send(&kvpb.ScanResponse{Namespace: read.name, Records: keyValues(records.ColumnarRecords), NextPageToken: token})
			records.release()
		}
		if err != nil {
			return err
		}
		if read.done {
			s.stats.served("Scan", true)
			s.metrics.request("Scan", "OK", started)
			return nil
		}
		pinned = read.name
	}
	return status.FromContextError(stream.Context().Err()).Err() // the caller went away
}

// keyValues are columnar records as messages (their keys and values pointing into c).
func keyValues(c *kvpb.ColumnarRecords) []*kvpb.KeyValue {
	out := make([]*kvpb.KeyValue, len(c.KeyLengths))
	k, v := 0, 0
	for i := range out {
		kn, vn := int(c.KeyLengths[i]), int(c.ValueLengths[i])
		out[i] = &kvpb.KeyValue{Key: c.Keys[k : k+kn : k+kn], Value: c.Values[v : v+vn : v+vn]}
		k, v = k+kn, v+vn
	}
	return out
}

// forwardScan relays a scan to the reference DAL and its pages back.
func (s *dataServer) forwardScan(req *kvpb.ScanRequest, stream kvpb.KvData_ScanServer) error {
	s.stats.served("Scan", false)
	upstream, err := s.backend.Scan(forwarded(stream.Context()), req)
	if err != nil {
		return err
	}
	for {
		resp, err := upstream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			stream.SetTrailer(upstream.Trailer())
			return err
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}
