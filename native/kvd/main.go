// bulldozer-kvd is the native data plane of the KV DAL (bulldozer serve --data-plane native).
//
// It listens where the DAL was asked to listen and serves batch puts, gets and batch gets
// straight from the store: the embedded (LMDB) store, or Redis (--engine redis, its
// configuration as JSON on standard input; package redisstore); on the embedded store,
// also ingests, deletes, samples and scans. Every other call, and every request that is not
// on the fast path, goes to the reference DAL (the Python server over the same store,
// listening on a private socket), so the lifecycle rules and error answers stay in one
// place. See data.go, sample.go, scan.go and proxy.go. It is started and stopped by
// `bulldozer serve`.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"

	"bulldozer/kvd/internal/kvpb"
	"bulldozer/kvd/internal/shared"
	"bulldozer/kvd/lmdb"
	"bulldozer/kvd/redisstore"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:7110", "where to listen: HOST:PORT or unix:PATH")
	backend := flag.String("backend", "", "the reference DAL's address (unix:PATH or HOST:PORT)")
	engine := flag.String("engine", "embedded", "the store: embedded (--store DIR) or redis (its configuration as JSON on standard input)")
	store := flag.String("store", "", "directory of the embedded store")
	mapSize := flag.Int64("map-size", 64<<30, "LMDB map size (as the reference DAL opened the store)")
	maxDBs := flag.Int("max-dbs", 2*8192+8, "LMDB named databases this process may open")
	writeMap := flag.Bool("writemap", false, "open the store with MDB_WRITEMAP (as the reference DAL did)")
	maxKey := flag.Int("max-key-bytes", shared.LimitsEmbeddedMaxKeyBytes, "largest key")
	maxValue := flag.Int("max-value-bytes", shared.LimitsMaxValueBytes, "largest value")
	maxBatch := flag.Int("max-batch-records", shared.LimitsMaxBatchRecords, "most records in one put batch")
	maxGet := flag.Int("max-batch-get-keys", shared.LimitsMaxBatchGetKeys, "most keys in one batch get")
	maxScanPage := flag.Int("max-scan-page", shared.LimitsMaxScanPage, "most records in one page of a scan")
	maxMsg := flag.Int("max-message-bytes", shared.LimitsMaxMessageBytes, "largest request or response")
	maxWrites := flag.Int("max-writes-in-flight", shared.LimitsMaxWritesInFlight, "most write calls (PutBatch, PutStream) taken at once; one more is refused as busy before its message is read (admission.go)")
	readyFile := flag.String("ready-file", "", "write the bound port here once listening")
	metricsListen := flag.String("metrics-listen", "", "serve Prometheus metrics of the calls served here (unix:PATH or HOST:PORT)")
	grace := flag.Duration("grace", 30*time.Second, "how long in-flight calls may finish after SIGTERM")
	parent := flag.Int("parent-pid", 0, "stop when this process is no longer the parent")
	version := flag.Bool("version", false, "print the version and exit")
	mergeInto := flag.String("merge-into", "", "merge --merge-layers into this LOADING version of the embedded --store and exit (see merge)")
	mergeLayers := flag.String("merge-layers", "", "the layers merge-into merges: names, newest first, comma-separated")
	measureName := flag.String("measure", "", "measure this version of the embedded --store through its layers, print its count, digest and bytes as JSON and exit (see measure)")
	flag.Parse()
	// its lines go to the DAL's log file, which other DALs of the day share: each names its pid
	slog.SetDefault(slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "bulldozer-kvd", "pid", os.Getpid()))
	if !limitMallocArenas() {
		slog.Warn("malloc arenas not capped at the cores (tuning.go)")
	}
	if *version {
		fmt.Printf("bulldozer-kvd (LMDB %s)\n", lmdb.Version())
		return
	}
	if *measureName != "" || *mergeInto != "" {
		// a job for the engine's DAL: it ends with that DAL (a merge's write transaction then
		// commits nothing)
		dieWithParent(*parent)
	}
	if *measureName != "" {
		count, digest, size, err := measure(*store, lmdb.Options{MapSize: *mapSize, MaxDBs: *maxDBs, MaxReaders: 512, WriteMap: *writeMap}, *measureName)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bulldozer-kvd measure:", err)
			os.Exit(1)
		}
		fmt.Printf("{\"count\": %d, \"digest\": %d, \"bytes\": %d}\n", count, digest, size)
		return
	}
	if *mergeInto != "" {
		merged, err := merge(*store, lmdb.Options{MapSize: *mapSize, MaxDBs: *maxDBs, MaxReaders: 512, WriteMap: *writeMap},
			*mergeInto, strings.Split(*mergeLayers, ","))
		if err != nil {
			fmt.Fprintln(os.Stderr, "bulldozer-kvd merge:", err)
			os.Exit(1)
		}
		fmt.Printf("{\"merged\": %d}\n", merged)
		return
	}
	if err := run(*listen, *backend, *engine, *store, lmdb.Options{MapSize: *mapSize, MaxDBs: *maxDBs, MaxReaders: 512, WriteMap: *writeMap},
		Limits{MaxKeyBytes: *maxKey, MaxValueBytes: *maxValue, MaxBatchRecords: *maxBatch, MaxBatchGetKeys: *maxGet, MaxScanPage: *maxScanPage},
		*maxMsg, *maxWrites, *readyFile, *metricsListen, *grace, *parent); err != nil {
		slog.Error("stopped", "error", err.Error())
		fmt.Fprintln(os.Stderr, "bulldozer-kvd:", err)
		os.Exit(1)
	}
}

