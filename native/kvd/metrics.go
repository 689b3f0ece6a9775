package main

// Prometheus metrics of the calls this process serves itself, with the names, labels and
// buckets of the Python DAL's (proto/bulldozer/kv/v1/shared.yaml, section metrics). A call
// this process forwards is counted by the Python DAL, which serves it; the Python DAL's
// /metrics adds these to its own (bulldozer.kv.server.metrics), so one scrape shows every
// call whichever plane served it.

import (
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"

	"bulldozer/kvd/internal/shared"
)

type metrics struct {
	registry       *prometheus.Registry
	requests       *prometheus.CounterVec
	latency        *prometheus.HistogramVec
	records, bytes *prometheus.CounterVec
}

func newMetrics() *metrics {
	buckets := make([]float64, len(shared.MetricsRequestSecondsBuckets))
	for i, b := range shared.MetricsRequestSecondsBuckets {
		v, err := strconv.ParseFloat(b, 64)
		if err != nil {
			panic("shared.yaml: a bucket that is not a number: " + b)
		}
		buckets[i] = v
	}
	m := &metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: shared.MetricsRequests + "_total", Help: "Requests by method and status code.",
		}, []string{"method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: shared.MetricsRequestSeconds, Help: "Request latency by method.", Buckets: buckets,
		}, []string{"method"}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: shared.MetricsRecordsWritten + "_total", Help: "Records written by namespace.",
		}, []string{"namespace"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: shared.MetricsBytesWritten + "_total", Help: "Key + value bytes written by namespace.",
		}, []string{"namespace"}),
	}
	m.registry.MustRegister(m.requests, m.latency, m.records, m.bytes)
	return m
}

// codeName is a status code's name as gRPC's specification (and the Python DAL's metrics)
// spell it: RESOURCE_EXHAUSTED, CANCELLED; Go's String() says ResourceExhausted, Canceled.
func codeName(c codes.Code) string {
	if c == codes.Canceled {
		return "CANCELLED"
	}
	var b strings.Builder
	previous := ' '
	for _, r := range c.String() {
		if unicode.IsUpper(r) && unicode.IsLower(previous) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
		previous = r
	}
	return b.String()
}

// request counts one call this process answered, with its status code's name.
func (m *metrics) request(method, code string, started time.Time) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(method, code).Inc()
	m.latency.WithLabelValues(method).Observe(time.Since(started).Seconds())
}

func (m *metrics) written(namespace string, records, bytes uint64) {
	if m == nil {
		return
	}
	m.records.WithLabelValues(namespace).Add(float64(records))
	m.bytes.WithLabelValues(namespace).Add(float64(bytes))
}

// serve answers GET /metrics on listen (unix:PATH or HOST:PORT) until the process ends.
func (m *metrics) serve(listen string) error {
	lis, err := listenOn(listen)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := server.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Warn("metrics: stopped serving", "error", err.Error())
		}
	}()
	return nil
}
