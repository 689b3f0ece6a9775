package main

// The KvData service, served from the store directly on the fast path. A request takes
// the fast path only when it is well formed and within the limits, and its namespace is in
// the state the call needs; every other request (a bad name, an empty key, a batch over a
// limit, a sealed or unknown namespace, a full store...) is forwarded unchanged to the
// reference DAL, which applies the same rule to the same store and answers with the
// canonical error. A forwarded write is safe: the fast path's transaction, if it ran, was
// aborted and wrote nothing.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"bulldozer/kvd/internal/kvpb"
	"bulldozer/kvd/internal/shared"
	"bulldozer/kvd/lmdb"
)

// The name patterns, the states a version is readable in and the store's layout: the
// rules shared with Python (proto/bulldozer/kv/v1/shared.yaml, generated into package shared).
var (
	aliasRE     = regexp.MustCompile(shared.NamesAliasPattern)
	namespaceRE = regexp.MustCompile(shared.NamesNamespacePattern)
	readable    = map[string]bool{}
)

func init() {
	for _, state := range shared.StatesReadable {
		readable[state] = true
	}
}

// Limits are the reference DAL's request limits (bulldozer.kv.server.rules.Limits, after the
// engine lowered the key limit).
type Limits struct {
	MaxKeyBytes, MaxValueBytes, MaxBatchRecords, MaxBatchGetKeys, MaxScanPage int
}

// store is what the fast path writes to and reads from: the embedded (LMDB) store, or
// Redis (redis.go). Each answers ok=false (or loading=false) when the reference DAL must
// handle the request, which then applies the rule and answers with the canonical error.
type store interface {
	// stage stores a well-formed batch of a LOADING namespace; loading is false (nothing
	// stored) when it is not LOADING.
	stage(ctx context.Context, name string, b lmdb.Batch, d lmdb.Digest) (loading bool, err error)
	// ingest merges a LOADING namespace's staged runs; ok is false when the reference DAL
	// must answer.
	ingest(name string) (runs, records uint64, ok bool)
	// delete deletes keys of a LOADING namespace; ok is false when the reference DAL must
	// answer.
	delete(name string, keys [][]byte) (deleted uint64, ok bool)
	// getMany reads keys from the readable version target addresses.
	getMany(ctx context.Context, target *kvpb.Target, keys [][]byte) (name string, values [][]byte, ok bool)
	// sample is the readable version's seeded sample of count pairs (see sample.go); ok is
	// false when the reference DAL must answer.
	sample(ctx context.Context, target *kvpb.Target, count int, seed uint64) (name string, pairs []sampled, scanned uint64, ok bool)
	// scan is up to limit of the readable version's pairs in key order past after (see
	// scan.go); ok is false when the reference DAL must answer.
	scan(ctx context.Context, target *kvpb.Target, after []byte, limit int) (name string, page *scanRecords, ok bool)
}

type dataServer struct {
	kvpb.UnimplementedKvDataServer
	store   store
	limits  Limits
	backend kvpb.KvDataClient
	stats   *stats
	metrics *metrics
}

// lmdbStore is the embedded store.
type lmdbStore struct {
	env  *lmdb.Env
	meta meta
	// layers that get no key filter: more keys than filterMaxEntries (a readable layer's
	// keys never change)
	unfiltered sync.Map
}

// meta are the store's own databases; filters is 0 in a store made before layers had
// filters (reads and writes then search every layer).
type meta struct{ namespaces, aliases, states, digests, stage, layers, filters lmdb.DBI }

// A read or write through a chain of layers asks each layer through its key filter, where
// it has one: a key the filter rules out is not searched for there. The filters a request
// of at least filterMinKeys keys finds missing are built first, once per layer and stored
// (lmdb.Env.BuildFilter: one pass over the layer's keys): a lookup of a few keys costs
// less than a pass over a layer. A read builds those of every layer but the bottom (the
// whole version the chain started from, which a reader may ask for a few hundred keys
// while nothing else needs its filter); a delta's ingest builds the bottom's too. A delta's
// new keys are searched for in the base twice (the loader's check that none is there, and
// the ingest's check that its put hides nothing), and they are absent: without the bottom's
// filter, each searched its B-tree (about 1.5 us a key in a 10 M-row version). The bottom's
// filter is built by the first delta made on it, and every later one's ingest, and every
// read, uses it. A delete neither consults nor builds it (its keys are the base's: lmdb's
// kvd_delete_filters); it builds the upper layers' it consults.
// A layer of more than filterMaxEntries keys (data and tombstones) gets none (62.5 MiB at
// 10 bits a key; about 2 s to build, once).
const (
	filterMinKeys    = 256
	filterMaxEntries = 50_000_000
)

