package main

import (
	"bytes"
	"math/rand"
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"bulldozer/kvd/internal/kvpb"
)

// chunked is b as gRPC hands a message to a codec: in buffers of the sizes frames arrive in.
func chunked(rng *rand.Rand, b []byte) mem.BufferSlice {
	var s mem.BufferSlice
	for len(b) > 0 {
		n := min(len(b), 1+rng.Intn(40_000))
		s = append(s, mem.SliceBuffer(append([]byte(nil), b[:n]...)))
		b = b[n:]
	}
	return s
}

func randomBatch(rng *rand.Rand) *kvpb.PutBatchRequest {
	n := rng.Intn(3000)
	c := &kvpb.ColumnarRecords{KeyLengths: make([]uint32, n), ValueLengths: make([]uint32, n)}
	for i := range n {
		k, v := 1+rng.Intn(20), rng.Intn(300)
		if rng.Intn(50) == 0 {
			v = 1 << 16 // lengths of several varint bytes
		}
		key, value := make([]byte, k), make([]byte, v)
		rng.Read(key)
		rng.Read(value)
		c.Keys, c.Values = append(c.Keys, key...), append(c.Values, value...)
		c.KeyLengths[i], c.ValueLengths[i] = uint32(k), uint32(v)
	}
	return &kvpb.PutBatchRequest{Namespace: "features__v20261127000000_abcdef", Columnar: c}
}

// Every request reads as the general protobuf decoder reads it, whatever buffers it arrives
// in; the usual shape (a namespace and one columnar batch) is read into a reused buffer,
// which the call hands back when it has served the request.
func TestAPutBatchRequestDecodesAsProtobufDoesAndTheUsualShapeIntoAReusedBuffer(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	for round := range 200 {
		want := randomBatch(rng)
		usual := true
		switch round % 5 {
		case 1: // records, the row-wise form: the general decoder's
			want.Records = []*kvpb.KeyValue{{Key: []byte("k"), Value: []byte("v")}}
			usual = false
		case 2: // no namespace, or an empty batch: still the usual shape
			want.Namespace = ""
			want.Columnar = &kvpb.ColumnarRecords{}
		}
		wire, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got := &kvpb.PutBatchRequest{}
		if err := (codec{}).Unmarshal(chunked(rng, wire), got); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("round %d: decoded differently from what was sent", round)
		}
		_, pooled := putRequests.Load(got)
		if pooled != usual {
			t.Fatalf("round %d: read into a reused buffer: %v, want %v", round, pooled, usual)
		}
		releaseRequest(got)
		if _, still := putRequests.Load(got); still || (pooled && got.Columnar != nil) {
			t.Fatalf("round %d: the buffer was not handed back", round)
		}
	}
}

// Wire forms a protobuf encoder may also produce, and broken ones, read exactly as the
// general decoder reads them (or fail as it fails).
func TestUnusualPutBatchWireFormsReadAsTheGeneralDecoderReadsThem(t *testing.T) {
	tag := protowire.AppendTag
	bytesField := func(b []byte, num protowire.Number, v []byte) []byte {
		return protowire.AppendBytes(tag(b, num, protowire.BytesType), v)
	}
	columnar := bytesField(nil, 1, []byte("ab"))
	columnar = bytesField(columnar, 2, protowire.AppendVarint(nil, 2))
	columnar = bytesField(columnar, 3, []byte("xyz"))
	columnar = bytesField(columnar, 4, protowire.AppendVarint(nil, 3))
	unpacked := bytesField(nil, 1, []byte("ab"))
	unpacked = protowire.AppendVarint(tag(unpacked, 2, protowire.VarintType), 2)
	unpacked = bytesField(unpacked, 3, []byte("xyz"))
	unpacked = protowire.AppendVarint(tag(unpacked, 4, protowire.VarintType), 3)
	ns := bytesField(nil, 1, []byte("ns"))
	forms := map[string][]byte{
		"usual":                 append(append([]byte(nil), ns...), bytesField(nil, 3, columnar)...),
		"lengths not packed":    append(append([]byte(nil), ns...), bytesField(nil, 3, unpacked)...),
		"batch in two parts":    append(append(append([]byte(nil), ns...), bytesField(nil, 3, columnar[:4])...), bytesField(nil, 3, columnar[4:])...),
		"namespace twice":       append(append(append([]byte(nil), ns...), ns...), bytesField(nil, 3, columnar)...),
		"an unknown field":      append(append(append([]byte(nil), ns...), bytesField(nil, 3, columnar)...), bytesField(nil, 9, []byte("?"))...),
		"namespace not UTF-8":   bytesField(nil, 1, []byte{0xff, 0xfe}),
		"cut short":             append(append([]byte(nil), ns...), bytesField(nil, 3, columnar)[:7]...),
		"a length over 32 bits": append(append([]byte(nil), ns...), bytesField(nil, 3, bytesField(nil, 2, protowire.AppendVarint(nil, 1<<33|5)))...),
	}
	rng := rand.New(rand.NewSource(3))
	for name, wire := range forms {
		want := &kvpb.PutBatchRequest{}
		wantErr := proto.Unmarshal(wire, want)
		got := &kvpb.PutBatchRequest{}
		err := (codec{}).Unmarshal(chunked(rng, wire), got)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("%s: error %v, the general decoder's %v", name, err, wantErr)
		}
		if err == nil && !proto.Equal(got, want) {
			t.Fatalf("%s: decoded differently from the general decoder", name)
		}
		_, pooled := putRequests.Load(got)
		if pooled != (name == "usual" || name == "a length over 32 bits") {
			t.Fatalf("%s: read into a reused buffer: %v", name, pooled)
		}
		releaseRequest(got)
	}
}

