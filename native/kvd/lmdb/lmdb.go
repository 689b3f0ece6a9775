// Package lmdb is the small part of LMDB the data plane needs, over the C library built
// from the same sources py-lmdb bundles (scripts/build_native.sh copies them here).
//
// The environment is opened with MDB_NOTLS, so a read transaction is not tied to an OS
// thread and may be used from any goroutine (one at a time). Write transactions are run
// start to finish inside one C call (PutBatch), so LMDB's writer lock is taken and released
// on the same thread, as it requires.
package lmdb

/*
#cgo CFLAGS: -O2 -w
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "lmdb.h"

// The outcome of kvd_put_batch besides LMDB's return code.
#define KVD_STORED 0
#define KVD_NOT_LOADING 1

// One batch into a LOADING namespace, in one write transaction: the rules of the Python
// engine's EmbeddedEngine._put_pairs and _add_digest, byte for byte:
//  - the namespace's state (meta.states) must be `writable` (shared.StatesWritable:
//    LOADING), else nothing is written and
//    *outcome is KVD_NOT_LOADING (the caller asks the reference DAL for the exact error);
//  - the pairs are put without overwriting; if any key was already there (a retried batch,
//    a key repeated in the batch), they are put again in order with overwriting (the last
//    value wins) and the running digest is marked inexact;
//  - otherwise the running digest (meta.digests: <count, sum, bytes, exact> little-endian
//    u64, u64, u64, u8) grows by the batch's digest.
static int kvd_put_batch(MDB_env *env, MDB_dbi data, MDB_dbi states, MDB_dbi digests,
                         const char *name, size_t name_len,
                         const char *writable, size_t writable_len,
                         const char *keys, const uint32_t *klens,
                         const char *vals, const uint32_t *vlens, size_t n,
                         uint64_t dcount, uint64_t dsum, uint64_t dbytes, int *outcome) {
	MDB_txn *txn;
	MDB_cursor *cur = NULL;
	MDB_val k, v;
	size_t i, added = 0;
	const char *kp, *vp;
	int rc = mdb_txn_begin(env, NULL, 0, &txn);
	*outcome = KVD_STORED;
	if (rc) return rc;
	k.mv_data = (void *)name; k.mv_size = name_len;
	rc = mdb_get(txn, states, &k, &v);
	if (rc == MDB_NOTFOUND || (rc == 0 && !(v.mv_size == writable_len && memcmp(v.mv_data, writable, writable_len) == 0))) {
		mdb_txn_abort(txn);
		*outcome = KVD_NOT_LOADING;
		return 0;
	}
	if (rc) goto fail;
	// A cursor, as py-lmdb's putmulti: a key on the page the cursor is on skips the descent
	// from the root.
	if ((rc = mdb_cursor_open(txn, data, &cur))) goto fail;
	for (i = 0, kp = keys, vp = vals; i < n; kp += klens[i], vp += vlens[i], i++) {
		k.mv_data = (void *)kp; k.mv_size = klens[i];
		v.mv_data = (void *)vp; v.mv_size = vlens[i];
		rc = mdb_cursor_put(cur, &k, &v, MDB_NOOVERWRITE);
		if (rc == 0) added++;
		else if (rc != MDB_KEYEXIST) goto fail;
	}
	if (added != n) {
		for (i = 0, kp = keys, vp = vals; i < n; kp += klens[i], vp += vlens[i], i++) {
			k.mv_data = (void *)kp; k.mv_size = klens[i];
			v.mv_data = (void *)vp; v.mv_size = vlens[i];
			if ((rc = mdb_cursor_put(cur, &k, &v, 0))) goto fail;
		}
	}
	k.mv_data = (void *)name; k.mv_size = name_len;
	rc = mdb_get(txn, digests, &k, &v);
	if (rc == 0 && v.mv_size == 25 && ((const unsigned char *)v.mv_data)[24]) {
		unsigned char buf[25];
		uint64_t count, sum, bytes;
		memcpy(&count, v.mv_data, 8);
		memcpy(&sum, (const char *)v.mv_data + 8, 8);
		memcpy(&bytes, (const char *)v.mv_data + 16, 8);
		if (added == n) { count += dcount; sum += dsum; bytes += dbytes; }
		memcpy(buf, &count, 8); memcpy(buf + 8, &sum, 8); memcpy(buf + 16, &bytes, 8);
		buf[24] = added == n;
		v.mv_data = buf; v.mv_size = 25;
		if ((rc = mdb_put(txn, digests, &k, &v, 0))) goto fail;
	} else if (rc && rc != MDB_NOTFOUND) {
		goto fail;
	}
	mdb_cursor_close(cur);
	return mdb_txn_commit(txn);
fail:
	if (cur) mdb_cursor_close(cur);
	mdb_txn_abort(txn);
	return rc;
}

// Look n keys up (laid end to end in keys) in one call; out[i].mv_data is NULL when a key
// is missing. The values point into the map and are valid until the transaction ends.
static int kvd_get_many(MDB_txn *txn, MDB_dbi dbi, const char *keys, const uint32_t *klens, size_t n, MDB_val *out) {
	MDB_val k;
	size_t i;
	int rc;
	const char *kp = keys;
	for (i = 0; i < n; kp += klens[i], i++) {
		k.mv_data = (void *)kp; k.mv_size = klens[i];
		rc = mdb_get(txn, dbi, &k, &out[i]);
		if (rc == MDB_NOTFOUND) { out[i].mv_data = NULL; out[i].mv_size = 0; }
		else if (rc) return rc;
	}
	return 0;
}

// One key: key and its length are passed as plain arguments (cgo forbids passing Go
// memory that holds a Go pointer, such as an MDB_val pointing into a Go slice).
static int kvd_get(MDB_txn *txn, MDB_dbi dbi, const char *key, size_t len, MDB_val *out) {
	MDB_val k;
	k.mv_data = (void *)key; k.mv_size = len;
	return mdb_get(txn, dbi, &k, out);
}

// Open an existing named database in a read-only transaction whose commit publishes the
// handle to the environment.
static int kvd_open_dbi(MDB_env *env, const char *name, MDB_dbi *dbi) {
	MDB_txn *txn;
	int rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &txn);
	if (rc) return rc;
	rc = mdb_dbi_open(txn, name, 0, dbi);
	if (rc) { mdb_txn_abort(txn); return rc; }
	return mdb_txn_commit(txn);
}
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"bulldozer/kvd/internal/shared"
)

// Errno is an LMDB return code.
type Errno int

// NotFound is LMDB's "no such key / database".
const NotFound Errno = C.MDB_NOTFOUND

func (e Errno) Error() string { return "lmdb: " + C.GoString(C.mdb_strerror(C.int(e))) }

func check(rc C.int) error {
	if rc != 0 {
		return Errno(rc)
	}
	return nil
}

// DBI is a database handle of an environment.
type DBI C.MDB_dbi

// Version is the LMDB release this binary was built from.
func Version() string {
	var major, minor, patch C.int
	C.mdb_version(&major, &minor, &patch)
	return fmt.Sprintf("%d.%d.%d", major, minor, patch)
}

// Options are how an environment is opened: as the Python embedded engine opens it.
type Options struct {
	MapSize    int64
	MaxDBs     int
	MaxReaders int
	WriteMap   bool
}

// Env is an open LMDB environment (a directory).
type Env struct {
	env  *C.MDB_env
	mu   sync.Mutex // mdb_dbi_open must not run in two transactions at once
	dbis map[string]DBI
}

// Open opens the store in dir, which must already hold one (the Python DAL creates it).
func Open(dir string, o Options) (*Env, error) {
	var env *C.MDB_env
	if err := check(C.mdb_env_create(&env)); err != nil {
		return nil, err
	}
	e := &Env{env: env, dbis: map[string]DBI{}}
	steps := []C.int{
		C.mdb_env_set_mapsize(env, C.size_t(o.MapSize)),
		C.mdb_env_set_maxdbs(env, C.MDB_dbi(o.MaxDBs)),
		C.mdb_env_set_maxreaders(env, C.uint(o.MaxReaders)),
	}
	for _, rc := range steps {
		if err := check(rc); err != nil {
			C.mdb_env_close(env)
			return nil, err
		}
	}
	flags := C.uint(C.MDB_NOSYNC | C.MDB_NOMETASYNC | C.MDB_NORDAHEAD | C.MDB_NOTLS)
	if o.WriteMap {
		flags |= C.MDB_WRITEMAP
	}
	cdir := C.CString(dir)
	defer C.free(unsafe.Pointer(cdir))
	if err := check(C.mdb_env_open(env, cdir, flags, 0o644)); err != nil {
		C.mdb_env_close(env)
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	return e, nil
}

// Close closes the environment (no transaction may be live).
func (e *Env) Close() { C.mdb_env_close(e.env) }

// Sync flushes written pages to disk.
func (e *Env) Sync() error { return check(C.mdb_env_sync(e.env, 1)) }

// DBI is the handle of the existing named database name; NotFound if there is none.
// Handles are cached: call it before beginning the transaction that uses the handle.
func (e *Env) DBI(name string) (DBI, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if dbi, ok := e.dbis[name]; ok {
		return dbi, nil
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var dbi C.MDB_dbi
	if err := check(C.kvd_open_dbi(e.env, cname, &dbi)); err != nil {
		return 0, err
	}
	e.dbis[name] = DBI(dbi)
	return DBI(dbi), nil
}

// Batch is a columnar batch of pairs: keys and values laid end to end, with their lengths.
type Batch struct {
	Keys, Values             []byte
	KeyLengths, ValueLengths []uint32
}

// Digest is a batch's (count, sum of pair hashes, bytes), as the running digest adds it.
type Digest struct{ Count, Sum, Bytes uint64 }

func ptr(b []byte) *C.char {
	if len(b) == 0 {
		return nil
	}
	return (*C.char)(unsafe.Pointer(&b[0]))
}

func lens(l []uint32) *C.uint32_t {
	if len(l) == 0 {
		return nil
	}
	return (*C.uint32_t)(unsafe.Pointer(&l[0]))
}

// PutBatch writes a batch into the data database of a LOADING namespace, growing its
// running digest (see kvd_put_batch). loading is false, and nothing is written, when the
// namespace is not (or no longer) LOADING.
func (e *Env) PutBatch(data, states, digests DBI, name string, b Batch, d Digest) (loading bool, err error) {
	var outcome C.int
	cname := []byte(name)
	writable := []byte(shared.StatesWritable) // the one state a version takes writes in
	rc := C.kvd_put_batch(e.env, C.MDB_dbi(data), C.MDB_dbi(states), C.MDB_dbi(digests),
		ptr(cname), C.size_t(len(cname)), ptr(writable), C.size_t(len(writable)),
		ptr(b.Keys), lens(b.KeyLengths), ptr(b.Values), lens(b.ValueLengths), C.size_t(len(b.KeyLengths)),
		C.uint64_t(d.Count), C.uint64_t(d.Sum), C.uint64_t(d.Bytes), &outcome)
	if err := check(rc); err != nil {
		return false, err
	}
	return outcome == C.KVD_STORED, nil
}

// Txn is a read-only transaction.
type Txn struct{ txn *C.MDB_txn }

// BeginRead starts a read-only snapshot of the store.
func (e *Env) BeginRead() (*Txn, error) {
	var txn *C.MDB_txn
	if err := check(C.mdb_txn_begin(e.env, nil, C.MDB_RDONLY, &txn)); err != nil {
		return nil, err
	}
	return &Txn{txn}, nil
}

// Abort ends the transaction.
func (t *Txn) Abort() { C.mdb_txn_abort(t.txn) }

// Get copies out the value of key (nil, false when there is none).
func (t *Txn) Get(dbi DBI, key []byte) ([]byte, bool, error) {
	if len(key) == 0 {
		return nil, false, nil
	}
	var v C.MDB_val
	rc := C.kvd_get(t.txn, C.MDB_dbi(dbi), ptr(key), C.size_t(len(key)), &v)
	if Errno(rc) == NotFound {
		return nil, false, nil
	}
	if err := check(rc); err != nil {
		return nil, false, err
	}
	return C.GoBytes(v.mv_data, C.int(v.mv_size)), true, nil
}

// GetMany copies out the values of keys laid end to end (nil where a key is missing).
func (t *Txn) GetMany(dbi DBI, keys []byte, klens []uint32) ([][]byte, error) {
	n := len(klens)
	if n == 0 {
		return nil, nil
	}
	out := (*C.MDB_val)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(C.MDB_val{}))))
	defer C.free(unsafe.Pointer(out))
	if err := check(C.kvd_get_many(t.txn, C.MDB_dbi(dbi), ptr(keys), lens(klens), C.size_t(n), out)); err != nil {
		return nil, err
	}
	vals := unsafe.Slice(out, n)
	values := make([][]byte, n)
	for i, v := range vals {
		if v.mv_data != nil {
			values[i] = C.GoBytes(v.mv_data, C.int(v.mv_size))
		}
	}
	return values, nil
}