func openMeta(env *lmdb.Env) (meta, error) {
	var m meta
	var err error
	for _, x := range []struct {
		dbi  *lmdb.DBI
		name string
	}{
		{&m.namespaces, shared.StoreMetaNamespaces},
		{&m.aliases, shared.StoreMetaAliases},
		{&m.states, shared.StoreMetaStates},
		{&m.digests, shared.StoreMetaDigests},
		{&m.stage, shared.StoreMetaStage},
		{&m.layers, shared.StoreMetaLayers},
	} {
		if *x.dbi, err = env.DBI(x.name); err != nil {
			return m, errors.New("the store has no " + x.name + " database (is it a Bulldozer embedded store?): " + err.Error())
		}
	}
	if m.filters, err = env.DBI(shared.StoreMetaFilters); err != nil {
		m.filters = 0 // an older store: no filters until the engine that opens it next makes the database
	}
	return m, nil
}

// forwarded is the context of a call to the reference DAL on behalf of ctx's caller: the
// caller's metadata and deadline go along.
func forwarded(ctx context.Context) context.Context {
	in, _ := metadata.FromIncomingContext(ctx)
	out := metadata.MD{}
	for k, v := range in {
		if strings.HasPrefix(k, ":") || strings.HasPrefix(k, "grpc-") || k == "content-type" || k == "user-agent" || k == "te" {
			continue
		}
		out[k] = v
	}
	return metadata.NewOutgoingContext(ctx, out)
}

