package main

import (
	"log/slog"
	"sync"
)

// stats counts what this process served itself and what it forwarded, and what it wrote
// per namespace; logged when it stops.
type stats struct {
	mu        sync.Mutex
	native    map[string]uint64
	forwarded map[string]uint64
	records   map[string]uint64
	bytes     map[string]uint64
}

func newStats() *stats {
	return &stats{native: map[string]uint64{}, forwarded: map[string]uint64{}, records: map[string]uint64{}, bytes: map[string]uint64{}}
}

func (s *stats) served(method string, native bool) {
	s.mu.Lock()
	if native {
		s.native[method]++
	} else {
		s.forwarded[method]++
	}
	s.mu.Unlock()
}

func (s *stats) written(namespace string, records, bytes uint64) {
	s.mu.Lock()
	s.records[namespace] += records
	s.bytes[namespace] += bytes
	s.mu.Unlock()
}

func (s *stats) log() {
	s.mu.Lock()
	defer s.mu.Unlock()
	slog.Info("data plane totals", "served", s.native, "forwarded", s.forwarded, "records_written", s.records, "bytes_written", s.bytes)
}