// merge writes into the LOADING version into, made from the layer below layers, what
// layers (newest first) change over it: the embedded engine's layer merge
// (bulldozer.kv.backends.embedded: EmbeddedEngine.copy_records runs this when this data
// plane fronts it, in a process of its own, once it has made the version; see
// lmdb.Env.MergeLayers). A version that reads through to no base is flat: layers then end
// with their chain's bottom (which has no base either), and the version gets every visible
// pair and no tombstones.
func merge(dir string, opts lmdb.Options, into string, layers []string) (uint64, error) {
	if dir == "" || len(layers) == 0 || layers[0] == "" {
		return 0, fmt.Errorf("--store and --merge-layers are required")
	}
	store, err := openEmbedded(dir, opts)
	if err != nil {
		return 0, err
	}
	env, m := store.env, store.meta
	defer env.Close()
	open := func(names ...string) ([]lmdb.DBI, error) {
		handles := make([]lmdb.DBI, len(names))
		for i, name := range names {
			if handles[i], err = env.DBI(name); err != nil {
				return nil, fmt.Errorf("database %s: %w", name, err)
			}
		}
		return handles, nil
	}
	chain, ok := store.chainOf(into)
	layered := len(chain) > 1
	ownNames := []string{shared.StoreDataPrefix + into}
	if layered {
		ownNames = append(ownNames, shared.StoreTombstonePrefix+into)
	} else if below, known := store.chainOf(layers[len(layers)-1]); !ok || !known || len(below) > 1 {
		return 0, fmt.Errorf("version %s is flat, but its last layer %s is not its chain's bottom", into, layers[len(layers)-1])
	}
	own, err := open(ownNames...)
	if err != nil {
		return 0, err
	}
	var ownTomb lmdb.DBI
	if layered {
		ownTomb = own[1]
	}
	data, tombs := make([]string, len(layers)), make([]string, 0, len(layers))
	for i, layer := range layers {
		data[i] = shared.StoreDataPrefix + layer
		if layered || i < len(layers)-1 {
			tombs = append(tombs, shared.StoreTombstonePrefix+layer)
		}
	}
	dataDBIs, err := open(data...)
	if err != nil {
		return 0, err
	}
	tombDBIs, err := open(tombs...)
	if err != nil {
		return 0, err
	}
	loading, merged, err := env.MergeLayers(m.states, into, own[0], ownTomb, dataDBIs, tombDBIs)
	if err == nil && !loading {
		err = fmt.Errorf("version %s is not LOADING", into)
	}
	return merged, err
}

// dieWithParent exits at once when parent (when not 0) is not, or is no longer, this
// process's parent.
func dieWithParent(parent int) {
	if parent <= 0 {
		return
	}
	gone := func() bool { return os.Getppid() != parent }
	if gone() {
		fmt.Fprintln(os.Stderr, "bulldozer-kvd: the parent process is gone")
		os.Exit(1)
	}
	go func() {
		for !gone() {
			time.Sleep(200 * time.Millisecond)
		}
		fmt.Fprintln(os.Stderr, "bulldozer-kvd: the parent process is gone")
		os.Exit(1)
	}()
}

// measure is what the version name of the embedded store stores, read through its layers
// in one read transaction: its pairs' count, digest (digest.go) and bytes — what a seal
// records when the engine kept no exact running digest (bulldozer.kv.backends.embedded:
// EmbeddedEngine.measure runs this when this data plane fronts it).
func measure(dir string, opts lmdb.Options, name string) (count, digest, size uint64, err error) {
	store, err := openEmbedded(dir, opts)
	if err != nil {
		return 0, 0, 0, err
	}
	defer store.env.Close()
	chain, ok := store.chainOf(name)
	var data, tombs []lmdb.DBI
	if ok {
		data, tombs, ok = store.layerDBIs(chain)
	}
	if !ok {
		return 0, 0, 0, fmt.Errorf("version %s: its layers cannot be read", name)
	}
	hasher := newPairHasher()
	err = store.env.VisiblePairs(data, tombs, nil, 0, nil, func(keys, values [][]byte) error {
		for i, key := range keys {
			digest += hasher.hash(key, values[i])
			size += uint64(len(key) + len(values[i]))
		}
		count += uint64(len(keys))
		return nil
	})
	return count, digest, size, err
}