// forward makes call to the reference DAL for ctx's caller. On an error, the returned status
// keeps its google.rpc.Status details (an ErrorInfo naming the exception class the client
// raises), and the DAL's trailing metadata goes back through setTrailer.
func forward[Req, Resp any](ctx context.Context, setTrailer func(metadata.MD),
	call func(context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, error) {
	var trailer metadata.MD
	resp, err := call(forwarded(ctx), req, grpc.Trailer(&trailer))
	if err != nil {
		setTrailer(trailer)
	}
	return resp, err
}

// unaryTrailer sets the trailer of the unary call ctx belongs to.
func unaryTrailer(ctx context.Context) func(metadata.MD) {
	return func(md metadata.MD) { _ = grpc.SetTrailer(ctx, md) }
}

// -- writes ---------------------------------------------------------------------------------

// putNative stores a well-formed columnar batch; ok is false when the reference DAL must
// handle it.
func (s *dataServer) putNative(ctx context.Context, req *kvpb.PutBatchRequest) (resp *kvpb.PutBatchResponse, ok bool) {
	c := req.GetColumnar()
	name := req.GetNamespace()
	if records := req.GetRecords(); len(records) > 0 {
		if c != nil {
			return nil, false
		}
		c = columnar(records)
	}
	if c == nil || !namespaceRE.MatchString(name) {
		return nil, false
	}
	n := len(c.KeyLengths)
	if n == 0 || n != len(c.ValueLengths) || n > s.limits.MaxBatchRecords {
		return nil, false
	}
	var d lmdb.Digest
	hasher := newPairHasher()
	keys, values := c.Keys, c.Values
	var kp, vp uint64
	for i := 0; i < n; i++ {
		kl, vl := uint64(c.KeyLengths[i]), uint64(c.ValueLengths[i])
		if kl == 0 || kl > uint64(s.limits.MaxKeyBytes) || vl > uint64(s.limits.MaxValueBytes) ||
			kp+kl > uint64(len(keys)) || vp+vl > uint64(len(values)) {
			return nil, false
		}
		d.Sum += hasher.hash(keys[kp:kp+kl], values[vp:vp+vl])
		kp, vp = kp+kl, vp+vl
	}
	if kp != uint64(len(keys)) || vp != uint64(len(values)) {
		return nil, false
	}
	d.Count, d.Bytes = uint64(n), kp+vp
	b := lmdb.Batch{Keys: keys, Values: values, KeyLengths: c.KeyLengths, ValueLengths: c.ValueLengths}
	loading, err := s.store.stage(ctx, name, b, d)
	if err != nil {
		slog.Warn("put: forwarded to the reference DAL", "namespace", name, "error", err.Error())
		return nil, false
	}
	if !loading {
		return nil, false
	}
	s.stats.written(name, d.Count, d.Bytes)
	s.metrics.written(name, d.Count, d.Bytes)
	return &kvpb.PutBatchResponse{Records: d.Count, Bytes: d.Bytes}, true
}

// columnar lays records out as a columnar batch.
func columnar(records []*kvpb.KeyValue) *kvpb.ColumnarRecords {
	c := &kvpb.ColumnarRecords{KeyLengths: make([]uint32, len(records)), ValueLengths: make([]uint32, len(records))}
	size := [2]int{}
	for _, r := range records {
		size[0] += len(r.Key)
		size[1] += len(r.Value)
	}
	c.Keys, c.Values = make([]byte, 0, size[0]), make([]byte, 0, size[1])
	for i, r := range records {
		c.Keys = append(c.Keys, r.Key...)
		c.Values = append(c.Values, r.Value...)
		c.KeyLengths[i], c.ValueLengths[i] = uint32(len(r.Key)), uint32(len(r.Value))
	}
	return c
}

// put stores req on the fast path or forwards it; native says which.
func (s *dataServer) put(ctx context.Context, req *kvpb.PutBatchRequest, setTrailer func(metadata.MD)) (resp *kvpb.PutBatchResponse, native bool, err error) {
	if resp, ok := s.putNative(ctx, req); ok {
		s.stats.served("PutBatch", true)
		return resp, true, nil
	}
	s.stats.served("PutBatch", false)
	resp, err = forward(ctx, setTrailer, s.backend.PutBatch, req)
	return resp, false, err
}

func (s *dataServer) PutBatch(ctx context.Context, req *kvpb.PutBatchRequest) (*kvpb.PutBatchResponse, error) {
	defer releaseRequest(req)
	started := time.Now()
	resp, native, err := s.put(ctx, req, unaryTrailer(ctx))
	if native {
		s.metrics.request("PutBatch", "OK", started)
	}
	return resp, err
}

// PutStream is served here, each message on the fast path or forwarded as a PutBatch (which
// the reference DAL then counts); the stream itself is counted here.
func (s *dataServer) PutStream(stream kvpb.KvData_PutStreamServer) (err error) {
	started := time.Now()
	defer func() { s.metrics.request("PutStream", codeName(status.Code(err)), started) }()
	total := &kvpb.PutStreamResponse{}
	ctx := stream.Context()
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			return stream.SendAndClose(total)
		}
		if err != nil {
			return err // the client went away: what was stored stays, nothing is sealed
		}
		resp, _, err := s.put(ctx, req, stream.SetTrailer)
		releaseRequest(req)
		if err != nil {
			return err
		}
		total.Batches++
		total.Records += resp.GetRecords()
		total.Bytes += resp.GetBytes()
	}
}

func (m *lmdbStore) stage(_ context.Context, name string, b lmdb.Batch, d lmdb.Digest) (bool, error) {
	return m.env.StageBatch(m.meta.stage, m.meta.states, m.meta.digests, name, b, d)
}

// Ingest merges a LOADING namespace's staged runs into its data on the fast path; any other
// case (a bad name, a namespace that is SEALING or not LOADING, an error, an engine that
// writes in place) goes to the reference DAL, which ingests or answers with the canonical error.
func (s *dataServer) Ingest(ctx context.Context, req *kvpb.IngestRequest) (*kvpb.IngestResponse, error) {
	started := time.Now()
	name := req.GetNamespace()
	if namespaceRE.MatchString(name) {
		if runs, records, ok := s.store.ingest(name); ok {
			s.stats.served("Ingest", true)
			s.metrics.request("Ingest", "OK", started)
			return &kvpb.IngestResponse{Runs: runs, Records: records}, nil
		}
	}
	s.stats.served("Ingest", false)
	return forward(ctx, unaryTrailer(ctx), s.backend.Ingest, req)
}

