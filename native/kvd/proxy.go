package main

// Every call this process does not serve itself (namespaces, aliases, health checking,
// reflection) is relayed as opaque frames to the reference DAL: headers, messages in both
// directions, trailers and the final status pass through unchanged, so a client cannot
// tell the relay from the DAL.

import (
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type relay struct{ conn *grpc.ClientConn }

var relayDesc = &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}

func (r *relay) handle(_ any, in grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(in)
	if !ok {
		return status.Error(codes.Internal, "no method on the stream")
	}
	out, err := r.conn.NewStream(forwarded(in.Context()), relayDesc, method, grpc.ForceCodecV2(codec{}))
	if err != nil {
		return err
	}
	go func() { // caller -> DAL
		for {
			f := &frame{}
			if err := in.RecvMsg(f); err != nil {
				_ = out.CloseSend() // end of input, or the caller went away (its context cancels the call)
				return
			}
			if err := out.SendMsg(f); err != nil {
				return // the DAL ended the call: its status arrives below
			}
		}
	}()
	headerSent := false
	for { // DAL -> caller
		f := &frame{}
		err := out.RecvMsg(f)
		if !headerSent {
			if md, e := out.Header(); e == nil && len(md) > 0 {
				if err == nil {
					_ = in.SendHeader(md)
				} else {
					_ = in.SetHeader(md)
				}
			}
			headerSent = true
		}
		if err != nil {
			in.SetTrailer(out.Trailer())
			if err == io.EOF {
				return nil
			}
			return err
		}
		if err := in.SendMsg(f); err != nil {
			return err
		}
	}
}
