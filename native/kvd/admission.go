package main

// Admission of writes: at most a DAL's --max-writes-in-flight PutBatch and PutStream calls at
// once. gRPC reads a unary call's whole message before any handler or interceptor runs, so
// every batch a DAL was sent sat in its memory until its turn at the store: 32 concurrent
// 32 MiB batches took this process to 822 MiB, and more would have taken it, and the reads
// it serves, down. The check runs as the call's headers arrive (gRPC's InTapHandle), before
// its message is read: one more write is refused as busy (RESOURCE_EXHAUSTED, an ErrorInfo
// naming DalBusyError) and the client's batch writer sends it again after a pause.

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"bulldozer/kvd/internal/shared"
)

// writeMethods are the calls admission counts (shared.yaml: limits.write_methods).
var writeMethods = func() map[string]bool {
	methods := map[string]bool{}
	for _, m := range shared.LimitsWriteMethods {
		methods[m] = true
	}
	return methods
}()

type admission struct {
	limit    int64
	inFlight atomic.Int64
	// onRefused, when set, counts a refusal of a call to method (the metrics)
	onRefused func(method string)
}

func newAdmission(limit int) *admission {
	return &admission{limit: int64(limit)}
}

// tap admits a write while fewer than limit are in flight; its slot is freed when the call's
// context ends, which gRPC cancels once the call is over, however it ends.
func (a *admission) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if !writeMethods[info.FullMethodName] {
		return ctx, nil
	}
	if a.inFlight.Add(1) > a.limit {
		a.inFlight.Add(-1)
		if a.onRefused != nil {
			a.onRefused(info.FullMethodName[strings.LastIndex(info.FullMethodName, "/")+1:])
		}
		return nil, busyStatus(a.limit).Err()
	}
	context.AfterFunc(ctx, func() { a.inFlight.Add(-1) })
	return ctx, nil
}

// busyStatus is the refusal of a write past the limit, named as the Python DAL names it.
func busyStatus(limit int64) *status.Status {
	st := status.New(codes.ResourceExhausted, fmt.Sprintf(shared.ErrorsBusyMessage, limit))
	if detailed, err := st.WithDetails(&errdetails.ErrorInfo{Domain: shared.ErrorsDomain, Reason: shared.ErrorsBusy}); err == nil {
		return detailed
	}
	return st
}
