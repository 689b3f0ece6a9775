package main

import (
	"context"
	"errors"
	"log/slog"

	"bulldozer/kvd/internal/kvpb"
	"bulldozer/kvd/lmdb"
	"bulldozer/kvd/redisstore"
)

// redisStore serves the fast path from Redis (package redisstore).
type redisStore struct{ r *redisstore.Store }

func (s redisStore) stage(ctx context.Context, name string, b lmdb.Batch, d lmdb.Digest) (bool, error) {
	return s.r.WriteBatch(ctx, name, redisstore.Batch(b), redisstore.Digest(d))
}

// ingest: Redis writes in place, so there is nothing to merge; the reference DAL answers.
func (redisStore) ingest(string) (uint64, uint64, bool) { return 0, 0, false }

func (redisStore) delete(string, [][]byte) (uint64, bool) { return 0, false }

// sample: the reference DAL answers (its scan of Redis is the cost, not this call's).
func (redisStore) sample(context.Context, *kvpb.Target, int, uint64) (string, []sampled, uint64, bool) {
	return "", nil, 0, false
}

// scan: the reference DAL answers (a Redis version is scanned in its key buckets' order).
func (redisStore) scan(context.Context, *kvpb.Target, []byte, int) (string, *scanRecords, bool) {
	return "", nil, false
}

func (s redisStore) getMany(ctx context.Context, target *kvpb.Target, keys [][]byte) (string, [][]byte, bool) {
	ns, alias, pinned, ok := parseTarget(target)
	if !ok || target.GetSchemaGeneration() != 0 {
		return "", nil, false // a read naming its schema generation is checked by the reference DAL
	}
	name, err := s.r.Resolve(ctx, ns, alias, pinned)
	if err == nil {
		var values [][]byte
		if values, err = s.r.GetMany(ctx, name, keys); err == nil {
			return name, values, true
		}
	}
	if !errors.Is(err, redisstore.ErrNotReadable) {
		slog.Warn("read: forwarded to the reference DAL", "error", err.Error())
	}
	return "", nil, false
}