func (m *lmdbStore) ingest(name string) (runs, records uint64, ok bool) {
	dbi, layers, ok := m.writeDBIs(name)
	if !ok {
		return 0, 0, false
	}
	m.filterBelow(layers, filterMinKeys) // an ingest's runs: as many keys as were put
	loading, runs, records, err := m.env.Ingest(dbi, m.meta.stage, m.meta.states, m.meta.digests, name, layers)
	if err != nil {
		slog.Warn("ingest: forwarded to the reference DAL", "namespace", name, "error", err.Error())
	}
	return runs, records, err == nil && loading
}

// writeDBIs are the handles a write to a LOADING namespace takes: its data, and for a
// layered one its tombstones and the layers below it (the zero Layers without a base); ok
// is false when the reference DAL must answer.
func (m *lmdbStore) writeDBIs(name string) (lmdb.DBI, lmdb.Layers, bool) {
	chain, known := m.chainOf(name)
	if !known {
		return 0, lmdb.Layers{}, false
	}
	data, tombs, ok := m.layerDBIs(chain)
	if !ok {
		return 0, lmdb.Layers{}, false
	}
	if len(chain) == 1 {
		return data[0], lmdb.Layers{}, true
	}
	return data[0], lmdb.Layers{Tombs: tombs[0], Data: data[1:], Below: tombs[1:], Names: chain[1:], Filters: m.meta.filters}, true
}

// filterBelow is filter for the layers below a LOADING namespace, the bottom included.
func (m *lmdbStore) filterBelow(l lmdb.Layers, keys int) {
	if len(l.Names) > 0 {
		m.filter(l.Names, l.Data, l.Below, keys, true)
	}
}

// filter makes sure the layers of chain but the bottom (and the bottom too with bottom)
// have their key filters, for a request of keys keys (see filterMinKeys); a layer it
// cannot build one for is searched whole, as without filters.
func (m *lmdbStore) filter(chain []string, data, tombs []lmdb.DBI, keys int, bottom bool) {
	if m.meta.filters == 0 || keys < filterMinKeys {
		return
	}
	layers := len(chain) - 1
	if bottom {
		layers = len(chain)
	}
	for i := 0; i < layers; i++ {
		if _, skip := m.unfiltered.Load(chain[i]); skip {
			continue
		}
		txn, err := m.env.BeginRead()
		if err != nil {
			return
		}
		has, err := txn.HasFilter(m.meta.filters, chain[i])
		txn.Abort()
		if err != nil || has {
			continue
		}
		var tomb lmdb.DBI // the bottom has no tombstones
		if i < len(tombs) {
			tomb = tombs[i]
		}
		built, err := m.env.BuildFilter(m.meta.filters, m.meta.states, chain[i], data[i], tomb, filterMaxEntries)
		if err != nil {
			slog.Warn("key filter not built", "layer", chain[i], "error", err.Error())
		} else if built == lmdb.FilterTooLarge {
			m.unfiltered.Store(chain[i], true)
		}
	}
}

// delete deletes keys from a LOADING namespace on the fast path (see lmdb.Env.Delete).
func (m *lmdbStore) delete(name string, keys [][]byte) (uint64, bool) {
	data, layers, ok := m.writeDBIs(name)
	if !ok {
		return 0, false
	}
	if len(layers.Names) > 0 { // the upper layers' filters: a delete does not consult the bottom's
		m.filter(layers.Names, layers.Data, layers.Below, len(keys), false)
	}
	sorted := keys // a delta's deletes come in byte order, each key once (bulldozer.load.delta)
	if !ascending(keys) {
		sorted = slices.Clone(keys)
		slices.SortFunc(sorted, bytes.Compare)
		sorted = slices.CompactFunc(sorted, bytes.Equal)
	}
	size := 0
	for _, k := range sorted {
		size += len(k)
	}
	blob := make([]byte, 0, size)
	lengths := make([]uint32, len(sorted))
	for i, k := range sorted {
		blob = append(blob, k...)
		lengths[i] = uint32(len(k))
	}
	hashers := func() func(key, value []byte) uint64 { return newPairHasher().hash }
	deleted, ok, err := m.env.Delete(data, m.meta.stage, m.meta.states, m.meta.digests, name, layers, blob, lengths, hashers)
	if err != nil {
		slog.Warn("delete: forwarded to the reference DAL", "namespace", name, "error", err.Error())
	}
	return deleted, ok && err == nil
}