// openEmbedded opens the embedded store in dir (the caller closes its env).
func openEmbedded(dir string, opts lmdb.Options) (*lmdbStore, error) {
	if dir == "" {
		return nil, fmt.Errorf("--store is required")
	}
	env, err := lmdb.Open(dir, opts)
	if err != nil {
		return nil, err
	}
	m, err := openMeta(env)
	if err != nil {
		env.Close()
		return nil, err
	}
	return &lmdbStore{env: env, meta: m}, nil
}

// openStore opens the store the fast path serves; close releases it (and, for the embedded
// store, flushes it to disk).
func openStore(engine, dir string, opts lmdb.Options) (s store, close func() error, err error) {
	switch engine {
	case "embedded":
		m, err := openEmbedded(dir, opts)
		if err != nil {
			return nil, nil, err
		}
		return m, func() error { defer m.env.Close(); return m.env.Sync() }, nil
	case "redis":
		var cfg redisstore.Config
		if err := json.NewDecoder(os.Stdin).Decode(&cfg); err != nil {
			return nil, nil, fmt.Errorf("the Redis configuration on standard input: %w", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r, err := redisstore.Open(ctx, cfg)
		if err != nil {
			return nil, nil, err
		}
		return redisStore{r}, r.Close, nil
	}
	return nil, nil, fmt.Errorf("--engine %q: embedded or redis", engine)
}

func run(listen, backend, engine, dir string, opts lmdb.Options, limits Limits, maxMsg, maxWrites int, readyFile, metricsListen string, grace time.Duration, parent int) error {
	if maxWrites < 1 {
		return fmt.Errorf("--max-writes-in-flight must be at least 1, not %d", maxWrites)
	}
	if backend == "" {
		return fmt.Errorf("--backend is required")
	}
	st0, closeStore, err := openStore(engine, dir, opts)
	if err != nil {
		return err
	}
	closed := false
	defer func() {
		if !closed {
			_ = closeStore()
		}
	}()
	conn, err := grpc.NewClient(backend,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsg), grpc.MaxCallSendMsgSize(maxMsg)))
	if err != nil {
		return fmt.Errorf("reference DAL at %s: %w", backend, err)
	}
	defer conn.Close()

	lis, err := listenOn(listen)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %w", listen, err)
	}
	st := newStats()
	var m *metrics
	if metricsListen != "" {
		m = newMetrics()
		if err := m.serve(metricsListen); err != nil {
			return fmt.Errorf("metrics on %s: %w", metricsListen, err)
		}
	}
	r := &relay{conn: conn}
	admitted := newAdmission(maxWrites)
	if m != nil {
		admitted.onRefused = func(method string) { m.request(method, codeName(codes.ResourceExhausted), time.Now()) }
	}
	server := grpc.NewServer(
		grpc.InTapHandle(admitted.tap),
		grpc.ForceServerCodecV2(codec{}),
		experimental.BufferPool(&batchBuffers),
		grpc.UnknownServiceHandler(r.handle),
		grpc.MaxRecvMsgSize(maxMsg),
		grpc.MaxSendMsgSize(maxMsg),
	)
	kvpb.RegisterKvDataServer(server, &dataServer{store: st0, limits: limits, backend: kvpb.NewKvDataClient(conn), stats: st, metrics: m})

	port := 0
	if tcp, ok := lis.Addr().(*net.TCPAddr); ok {
		port = tcp.Port
	}
	if readyFile != "" {
		tmp := readyFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(strconv.Itoa(port)), 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Clean(readyFile)); err != nil {
			return err
		}
	}
	slog.Info("serving", "listen", listen, "port", port, "backend", backend, "engine", engine, "store", dir, "lmdb", lmdb.Version())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP) // SIGHUP: the terminal it ran in closed
	defer stop()
	if parent > 0 {
		go func() {
			for ctx.Err() == nil {
				if os.Getppid() != parent {
					slog.Info("parent process is gone: stopping", "parent", parent)
					stop()
					return
				}
				time.Sleep(500 * time.Millisecond)
			}
		}()
	}
	served := make(chan error, 1)
	go func() { served <- server.Serve(lis) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	slog.Info("stopping: finishing in-flight calls", "grace", grace.String())
	done := make(chan struct{})
	go func() { server.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		server.Stop()
	}
	st.log()
	closed = true
	if err := closeStore(); err != nil {
		return err
	}
	slog.Info("stopped")
	return nil
}

// listenOn listens on HOST:PORT, or on unix:PATH (replacing a socket file left there).
func listenOn(listen string) (net.Listener, error) {
	network, address := "tcp", listen
	if path, ok := strings.CutPrefix(listen, "unix:"); ok {
		network, address = "unix", path
		_ = os.Remove(path)
	}
	return net.Listen(network, address)
}
