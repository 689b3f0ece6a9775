// Package redisstore is the Go data plane's write and read path for the Redis engine
// (bulldozer/kv/backends/redis.py is the reference): batch puts and batch gets go from
// bulldozer-kvd to Redis directly, pipelined, without the Python DAL in between.
//
// It keeps the engine's rules, read from their one written source
// (proto/bulldozer/kv/v1/shared.yaml, generated into package shared): the key layout, the
// write fence (a batch enters the namespace's fence in the same Lua script that checks it is
// LOADING, and leaves it once stored, so a seal or a drop waits for it) and the running
// digest (each stored batch appends its count, sum, bytes and whether every key was new).
// Anything else (creating, sealing, flipping, scans) stays with the Python DAL.
package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zeebo/xxh3"

	"bulldozer/kvd/internal/shared"
)

// Config is the engine's configuration as the Python DAL has it (RedisConfig in
// bulldozer/kv/backends/config.py), passed on bulldozer-kvd's standard input so the URL's
// password is neither in its arguments nor in its environment.
type Config struct {
	URL               string  `json:"url"`
	Cluster           bool    `json:"cluster"`
	Prefix            string  `json:"prefix"`
	TimeoutSeconds    float64 `json:"timeout_seconds"`
	MaxConnections    int     `json:"max_connections"`
	WriteLeaseSeconds float64 `json:"write_lease_seconds"`
}

// Store writes and reads one prefix's namespaces.
type Store struct {
	c          redis.UniversalClient
	prefix     string
	buckets    uint64
	leaseMs    int64
	namespaces string
	aliases    string
	enter      *redis.Script
	readable   map[string]bool
	unreleased unreleased
}

// unreleased holds write-fence leases whose release failed (Redis was unreachable). They
// are released again in the background until Redis answers or the lease has expired, so a
// seal after an outage waits for the writers that are really inside the fence, not for the
// leases of batches that failed (as the Python engine's PendingReleases does).
type unreleased struct {
	mu      sync.Mutex
	leases  map[[2]string]time.Time // (fence key, lease) -> when it expires anyway
	running bool
}

func (s *Store) releaseLater(inflight, lease string) {
	u := &s.unreleased
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.leases == nil {
		u.leases = map[[2]string]time.Time{}
	}
	u.leases[[2]string{inflight, lease}] = time.Now().Add(time.Duration(s.leaseMs) * time.Millisecond)
	if !u.running {
		u.running = true
		go s.releaseLoop()
	}
}

func (s *Store) releaseLoop() {
	u := &s.unreleased
	for {
		time.Sleep(200 * time.Millisecond)
		u.mu.Lock()
		pending := make([][2]string, 0, len(u.leases))
		for k, expires := range u.leases {
			if time.Now().After(expires) {
				delete(u.leases, k)
			} else {
				pending = append(pending, k)
			}
		}
		if len(pending) == 0 {
			u.running = false
			u.mu.Unlock()
			return
		}
		u.mu.Unlock()
		for _, k := range pending {
			if s.c.ZRem(context.Background(), k[0], k[1]).Err() == nil {
				u.mu.Lock()
				delete(u.leases, k)
				u.mu.Unlock()
			}
		}
	}
}