// ascending is whether keys are in byte order, each once: a delete's keys are then taken as
// they come, neither copied nor sorted again (a warm delta's 70 k keys: 2–12 ms of the call).
func ascending(keys [][]byte) bool {
	for i := 1; i < len(keys); i++ {
		if bytes.Compare(keys[i-1], keys[i]) >= 0 {
			return false
		}
	}
	return true
}

// -- reads ----------------------------------------------------------------------------------

// parseTarget splits a read's target (bulldozer.kv.server.rules.KvDal.resolve): a namespace,
// an alias, or alias@namespace (pinned); ok is false when a name is malformed.
func parseTarget(target *kvpb.Target) (namespace, alias, pinned string, ok bool) {
	if ns := target.GetNamespace(); ns != "" {
		return ns, "", "", namespaceRE.MatchString(ns)
	}
	alias, pinned, isPinned := strings.Cut(target.GetAlias(), "@")
	if !aliasRE.MatchString(alias) || (isPinned && !namespaceRE.MatchString(pinned)) {
		return "", "", "", false
	}
	return "", alias, pinned, true
}

// resolve is the namespace a read addresses; ok is false when the reference DAL must answer
// (an error, or a version of another schema generation than the read names).
func (m *lmdbStore) resolve(txn *lmdb.Txn, target *kvpb.Target) (string, bool) {
	name, ok := m.resolveName(txn, target)
	if !ok || target.GetSchemaGeneration() == 0 {
		return name, ok
	}
	raw, found, err := txn.Get(m.meta.namespaces, []byte(name))
	var record struct {
		SchemaGeneration uint32 `json:"schema_generation"`
	}
	if err != nil || !found || json.Unmarshal(raw, &record) != nil {
		return "", false
	}
	if record.SchemaGeneration == 0 {
		record.SchemaGeneration = 1 // a version stored before generations were recorded
	}
	return name, record.SchemaGeneration == target.GetSchemaGeneration()
}

func (m *lmdbStore) resolveName(txn *lmdb.Txn, target *kvpb.Target) (string, bool) {
	ns, alias, pinned, ok := parseTarget(target)
	if !ok || ns != "" {
		return ns, ok
	}
	if pinned != "" {
		raw, found, err := txn.Get(m.meta.namespaces, []byte(pinned))
		var record struct{ Alias string }
		if err != nil || !found || json.Unmarshal(raw, &record) != nil || record.Alias != alias {
			return "", false
		}
		return pinned, true
	}
	raw, found, err := txn.Get(m.meta.aliases, []byte(alias))
	var record struct{ Namespace string }
	if err != nil || !found || json.Unmarshal(raw, &record) != nil || record.Namespace == "" {
		return "", false
	}
	return record.Namespace, true
}

// getNative reads keys from the version target addresses; ok is false when the reference
// DAL must handle the request. Like the reference DAL, it resolves the alias in one read
// transaction and reads in another (which checks the version is still readable): a
// request sees one version, whatever flips in between.
func (s *dataServer) getNative(ctx context.Context, target *kvpb.Target, keys [][]byte) (name string, values [][]byte, ok bool) {
	if target == nil || len(keys) > s.limits.MaxBatchGetKeys {
		return "", nil, false
	}
	for _, k := range keys {
		if len(k) == 0 || len(k) > s.limits.MaxKeyBytes {
			return "", nil, false
		}
	}
	return s.store.getMany(ctx, target, keys)
}

// target is the version a read addresses, its chain and the chain's database handles,
// opened before the transaction that uses them; ok is false when the reference DAL must
// answer.
func (m *lmdbStore) target(target *kvpb.Target) (name string, chain []string, data, tombs []lmdb.DBI, ok bool) {
	txn, err := m.env.BeginRead()
	if err != nil {
		return "", nil, nil, nil, false
	}
	name, ok = m.resolve(txn, target)
	if ok {
		chain, ok = m.chain(txn, name)
	}
	txn.Abort()
	if ok {
		data, tombs, ok = m.layerDBIs(chain)
	}
	return name, chain, data, tombs, ok
}

