package main

// Scan on the fast path: a version's pairs in key order, a page at a time, read through its
// layers by the compiled merged walk (lmdb.Env.VisiblePairs) — the reference DAL's
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

	"bulldozer/kvd/internal/kvpb"
	"bulldozer/kvd/internal/shared"
)

// scanPage is up to limit of the readable version's pairs past after (from its first key
// when after is empty), copied out of the store; ok is false when the reference DAL must answer.
func (m *lmdbStore) scan(_ context.Context, target *kvpb.Target, after []byte, limit int) (name string, keys, values [][]byte, ok bool) {
	name, _, data, tombs, ok := m.target(target)
	if !ok {
		return "", nil, nil, false
	}
	keys, values = make([][]byte, 0, limit), make([][]byte, 0, limit)
	err := m.env.VisiblePairs(data, tombs, after, limit, m.readableNow(name), func(ks, vs [][]byte) error {
		size := 0
		for i := range ks {
			size += len(ks[i]) + len(vs[i])
		}
		arena := make([]byte, 0, size) // one copy per batch, out of the map before the transaction ends
		for i := range ks {
			arena = append(arena, ks[i]...)
			keys = append(keys, arena[len(arena)-len(ks[i]):len(arena):len(arena)])
			arena = append(arena, vs[i]...)
			values = append(values, arena[len(arena)-len(vs[i]):len(arena):len(arena)])
		}
		return nil
	})
	if err != nil {
		return "", nil, nil, false
	}
	return name, keys, values, true
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
	remaining := req.GetLimit() // 0: every record
	pinned := ""                // the version the scan reads, from its first page on
	for {
		want := page
		if remaining > 0 && remaining < uint64(want) {
			want = int(remaining)
		}
		name, keys, values, ok := s.store.scan(stream.Context(), target, after, want)
		if !ok && pinned == "" {
			return s.forwardScan(req, stream)
		}
		if !ok {
			// the version stopped being readable between pages: the DAL goes on from the
			// last key sent (and refuses, with its error)
			return s.forwardScan(&kvpb.ScanRequest{Target: target, Limit: remaining, PageSize: req.GetPageSize(),
				PageToken: append([]byte(pinned+"\x00"), after...)}, stream)
		}
		if remaining > 0 {
			remaining -= uint64(len(keys))
		}
		done := len(keys) < want || req.GetLimit() > 0 && remaining == 0
		resp := &kvpb.ScanResponse{Namespace: name, Records: make([]*kvpb.KeyValue, len(keys))}
		for i := range keys {
			resp.Records[i] = &kvpb.KeyValue{Key: keys[i], Value: values[i]}
		}
		if !done && len(keys) > 0 {
			resp.NextPageToken = append([]byte(name+"\x00"), keys[len(keys)-1]...)
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
		if done {
			s.stats.served("Scan", true)
			s.metrics.request("Scan", "OK", started)
			return nil
		}
		pinned, target, after = name, pinnedTarget(target, name), keys[len(keys)-1]
	}
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