// Open connects and reads the prefix's marker (the Python DAL claims the prefix before
// this process starts; the marker holds the bucket count).
func Open(ctx context.Context, cfg Config) (*Store, error) {
	timeout := time.Duration(cfg.TimeoutSeconds * float64(time.Second))
	var c redis.UniversalClient
	if cfg.Cluster {
		opts, err := redis.ParseClusterURL(cfg.URL)
		if err != nil {
			return nil, fmt.Errorf("Redis URL: %w", err)
		}
		opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = timeout, timeout, timeout
		opts.MaxRetries, opts.DisableIdentity = -1, true
		c = redis.NewClusterClient(opts)
	} else {
		opts, err := redis.ParseURL(cfg.URL)
		if err != nil {
			return nil, fmt.Errorf("Redis URL: %w", err)
		}
		opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = timeout, timeout, timeout
		// no silent resend (as the Python engine): a command resent on a new connection can
		// run twice, which would bring a released write-fence lease back
		opts.MaxRetries, opts.DisableIdentity = -1, true
		if cfg.MaxConnections > 0 {
			opts.PoolSize = cfg.MaxConnections
		}
		c = redis.NewClient(opts)
	}
	s := &Store{
		c:          c,
		prefix:     cfg.Prefix,
		leaseMs:    int64(cfg.WriteLeaseSeconds * 1000),
		namespaces: fmt.Sprintf(shared.RedisNamespacesKey, cfg.Prefix),
		aliases:    fmt.Sprintf(shared.RedisAliasesKey, cfg.Prefix),
		enter:      redis.NewScript(shared.RedisEnterScript),
		readable:   map[string]bool{},
	}
	for _, state := range shared.StatesReadable {
		s.readable[state] = true
	}
	raw, err := c.Get(ctx, fmt.Sprintf(shared.RedisMarkerKey, cfg.Prefix)).Bytes()
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("cannot read the prefix's marker from Redis: %w", err)
	}
	var marker struct{ Format, Buckets uint64 }
	if err := json.Unmarshal(raw, &marker); err != nil || marker.Format != shared.RedisFormat || marker.Buckets == 0 {
		c.Close()
		return nil, fmt.Errorf("prefix %q holds no Bulldozer store of format %d", cfg.Prefix, shared.RedisFormat)
	}
	s.buckets = marker.Buckets
	return s, nil
}

// Close closes the connections.
func (s *Store) Close() error { return s.c.Close() }

// Buckets is the number of hashes one version is spread over.
func (s *Store) Buckets() uint64 { return s.buckets }

// Bucket is the bucket key belongs to (bulldozer.kv.backends._buckets.bucket_of).
func (s *Store) Bucket(key []byte) uint64 { return xxh3.Hash(key) % s.buckets }

func (s *Store) dataKey(name string, bucket uint64) string {
	return fmt.Sprintf(shared.RedisDataKey, s.prefix, name, bucket)
}

// Batch is a columnar batch: keys and values back to back, and their lengths.
type Batch struct {
	Keys, Values             []byte
	KeyLengths, ValueLengths []uint32
}

// Digest is a batch's (count, sum of pair hashes, bytes).
type Digest struct{ Count, Sum, Bytes uint64 }