func (m *lmdbStore) getMany(_ context.Context, target *kvpb.Target, keys [][]byte) (name string, values [][]byte, ok bool) {
	name, chain, data, tombs, ok := m.target(target)
	if !ok {
		return "", nil, false
	}
	m.filter(chain, data, tombs, len(keys), false)
	txn, err := m.env.BeginRead()
	if err != nil {
		return "", nil, false
	}
	defer txn.Abort()
	state, found, err := txn.Get(m.meta.states, []byte(name))
	if err != nil || !found || !readable[string(state)] {
		return "", nil, false
	}
	values = make([][]byte, len(keys))
	pending := make([]int, len(keys))
	for i := range pending {
		pending[i] = i
	}
	settled := make([]bool, len(keys)) // found, or deleted by a newer layer
	for i := range chain {
		look := pending // the keys this layer may hold: all, or those its filter lets through
		if m.meta.filters != 0 && (i < len(tombs) || len(pending) >= filterMinKeys) {
			blob, lengths := gather(keys, pending)
			mask, filtered, err := txn.FilterMask(m.meta.filters, chain[i], blob, lengths)
			if err != nil {
				return "", nil, false
			}
			if filtered {
				look = pending[:0:0]
				for j, k := range pending {
					if mask[j] != 0 {
						look = append(look, k)
					}
				}
			}
		}
		got, err := getSome(txn, data[i], keys, look)
		if err != nil {
			return "", nil, false
		}
		missed := look[:0:0]
		for j, k := range look {
			if got[j] != nil {
				values[k], settled[k] = got[j], true
			} else {
				missed = append(missed, k)
			}
		}
		if i == len(tombs) {
			break
		}
		// a key this layer deleted is absent, whatever an older layer holds
		dead, err := getSome(txn, tombs[i], keys, missed)
		if err != nil {
			return "", nil, false
		}
		for j, k := range missed {
			if dead[j] != nil {
				settled[k] = true
			}
		}
		next := pending[:0:0]
		for _, k := range pending {
			if !settled[k] {
				next = append(next, k)
			}
		}
		if pending = next; len(pending) == 0 {
			break
		}
	}
	return name, values, true
}

// layerDBIs are the handles of a chain (newest first): every layer's data, and the
// tombstones of every layer but the last (bulldozer.kv.backends.embedded); ok is false when
// one cannot be opened.
func (m *lmdbStore) layerDBIs(chain []string) (data, tombs []lmdb.DBI, ok bool) {
	data, tombs = make([]lmdb.DBI, len(chain)), make([]lmdb.DBI, len(chain)-1)
	var err error
	for i, layer := range chain {
		if data[i], err = m.env.DBI(shared.StoreDataPrefix + layer); err != nil {
			return nil, nil, false
		}
		if i < len(tombs) {
			if tombs[i], err = m.env.DBI(shared.StoreTombstonePrefix + layer); err != nil {
				return nil, nil, false
			}
		}
	}
	return data, tombs, true
}

// getSome looks up keys[i] for each i in which, in one call.
func getSome(txn *lmdb.Txn, dbi lmdb.DBI, keys [][]byte, which []int) ([][]byte, error) {
	blob, lengths := gather(keys, which)
	return txn.GetMany(dbi, blob, lengths)
}

// gather lays keys[i] for each i in which end to end; and their lengths.
func gather(keys [][]byte, which []int) ([]byte, []uint32) {
	size := 0
	for _, i := range which {
		size += len(keys[i])
	}
	blob := make([]byte, 0, size)
	lengths := make([]uint32, len(which))
	for j, i := range which {
		blob = append(blob, keys[i]...)
		lengths[j] = uint32(len(keys[i]))
	}
	return blob, lengths
}

// chain is the namespace and the bases it reads through to, newest first; ok is false when
// it is deeper than the DAL makes (the reference DAL answers).
func (m *lmdbStore) chain(txn *lmdb.Txn, name string) ([]string, bool) {
	chain := []string{name}
	for len(chain) <= shared.StoreMaxLayers+1 {
		base, found, err := txn.Get(m.meta.layers, []byte(chain[len(chain)-1]))
		if err != nil {
			return nil, false
		}
		if !found {
			return chain, true
		}
		chain = append(chain, string(base))
	}
	return nil, false
}