// Buffers come in power-of-two classes, of the size asked for.
func TestBatchBuffersComeInClassesOfTheSizeAskedFor(t *testing.T) {
	var p bufferPool
	a := p.Get(5 << 20)
	if len(*a) != 5<<20 || cap(*a) != 8<<20 {
		t.Fatalf("got len %d cap %d", len(*a), cap(*a))
	}
	(*a)[0] = 1
	p.Put(a)
	if b := p.Get(6 << 20); len(*b) != 6<<20 || cap(*b) != 8<<20 {
		t.Fatalf("got len %d cap %d", len(*b), cap(*b))
	}
	if c := p.Get(0); len(*c) != 0 || cap(*c) != 1<<smallestClass {
		t.Fatalf("got len %d cap %d", len(*c), cap(*c))
	}
}

// A scan page whose keys and values are pool buffers is marshaled, byte for byte, as
// proto.Marshal marshals the same ScanResponse, with the buffers themselves among its
// pieces (not copied): empty pages, empty values, lengths of one, two and three varint
// bytes, with and without a next page token.
func TestAPooledScanPageIsTheScanResponseAroundItsBuffers(t *testing.T) {
	cases := []struct {
		name         string
		keys, values []string
		namespace    string
		token        string
	}{
		{"empty", nil, nil, "s__v1", ""},
		{"one pair", []string{"k"}, []string{"v"}, "s__v1", ""},
		{"values empty", []string{"a", "b"}, []string{"", ""}, "s__v1", "s__v1\x00b"},
		{"long lengths", []string{strings.Repeat("k", 200), "x"}, []string{strings.Repeat("v", 20000), strings.Repeat("w", 127)}, "s__v1", "s__v1\x00x"},
		{"no namespace", []string{"k"}, []string{"v"}, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			records := &kvpb.ColumnarRecords{KeyLengths: []uint32{}, ValueLengths: []uint32{}}
			for i := range c.keys {
				records.Keys = append(records.Keys, c.keys[i]...)
				records.Values = append(records.Values, c.values[i]...)
				records.KeyLengths = append(records.KeyLengths, uint32(len(c.keys[i])))
				records.ValueLengths = append(records.ValueLengths, uint32(len(c.values[i])))
			}
			want, err := proto.Marshal(&kvpb.ScanResponse{Namespace: c.namespace, Columnar: records, NextPageToken: []byte(c.token)})
			if err != nil {
				t.Fatal(err)
			}
			keys, values := batchBuffers.Get(len(records.Keys)), batchBuffers.Get(len(records.Values))
			copy(*keys, records.Keys)
			copy(*values, records.Values)
			page := &scanRecords{ColumnarRecords: &kvpb.ColumnarRecords{Keys: *keys, KeyLengths: records.KeyLengths,
				Values: *values, ValueLengths: records.ValueLengths}, keys: keys, values: values}
			wire, err := codec{}.Marshal(&scanPage{namespace: c.namespace, token: []byte(c.token), records: page})
			if err != nil {
				t.Fatal(err)
			}
			if got := wire.Materialize(); !bytes.Equal(got, want) {
				t.Fatalf("marshaled %x\nwant      %x", got, want)
			}
			if len(records.Keys) > 0 && &wire[1].ReadOnlyData()[0] != &(*keys)[0] {
				t.Error("the keys were copied")
			}
			if len(records.Values) > 0 && &wire[3].ReadOnlyData()[0] != &(*values)[0] {
				t.Error("the values were copied")
			}
			if page.keys != nil || page.ColumnarRecords != nil {
				t.Error("the page still holds the buffers it handed over")
			}
			wire.Free()
		})
	}
}
