package main

import (
	"context"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"bulldozer/kvd/internal/shared"
)

func TestAdmissionRefusesAWritePastTheLimitUntilOneEnds(t *testing.T) {
	a := newAdmission(2)
	refusedMethods := []string{}
	a.onRefused = func(method string) { refusedMethods = append(refusedMethods, method) }
	put := &tap.Info{FullMethodName: "/bulldozer.kv.v1.KvData/PutBatch"}
	stream := &tap.Info{FullMethodName: "/bulldozer.kv.v1.KvData/PutStream"}
	first, endFirst := context.WithCancel(context.Background())
	second, endSecond := context.WithCancel(context.Background())
	defer endSecond()
	for _, admitted := range []struct {
		ctx  context.Context
		info *tap.Info
	}{{first, put}, {second, stream}} {
		if _, err := a.tap(admitted.ctx, admitted.info); err != nil {
			t.Fatalf("refused under the limit: %v", err)
		}
	}
	// a read is not a write: never counted
	if _, err := a.tap(context.Background(), &tap.Info{FullMethodName: "/bulldozer.kv.v1.KvData/BatchGet"}); err != nil {
		t.Fatalf("a read was refused: %v", err)
	}
	_, err := a.tap(context.Background(), put)
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("a third write: %v, want RESOURCE_EXHAUSTED", err)
	}
	reason := ""
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == shared.ErrorsDomain {
			reason = info.Reason
		}
	}
	if reason != shared.ErrorsBusy || len(refusedMethods) != 1 || refusedMethods[0] != "PutBatch" {
		t.Fatalf("reason %q, refused %v", reason, refusedMethods)
	}
	// gRPC cancels a call's context once the call is over; context.AfterFunc then frees its
	// slot in a goroutine of its own
	endFirst()
	deadline := time.Now().Add(5 * time.Second)
	for a.inFlight.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the ended call's slot was not freed")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := a.tap(context.Background(), put); err != nil {
		t.Fatalf("refused once a slot was free: %v", err)
	}
}

func TestCodeNamesAreTheSpecificationsAsThePythonDALWritesThem(t *testing.T) {
	for code, want := range map[codes.Code]string{
		codes.OK: "OK", codes.Canceled: "CANCELLED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
		codes.InvalidArgument: "INVALID_ARGUMENT", codes.Unavailable: "UNAVAILABLE",
	} {
		if got := codeName(code); got != want {
			t.Errorf("codeName(%v) = %q, want %q", code, got, want)
		}
	}
}