// chainOf is chain in a read transaction of its own.
func (m *lmdbStore) chainOf(name string) ([]string, bool) {
	txn, err := m.env.BeginRead()
	if err != nil {
		return nil, false
	}
	defer txn.Abort()
	return m.chain(txn, name)
}

func (s *dataServer) Get(ctx context.Context, req *kvpb.GetRequest) (*kvpb.GetResponse, error) {
	started := time.Now()
	if name, values, ok := s.getNative(ctx, req.GetTarget(), [][]byte{req.GetKey()}); ok {
		s.stats.served("Get", true)
		s.metrics.request("Get", "OK", started)
		return &kvpb.GetResponse{Found: values[0] != nil, Value: values[0], Namespace: name}, nil
	}
	s.stats.served("Get", false)
	return forward(ctx, unaryTrailer(ctx), s.backend.Get, req)
}

func (s *dataServer) BatchGet(ctx context.Context, req *kvpb.BatchGetRequest) (*kvpb.BatchGetResponse, error) {
	started := time.Now()
	if name, values, ok := s.getNative(ctx, req.GetTarget(), req.GetKeys()); ok {
		s.stats.served("BatchGet", true)
		s.metrics.request("BatchGet", "OK", started)
		items := make([]*kvpb.BatchGetResponse_Item, len(values))
		for i, v := range values {
			items[i] = &kvpb.BatchGetResponse_Item{Found: v != nil, Value: v}
		}
		return &kvpb.BatchGetResponse{Namespace: name, Items: items}, nil
	}
	s.stats.served("BatchGet", false)
	return forward(ctx, unaryTrailer(ctx), s.backend.BatchGet, req)
}

// Sample reads the whole version once, on the fast path where the store can (a compiled
// walk through the layers: 1.6 s on a flat 10 M-row version, where the reference DAL took
// 17 s); a bad count, or any other case, goes to the reference DAL.
func (s *dataServer) Sample(ctx context.Context, req *kvpb.SampleRequest) (*kvpb.SampleResponse, error) {
	started := time.Now()
	if count := int(req.GetCount()); req.GetTarget() != nil && count >= 1 && count <= s.limits.MaxBatchGetKeys {
		if name, pairs, scanned, ok := s.store.sample(ctx, req.GetTarget(), count, req.GetSeed()); ok {
			s.stats.served("Sample", true)
			s.metrics.request("Sample", "OK", started)
			records := make([]*kvpb.KeyValue, len(pairs))
			for i, p := range pairs {
				records[i] = &kvpb.KeyValue{Key: p.key, Value: p.value}
			}
			return &kvpb.SampleResponse{Namespace: name, Records: records, Scanned: scanned}, nil
		}
	}
	s.stats.served("Sample", false)
	return forward(ctx, unaryTrailer(ctx), s.backend.Sample, req)
}

// Delete deletes a LOADING namespace's keys on the fast path (a delta version's deletes);
// any other case (a bad name or key, a namespace not LOADING or with staged runs, an error,
// an engine without it) goes to the reference DAL.
func (s *dataServer) Delete(ctx context.Context, req *kvpb.DeleteRequest) (*kvpb.DeleteResponse, error) {
	started := time.Now()
	if deleted, ok := s.deleteNative(req); ok {
		s.stats.served("Delete", true)
		s.metrics.request("Delete", "OK", started)
		return &kvpb.DeleteResponse{Deleted: deleted}, nil
	}
	s.stats.served("Delete", false)
	return forward(ctx, unaryTrailer(ctx), s.backend.Delete, req)
}

func (s *dataServer) deleteNative(req *kvpb.DeleteRequest) (uint64, bool) {
	name, keys := req.GetNamespace(), req.GetKeys()
	if !namespaceRE.MatchString(name) || len(keys) > s.limits.MaxBatchGetKeys {
		return 0, false
	}
	for _, k := range keys {
		if len(k) == 0 || len(k) > s.limits.MaxKeyBytes {
			return 0, false
		}
	}
	return s.store.delete(name, keys)
}
