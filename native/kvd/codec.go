package main

// How messages cross the wire: relayed calls as opaque frames, this process's own calls as
// protobuf. A PutBatch request carrying one columnar batch (what every Bulldozer client
// sends: bulldozer.kv.columnar) is the one large message, a batch of up to tens of MiB: it
// is copied once out of gRPC's receive buffers into a buffer kept for reuse, and its keys
// and values are that buffer's bytes (see putRequests). Decoding it the general way copied
// it twice more (gathered into one fresh, zeroed slice, then each bytes field into another)
// and left two batch-sized allocations per request to the collector. The other large
// message, a columnar Scan page, goes out the other way round: its keys and values are sent
// from the buffers the store read them into (scanPage).

import (
	"sync"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"bulldozer/kvd/internal/kvpb"
)

// frame is a message relayed without decoding.
type frame struct{ data []byte }

// codec passes frames through and (un)marshals the messages of the services this process
// serves as protobuf.
type codec struct{}

func (codec) Name() string { return "proto" }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *frame:
		return mem.BufferSlice{mem.SliceBuffer(m.data)}, nil
	case *scanPage:
		return m.marshal(), nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "cannot marshal %T", v)
	}
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *frame:
		m.data = data.Materialize()
		return nil
	case *kvpb.PutBatchRequest:
		buf := batchBuffers.Get(data.Len())
		b := (*buf)[:data.CopyTo(*buf)]
		if decodePutBatch(b, m) {
			putRequests.Store(m, buf)
			return nil
		}
		err := proto.Unmarshal(b, m) // any other shape: the general way (it copies what it keeps)
		batchBuffers.Put(buf)
		return err
	case proto.Message:
		return proto.Unmarshal(data.Materialize(), m)
	}
	return status.Errorf(codes.Internal, "cannot unmarshal into %T", v)
}

// scanPage is a ScanResponse whose columnar records' keys and values are buffers of
// batchBuffers (a page the store read, scanRecords): its wire bytes are the message's
// fields around those buffers, not a copy of them, and the buffers go back to the pool
// once gRPC has written them (mem.NewBuffer). Every other page took a second page-sized
// buffer to marshal into, and both went to the collector: a 10 M-record scan allocated
// 1.3 GB, and its collections were a fifth of its time.
type scanPage struct {
	namespace string
	token     []byte
	records   *scanRecords
}

// marshal is what proto.Marshal makes of the page as a ScanResponse, byte for byte
// (namespace, next_page_token, then columnar: keys, key_lengths, values, value_lengths,
// empty fields left out), in five pieces: the fields before the keys, the keys, the key
// lengths and the fields before the values, the values, the value lengths.
func (p *scanPage) marshal() mem.BufferSlice {
	r := p.records
	keys, values := len(r.Keys), len(r.Values)
	keyLengths, valueLengths := packedSize(r.KeyLengths), packedSize(r.ValueLengths)
	inner := bytesField(keys) + bytesField(keyLengths) + bytesField(values) + bytesField(valueLengths)
	head := make([]byte, 0, bytesField(len(p.namespace))+bytesField(len(p.token))+1+protowire.SizeVarint(uint64(inner))+1+protowire.SizeVarint(uint64(keys)))
	if p.namespace != "" {
		head = protowire.AppendString(protowire.AppendTag(head, 1, protowire.BytesType), p.namespace)
	}
	if len(p.token) > 0 {
		head = protowire.AppendBytes(protowire.AppendTag(head, 3, protowire.BytesType), p.token)
	}
	head = protowire.AppendVarint(protowire.AppendTag(head, 4, protowire.BytesType), uint64(inner))
	if keys > 0 {
		head = protowire.AppendVarint(protowire.AppendTag(head, 1, protowire.BytesType), uint64(keys))
	}
	mid := appendPacked(make([]byte, 0, bytesField(keyLengths)+protowire.SizeTag(3)+protowire.SizeVarint(uint64(values))), 2, r.KeyLengths, keyLengths)
	if values > 0 {
		mid = protowire.AppendVarint(protowire.AppendTag(mid, 3, protowire.BytesType), uint64(values))
	}
	tail := appendPacked(make([]byte, 0, bytesField(valueLengths)), 4, r.ValueLengths, valueLengths)
	out := mem.BufferSlice{mem.SliceBuffer(head), pooled(r.keys), mem.SliceBuffer(mid), pooled(r.values), mem.SliceBuffer(tail)}
	r.keys, r.values, r.ColumnarRecords = nil, nil, nil // gRPC's now
	return out
}

// pooled is a buffer of batchBuffers as gRPC's, handed back once written; an empty one at
// once.
func pooled(buf *[]byte) mem.Buffer {
	if len(*buf) == 0 {
		batchBuffers.Put(buf)
		return mem.SliceBuffer(nil)
	}
	return mem.NewBuffer(buf, &batchBuffers)
}

// bytesField is the size of a length-delimited field of field number under 16 holding n
// bytes, 0 when n is (proto3 leaves an empty field out).
func bytesField(n int) int {
	if n == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(uint64(n)) + n
}

