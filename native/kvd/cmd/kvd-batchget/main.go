// kvd-batchget measures batch gets through a KV DAL from a Go client (bench/kv.py runs it
// beside the Python client, to tell the server's cost from the client's).
//
//	kvd-batchget -target 127.0.0.1:7110 -alias dal -keys keys.bin -key-size 16 -batch 100
//
// keys.bin holds fixed-size keys end to end; each request asks for the next -batch of them.
// Prints one JSON object: one call at a time (rate, p50, p99) and -in-flight calls at once
// (rate), every key checked found.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"bulldozer/kvd/internal/kvpb"
)

func main() {
	target := flag.String("target", "127.0.0.1:7110", "the DAL")
	alias := flag.String("alias", "", "alias to read")
	keysPath := flag.String("keys", "", "file of fixed-size keys end to end")
	keySize := flag.Int("key-size", 16, "bytes per key")
	batch := flag.Int("batch", 100, "keys per batch get")
	inFlight := flag.Int("in-flight", 8, "calls at once for the concurrent measure")
	flag.Parse()
	if err := run(*target, *alias, *keysPath, *keySize, *batch, *inFlight); err != nil {
		fmt.Fprintln(os.Stderr, "kvd-batchget:", err)
		os.Exit(1)
	}
}

func run(target, alias, keysPath string, keySize, batch, inFlight int) error {
	raw, err := os.ReadFile(keysPath)
	if err != nil {
		return err
	}
	var requests []*kvpb.BatchGetRequest
	for start := 0; start+keySize*batch <= len(raw); start += keySize * batch {
		keys := make([][]byte, batch)
		for i := range keys {
			keys[i] = raw[start+i*keySize : start+(i+1)*keySize]
		}
		requests = append(requests, &kvpb.BatchGetRequest{Target: &kvpb.Target{Target: &kvpb.Target_Alias{Alias: alias}}, Keys: keys})
	}
	if len(requests) == 0 {
		return fmt.Errorf("no full batch of keys in %s", keysPath)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := kvpb.NewKvDataClient(conn)
	call := func(req *kvpb.BatchGetRequest) error {
		resp, err := client.BatchGet(context.Background(), req)
		if err != nil {
			return err
		}
		for _, item := range resp.Items {
			if !item.Found {
				return fmt.Errorf("a key was not found in %s", resp.Namespace)
			}
		}
		return nil
	}
	for _, req := range requests[:min(100, len(requests))] { // warm the connection
		if err := call(req); err != nil {
			return err
		}
	}
	latencies := make([]time.Duration, len(requests))
	started := time.Now()
	for i, req := range requests {
		t := time.Now()
		if err := call(req); err != nil {
			return err
		}
		latencies[i] = time.Since(t)
	}
	sequential := float64(len(requests)) / time.Since(started).Seconds()
	sort.Slice(latencies, func(a, b int) bool { return latencies[a] < latencies[b] })

	var wg sync.WaitGroup
	errs := make(chan error, inFlight)
	next := make(chan *kvpb.BatchGetRequest)
	started = time.Now()
	for w := 0; w < inFlight; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for req := range next {
				if err := call(req); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for _, req := range requests {
		next <- req
	}
	close(next)
	wg.Wait()
	concurrent := float64(len(requests)) / time.Since(started).Seconds()
	select {
	case err := <-errs:
		return err
	default:
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"calls":           len(requests),
		"rate":            sequential,
		"p50_ms":          ms(latencies[len(latencies)/2]),
		"p99_ms":          ms(latencies[len(latencies)*99/100]),
		"in_flight":       inFlight,
		"rate_concurrent": concurrent,
	})
}