// WriteBatch stores a well-formed batch of a LOADING namespace and appends its digest entry,
// inside the namespace's write fence. loading is false, and nothing is stored, when the
// namespace is missing or not LOADING. On an error part of the batch may be stored (as when
// the Python engine fails mid-pipeline): the caller retries the whole batch.
func (s *Store) WriteBatch(ctx context.Context, name string, b Batch, d Digest) (loading bool, err error) {
	token := make([]byte, 16)
	_, _ = rand.Read(token)
	lease := hex.EncodeToString(token)
	inflight := fmt.Sprintf(shared.RedisInflightKey, s.prefix, name)
	defer func() { // released even if entering failed: the entry may still have happened
		if rerr := s.c.ZRem(context.WithoutCancel(ctx), inflight, lease).Err(); rerr != nil {
			slog.Warn("redis: a write lease was not released; released again once Redis answers",
				"namespace", name, "error", rerr.Error())
			s.releaseLater(inflight, lease)
		}
	}()
	state, err := s.enter.Run(ctx, s.c, []string{s.namespaces, inflight}, name, lease, s.leaseMs).Text()
	if err != nil || state != shared.StatesWritable {
		return false, err
	}
	// one HSET per bucket: key, then field, value pairs (a key repeated in the batch is set
	// twice, the later value winning, and counted once). The pairs are first copied out in
	// bucket order (a counting sort on the bucket, each bucket's pairs in batch order), so the
	// arguments, and the bytes they point at, are then read front to back as they are sent
	// (layOut): taken straight from the batch, every argument was a cache miss.
	raw, starts := s.layOut(b)
	pipe := s.c.Pipeline()
	cmds := make([]*redis.Cmd, 0, s.buckets)
	for bucket := range s.buckets {
		pairs := raw[starts[bucket]:starts[bucket+1]]
		if len(pairs) == 0 {
			continue
		}
		key := s.dataKey(name, bucket)
		if len(pairs)/2 >= shared.RedisHashtablePairs { // the hash-table marker (shared.yaml)
			pipe.HSet(ctx, key, shared.RedisHashtableField, hashtableValue)
		}
		args := make([]any, 0, 2+len(pairs))
		args = append(args, "hset", key)
		for i := range pairs {
			args = append(args, &pairs[i])
		}
		cmds = append(cmds, pipe.Do(ctx, args...))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return true, err
	}
	var added int64
	for _, cmd := range cmds {
		n, err := cmd.Int64()
		if err != nil {
			return true, err
		}
		added += n
	}
	// still inside the fence, so a seal sees it; exact when every key was new
	exact := 0
	if added == int64(len(b.KeyLengths)) {
		exact = 1
	}
	entry := fmt.Sprintf(shared.RedisDigestEntry, d.Count, d.Sum, d.Bytes, exact)
	if err := s.c.RPush(ctx, fmt.Sprintf(shared.RedisDigestKey, s.prefix, name), entry).Err(); err != nil {
		return true, err
	}
	return true, nil
}

// layOut copies a batch's pairs into one buffer in bucket order (each bucket's pairs in
// batch order): its arguments (key, value, key, value, ...) as slices of that buffer, and
// where each bucket's arguments start among them (starts has Buckets()+1 entries). One pass
// reads the batch front to back and writes to as many places as there are buckets, where
// sending the pairs in bucket order straight from the batch read them at random: profiled,
// 45 % of this process's CPU went to go-redis copying arguments it had to fetch from memory.
// Side by side on the benchmark's 500 k-row feature table into Redis (the two builds
// alternating, three sessions of 12-24 runs each): this process's CPU per load 0.145-0.190
// -> 0.115-0.120 s. The run's time moved by -11 %, -3 % and +2 % (medians): Redis's own
// thread, 0.2 s of CPU per load, sets its pace; the CPU is left to the other processes.
func (s *Store) layOut(b Batch) ([]rawArg, []int) {
	n := len(b.KeyLengths)
	buckets := make([]uint32, n)
	starts := make([]int, s.buckets+1) // pairs per bucket, then where each bucket's pairs start
	at := make([]int, s.buckets+1)     // bytes per bucket, then where each bucket's bytes start
	var kp uint32
	for i, kl := range b.KeyLengths {
		bucket := s.Bucket(b.Keys[kp : kp+kl])
		kp += kl
		buckets[i] = uint32(bucket)
		starts[bucket+1]++
		at[bucket+1] += int(kl + b.ValueLengths[i])
	}
	for bucket := range s.buckets {
		starts[bucket+1] += starts[bucket]
		at[bucket+1] += at[bucket]
	}
	next := make([]int, s.buckets)
	copy(next, starts)
	data := make([]byte, len(b.Keys)+len(b.Values))
	raw := make([]rawArg, 2*n)
	var vp uint32
	kp = 0
	for i, bucket := range buckets {
		kl, vl := int(b.KeyLengths[i]), int(b.ValueLengths[i])
		o, pair := at[bucket], next[bucket]
		copy(data[o:o+kl], b.Keys[kp:])
		copy(data[o+kl:o+kl+vl], b.Values[vp:])
		raw[2*pair], raw[2*pair+1] = data[o:o+kl:o+kl], data[o+kl:o+kl+vl:o+kl+vl]
		at[bucket], next[bucket] = o+kl+vl, pair+1
		kp, vp = kp+uint32(kl), vp+uint32(vl)
	}
	for bucket := range starts {
		starts[bucket] *= 2
	}
	return raw, starts
}