// packedSize is the size of values as packed varints.
func packedSize(values []uint32) int {
	n := 0
	for _, v := range values {
		n += protowire.SizeVarint(uint64(v))
	}
	return n
}

// appendPacked appends values as packed field number (size: their packedSize), nothing
// when there are none.
func appendPacked(b []byte, number protowire.Number, values []uint32, size int) []byte {
	if len(values) == 0 {
		return b
	}
	b = protowire.AppendVarint(protowire.AppendTag(b, number, protowire.BytesType), uint64(size))
	for _, v := range values {
		if v < 0x80 {
			b = append(b, byte(v))
		} else {
			b = protowire.AppendVarint(b, uint64(v))
		}
	}
	return b
}

// putRequests are the PutBatch requests decoded into a reused buffer, and that buffer:
// released (releaseRequest) once the call that received the request has served it.
var putRequests sync.Map

// releaseRequest hands a served PutBatch request's buffer back for reuse; the request's keys
// and values must not be used after it (the store has copied what it keeps).
func releaseRequest(req *kvpb.PutBatchRequest) {
	if buf, ok := putRequests.LoadAndDelete(req); ok {
		req.Columnar = nil
		batchBuffers.Put(buf.(*[]byte))
	}
}

// decodePutBatch decodes b into m when b is a PutBatchRequest of the usual shape, each field
// once: a namespace and a columnar batch (keys, packed key lengths, values, packed value
// lengths), its keys and values aliasing b. False (m untouched) for any other shape, which
// the general decoder then reads: records, a field repeated, lengths not packed, a field
// this version does not know.
func decodePutBatch(b []byte, m *kvpb.PutBatchRequest) bool {
	var namespace string
	var columnar *kvpb.ColumnarRecords
	var seen [4]bool
	for len(b) > 0 {
		num, v, rest, ok := field(b, seen[:])
		if !ok || num == 2 { // 2: records
			return false
		}
		b = rest
		if num == 1 {
			if !utf8.Valid(v) { // proto3 strings are UTF-8: the general decoder says so
				return false
			}
			namespace = string(v)
		} else if columnar = decodeColumnar(v); columnar == nil {
			return false
		}
	}
	m.Namespace, m.Columnar = namespace, columnar
	return true
}

func decodeColumnar(b []byte) *kvpb.ColumnarRecords {
	c := &kvpb.ColumnarRecords{}
	var seen [5]bool
	for len(b) > 0 {
		num, v, rest, ok := field(b, seen[:])
		if !ok {
			return nil
		}
		b = rest
		switch num {
		case 1:
			c.Keys = v
		case 3:
			c.Values = v
		case 2, 4:
			lengths, ok := packedUint32s(v)
			if !ok {
				return nil
			}
			if num == 2 {
				c.KeyLengths = lengths
			} else {
				c.ValueLengths = lengths
			}
		}
	}
	return c
}

// field reads the first field of b, of a message read the usual way: length-delimited,
// numbered from 1 to len(seen) - 1, and not seen before (it is marked seen); its number, its
// bytes (aliasing b) and the rest of b, or ok false for anything else.
func field(b []byte, seen []bool) (num protowire.Number, v, rest []byte, ok bool) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 || typ != protowire.BytesType || num < 1 || int(num) >= len(seen) || seen[num] {
		return 0, nil, nil, false
	}
	seen[num] = true
	v, k := protowire.ConsumeBytes(b[n:])
	if k < 0 {
		return 0, nil, nil, false
	}
	return num, v, b[n+k:], true
}

// packedUint32s decodes a packed repeated uint32 field (varints, each truncated to 32 bits
// as protobuf does).
func packedUint32s(b []byte) ([]uint32, bool) {
	count := 0
	for _, c := range b {
		if c < 0x80 {
			count++
		}
	}
	out := make([]uint32, 0, count)
	for len(b) > 0 {
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return nil, false
		}
		out = append(out, uint32(v))
		b = b[n:]
	}
	return out, true
}

// bufferPool keeps buffers for reuse, unzeroed (each is written whole before it is read):
// one pool per size class, a power of two from 256 bytes. It is also the pool gRPC reads
// frames into (a mem.BufferPool): gRPC's default pool zeroes every buffer it hands out again.
type bufferPool struct{ classes [40]sync.Pool }

var batchBuffers bufferPool

const smallestClass = 8 // 256 bytes

// class is the size class of a buffer of size bytes: the smallest power of two that holds
// it (len(classes) and over are not kept).
func class(size int) int {
	c := smallestClass
	for c < 62 && 1<<c < size {
		c++
	}
	return c
}

func (p *bufferPool) Get(size int) *[]byte {
	c := class(size)
	if c < len(p.classes) {
		if buf, ok := p.classes[c].Get().(*[]byte); ok {
			*buf = (*buf)[:size]
			return buf
		}
	}
	b := make([]byte, size, max(size, 1<<c))
	return &b
}

func (p *bufferPool) Put(buf *[]byte) {
	c := class(cap(*buf))
	if 1<<c == cap(*buf) && c < len(p.classes) {
		p.classes[c].Put(buf)
	}
}