// rawArg is a key or a value as a go-redis argument: a pointer to it goes into an interface
// without an allocation, where the []byte itself took one (two per record).
type rawArg []byte

// MarshalBinary is the argument's bytes (go-redis writes a BinaryMarshaler's as they are).
func (r *rawArg) MarshalBinary() ([]byte, error) { return *r, nil }

// hashtableValue is the hash-table marker's value (shared.yaml: redis.hashtable_*), longer
// than Redis keeps in a listpack: set in a bucket before a batch's many pairs, it makes Redis
// turn a new bucket into a hash table up front. The seal removes it.
var hashtableValue = strings.Repeat("x", shared.RedisHashtableValueBytes)

// ErrNotReadable says the Python DAL must answer (the target does not resolve to a
// readable namespace).
var ErrNotReadable = errors.New("not readable here")

// Resolve is the namespace a read addresses (bulldozer.kv.server.rules.KvDal.resolve):
// namespace as named, the alias's current namespace, or alias@namespace when the namespace
// belongs to the alias. ErrNotReadable when it does not resolve.
func (s *Store) Resolve(ctx context.Context, namespace, alias, pinned string) (string, error) {
	if namespace != "" {
		return namespace, nil
	}
	if pinned != "" {
		raw, err := s.c.HGet(ctx, s.namespaces, pinned).Bytes()
		var record struct{ Alias string }
		if err != nil || json.Unmarshal(raw, &record) != nil || record.Alias != alias {
			return "", notReadable(err)
		}
		return pinned, nil
	}
	raw, err := s.c.HGet(ctx, s.aliases, alias).Bytes()
	var record struct{ Namespace string }
	if err != nil || json.Unmarshal(raw, &record) != nil || record.Namespace == "" {
		return "", notReadable(err)
	}
	return record.Namespace, nil
}

// notReadable is err when Redis failed, else ErrNotReadable (a missing or unparsable record).
func notReadable(err error) error {
	if err == nil || errors.Is(err, redis.Nil) {
		return ErrNotReadable
	}
	return err
}

// GetMany reads keys from a readable namespace (nil for a missing key); ErrNotReadable
// when it is not readable.
func (s *Store) GetMany(ctx context.Context, name string, keys [][]byte) ([][]byte, error) {
	raw, err := s.c.HGet(ctx, s.namespaces, name).Bytes()
	var record struct{ State string }
	if err != nil || json.Unmarshal(raw, &record) != nil || !s.readable[record.State] {
		return nil, notReadable(err)
	}
	byBucket := map[uint64][]int{}
	for i, k := range keys {
		b := s.Bucket(k)
		byBucket[b] = append(byBucket[b], i)
	}
	pipe := s.c.Pipeline()
	type read struct {
		idx []int
		cmd *redis.Cmd
	}
	reads := make([]read, 0, len(byBucket))
	for bucket, idx := range byBucket {
		args := make([]any, 0, 2+len(idx))
		args = append(args, "hmget", s.dataKey(name, bucket))
		for _, i := range idx {
			args = append(args, keys[i])
		}
		reads = append(reads, read{idx, pipe.Do(ctx, args...)})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	out := make([][]byte, len(keys))
	for _, r := range reads {
		values, err := r.cmd.Slice()
		if err != nil || len(values) != len(r.idx) {
			return nil, fmt.Errorf("HMGET answered %d values for %d keys: %v", len(values), len(r.idx), err)
		}
		for j, v := range values {
			if v != nil {
				str, ok := v.(string)
				if !ok {
					return nil, fmt.Errorf("HMGET answered a %T", v)
				}
				out[r.idx[j]] = []byte(str)
			}
		}
	}
	return out, nil
}
