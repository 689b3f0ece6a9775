// Package lmdb is the small part of LMDB the data plane needs, over the C library built
// from the same sources py-lmdb bundles (scripts/build_native.sh copies them here; mdb.c
// to c/, compiled in search.c's unit).
//
// The environment is opened with MDB_NOTLS, so a read transaction is not tied to an OS
// thread and may be used from any goroutine (one at a time). Write transactions are run
// start to finish inside one C call (PutBatch), so LMDB's writer lock is taken and released
// on the same thread, as it requires.
package lmdb

/*
#cgo CFLAGS: -O2 -w -I${SRCDIR}
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <fcntl.h>
#include "lmdb.h"
#include "search.h"

// Start writing the store's dirty pages to disk, without waiting for the writes (Linux;
// elsewhere nothing: the next fsync writes them).
static void kvd_start_writeback(MDB_env *env) {
#ifdef __linux__
	int fd;
	if (mdb_env_get_fd(env, &fd) == 0) sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
#endif
}

// The outcome of kvd_put_batch besides LMDB's return code.
#define KVD_STORED 0
#define KVD_NOT_LOADING 1

// The state check of every write: the namespace's state (meta.states) must be `writable`
// (shared.StatesWritable: LOADING), else *outcome is KVD_NOT_LOADING (the caller asks the
// reference DAL for the exact error). Returns LMDB's code of the lookup.
static int kvd_check_writable(MDB_txn *txn, MDB_dbi states, const char *name, size_t name_len,
                              const char *writable, size_t writable_len, int *outcome) {
	MDB_val k, v;
	int rc;
	k.mv_data = (void *)name; k.mv_size = name_len;
	rc = mdb_get(txn, states, &k, &v);
	if (rc == MDB_NOTFOUND || (rc == 0 && !(v.mv_size == writable_len && memcmp(v.mv_data, writable, writable_len) == 0))) {
		*outcome = KVD_NOT_LOADING;
		return 0;
	}
	return rc;
}

// The running digest (meta.digests: <count, sum, bytes, exact> little-endian u64, u64, u64,
// u8) grows by (dcount, dsum, dbytes) while it is exact; exact false makes it inexact.
static int kvd_add_digest(MDB_txn *txn, MDB_dbi digests, const char *name, size_t name_len,
                          uint64_t dcount, uint64_t dsum, uint64_t dbytes, int exact) {
	MDB_val k, v;
	int rc;
	k.mv_data = (void *)name; k.mv_size = name_len;
	rc = mdb_get(txn, digests, &k, &v);
	if (rc == MDB_NOTFOUND) return 0;  // created before running digests were kept: the seal scans
	if (rc) return rc;
	if (v.mv_size == 25 && ((const unsigned char *)v.mv_data)[24]) {
		unsigned char buf[25];
		uint64_t count, sum, bytes;
		memcpy(&count, v.mv_data, 8);
		memcpy(&sum, (const char *)v.mv_data + 8, 8);
		memcpy(&bytes, (const char *)v.mv_data + 16, 8);
		if (exact) { count += dcount; sum += dsum; bytes += dbytes; }
		memcpy(buf, &count, 8); memcpy(buf + 8, &sum, 8); memcpy(buf + 16, &bytes, 8);
		buf[24] = exact != 0;
		v.mv_data = buf; v.mv_size = 25;
		return mdb_put(txn, digests, &k, &v, 0);
	}
	return 0;
}

// The key of a namespace's staged run: name, NUL, the run's number (big-endian u64).
static void kvd_run_key(unsigned char *out, const char *name, size_t name_len, uint64_t number) {
	int i;
	memcpy(out, name, name_len);
	out[name_len] = 0;
	for (i = 0; i < 8; i++) out[name_len + 1 + i] = (unsigned char)(number >> (56 - 8 * i));
}

// The number of the staged run whose key (name, NUL, big-endian u64) is k.
static uint64_t kvd_run_number(const MDB_val *k, size_t name_len) {
	const unsigned char *p = (const unsigned char *)k->mv_data + name_len + 1;
	uint64_t number = 0;
	int i;
	for (i = 0; i < 8; i++) number = number << 8 | p[i];
	return number;
}

// Byte order of two keys, then their positions (which makes the sort stable).
struct kvd_sort_ctx { const char *keys; const uint64_t *offs; const uint32_t *lens; };

static int kvd_cmp_keys(const void *a, const void *b, void *arg) {
	const struct kvd_sort_ctx *c = arg;
	uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
	uint32_t li = c->lens[i], lj = c->lens[j];
	int r = memcmp(c->keys + c->offs[i], c->keys + c->offs[j], li < lj ? li : lj);
	if (r) return r;
	if (li != lj) return li < lj ? -1 : 1;
	return i < j ? -1 : (i > j);
}

// A key's first 8 bytes as a big-endian number, zero-padded: two keys whose prefixes differ
// are in the prefixes' order (where they are equal, the whole keys decide).
static uint64_t kvd_key_prefix(const unsigned char *key, uint32_t len) {
	uint64_t prefix = 0;
	uint32_t i, n = len < 8 ? len : 8;
	for (i = 0; i < n; i++) prefix |= (uint64_t)key[i] << (56 - 8 * i);
	return prefix;
}

// One batch into a LOADING namespace, in one write transaction: the rules of the Python
// engine's EmbeddedEngine.write_batch, byte for byte. The batch is staged as one sorted run
// (meta.stage, keyed by name, NUL and the run's number, one after the namespace's last
// run) in the layout of shared.StoreStageRunHeader / StoreStageRecordHeader: a u32 count,
// then per record u32 key and value lengths, the key and the value, keys ascending; a key
// repeated in the batch keeps its last value and marks the running digest inexact,
// otherwise the running digest grows by the batch's.
static int kvd_stage_batch(MDB_env *env, MDB_dbi stage, MDB_dbi states, MDB_dbi digests,
                           const char *name, size_t name_len,
                           const char *writable, size_t writable_len,
                           const char *keys, const uint32_t *klens,
                           const char *vals, const uint32_t *vlens, size_t n,
                           uint64_t dcount, uint64_t dsum, uint64_t dbytes, int *outcome) {
	MDB_txn *txn = NULL;
	MDB_cursor *cur = NULL;
	MDB_val k, v;
	uint64_t *koffs = NULL, *voffs = NULL, number = 0, size = 4;
	uint32_t *order = NULL, kept = 0;
	unsigned char *key = NULL, *out;
	size_t i;
	int rc = ENOMEM, repeated = 0;
	*outcome = KVD_STORED;
	koffs = malloc(n * sizeof *koffs);
	voffs = malloc(n * sizeof *voffs);
	order = malloc(n * sizeof *order);
	key = malloc(name_len + 9);
	if (!koffs || !voffs || !order || !key) goto done;
	for (i = 0; i < n; i++) {
		koffs[i] = i ? koffs[i - 1] + klens[i - 1] : 0;
		voffs[i] = i ? voffs[i - 1] + vlens[i - 1] : 0;
		order[i] = (uint32_t)i;
	}
	struct kvd_sort_ctx ctx = {keys, koffs, klens};
	qsort_r(order, n, sizeof *order, kvd_cmp_keys, &ctx);
	// equal keys are adjacent, in batch order: keep the last of each
	for (i = 0; i < n; i++) {
		uint32_t r = order[i];
		if (kept && klens[order[kept - 1]] == klens[r] &&
		    memcmp(keys + koffs[order[kept - 1]], keys + koffs[r], klens[r]) == 0) {
			size -= 8 + (uint64_t)klens[order[kept - 1]] + vlens[order[kept - 1]];
			order[kept - 1] = r;
			repeated = 1;
		} else {
			order[kept++] = r;
		}
		size += 8 + (uint64_t)klens[r] + vlens[r];
	}
	if ((rc = mdb_txn_begin(env, NULL, 0, &txn))) { txn = NULL; goto done; }
	if ((rc = kvd_check_writable(txn, states, name, name_len, writable, writable_len, outcome)) || *outcome != KVD_STORED) goto done;
	// the number after the namespace's last run: the last key before name NUL ff..ff
	if ((rc = mdb_cursor_open(txn, stage, &cur))) goto done;
	kvd_run_key(key, name, name_len, UINT64_MAX);
	k.mv_data = key; k.mv_size = name_len + 9;
	rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
	rc = mdb_cursor_get(cur, &k, &v, rc == 0 ? MDB_PREV : MDB_LAST);
	if (rc == 0 && k.mv_size == name_len + 9 && memcmp(k.mv_data, name, name_len) == 0 &&
	    ((const unsigned char *)k.mv_data)[name_len] == 0) {
		number = kvd_run_number(&k, name_len) + 1;
	} else if (rc && rc != MDB_NOTFOUND) {
		goto done;
	}
	kvd_run_key(key, name, name_len, number);
	k.mv_data = key; k.mv_size = name_len + 9;
	v.mv_data = NULL; v.mv_size = size;
	if ((rc = mdb_put(txn, stage, &k, &v, MDB_RESERVE))) goto done;
	out = v.mv_data;
	memcpy(out, &kept, 4); out += 4;
	for (i = 0; i < kept; i++) {
		uint32_t r = order[i];
		memcpy(out, &klens[r], 4); memcpy(out + 4, &vlens[r], 4); out += 8;
		memcpy(out, keys + koffs[r], klens[r]); out += klens[r];
		memcpy(out, vals + voffs[r], vlens[r]); out += vlens[r];
	}
	if ((rc = kvd_add_digest(txn, digests, name, name_len, dcount, dsum, dbytes, !repeated))) goto done;
	mdb_cursor_close(cur); cur = NULL;
	rc = mdb_txn_commit(txn); txn = NULL;
done:
	if (cur) mdb_cursor_close(cur);
	if (txn) mdb_txn_abort(txn);
	free(koffs); free(voffs); free(order); free(key);
	return rc;
}

// A staged run being merged: its next record at ``at`` (its key's and value's lengths, and
// its key's prefix, kvd_key_prefix), the records left, its place.
// The merge compares the prefixes first: they decide nearly every comparison (a key that
// encodes an integer differs from the next within 8 bytes) from the heap's own array, where
// a memcmp through the keys reached into as many places of the map as there are runs (a
// 30 M-row version's seal, merging 300 runs: 11.1 s → 5.1 s, most of it comparing keys).
struct kvd_run { const unsigned char *at; uint64_t prefix; uint32_t left, klen, vlen; size_t index; };

static void kvd_run_load(struct kvd_run *r) {
	memcpy(&r->klen, r->at, 4);
	memcpy(&r->vlen, r->at + 4, 4);
	r->prefix = kvd_key_prefix(r->at + 8, r->klen);
}

// Heap order: the smaller key first, and of equal keys the older run (so the newest comes last).
static int kvd_run_less(const struct kvd_run *a, const struct kvd_run *b) {
	if (a->prefix != b->prefix) return a->prefix < b->prefix;
	uint32_t l = a->klen < b->klen ? a->klen : b->klen;
	int r = memcmp(a->at + 8, b->at + 8, l);
	if (r) return r < 0;
	if (a->klen != b->klen) return a->klen < b->klen;
	return a->index < b->index;
}

static void kvd_sift_down(struct kvd_run **heap, size_t n, size_t i) {
	for (;;) {
		size_t l = 2 * i + 1, m = i;
		if (l < n && kvd_run_less(heap[l], heap[m])) m = l;
		if (l + 1 < n && kvd_run_less(heap[l + 1], heap[m])) m = l + 1;
		if (m == i) return;
		struct kvd_run *t = heap[i]; heap[i] = heap[m]; heap[m] = t;
		i = m;
	}
}

// Key filters of sealed layers (shared.StoreMetaFilters: a layer's name -> its filter). A
// read or write through a chain of layers asks each layer for each key; a filter answers
// "not in this layer" for most keys a layer does not hold without searching its B-trees.
// It is a blocked Bloom filter over the layer's data and tombstone keys: a header (magic
// "KVF1", the probes per key, the number of 64-byte blocks, little-endian u32, u32, u64),
// then the blocks; a key's hash picks one block and sets KVD_FILTER_PROBES of its 512 bits
// (≈ 1 % false positives at 10 bits per key, one cache line per key). A filter is built by
// kvd_filter_build only for a layer that is readable (SEALED, ACTIVE or RETIRED: its data
// never changes again), in the same write transaction that checks so; the Python engine
// deletes it in the transaction that drops the layer's data (and when a namespace of that
// name is created), so a filter found in a transaction is always its layer's. Nothing but
// this data plane reads them: a filter only skips lookups that would find nothing.
#define KVD_FILTER_MAGIC 0x3146564Bu
#define KVD_FILTER_HEADER 16
#define KVD_FILTER_PROBES 7
#define KVD_FILTER_BITS_PER_KEY 10

static uint64_t kvd_fmix(uint64_t h) {
	h ^= h >> 33; h *= 0xFF51AFD7ED558CCDULL;
	h ^= h >> 33; h *= 0xC4CEB9FE1A85EC53ULL;
	return h ^ (h >> 33);
}

static uint64_t kvd_key_hash(const unsigned char *p, size_t n) {
	uint64_t h = 0x9E3779B97F4A7C15ULL * (n + 1), w;
	for (; n >= 8; p += 8, n -= 8) {
		memcpy(&w, p, 8);
		h = (h ^ kvd_fmix(w)) * 0xBF58476D1CE4E5B9ULL;
		h = (h << 29) | (h >> 35);
	}
	w = 0;
	memcpy(&w, p, n);
	return kvd_fmix(h ^ kvd_fmix(w ^ 0x94D049BB133111EBULL));
}

// The block of a key's hash, and its probes' bits within it.
static const unsigned char *kvd_filter_block(const unsigned char *f, uint64_t h) {
	uint64_t nblocks;
	memcpy(&nblocks, f + 8, 8);
	return f + KVD_FILTER_HEADER + (((h >> 32) * nblocks) >> 32) * 64;
}

static void kvd_filter_add_hashed(unsigned char *f, uint64_t h) {
	uint64_t g = kvd_fmix(h + 0x9E3779B97F4A7C15ULL);
	unsigned char *b = (unsigned char *)kvd_filter_block(f, h);
	int i;
	for (i = 0; i < KVD_FILTER_PROBES; i++, g >>= 9) b[(g & 511) >> 3] |= (unsigned char)(1u << (g & 7));
}

// A filter's build adds keys KVD_FILTER_AHEAD at a time: each key's block is prefetched as
// its hash is known and set once the batch is full, so the blocks' cache misses overlap
// instead of each waiting on memory in turn. The filter of a 10 M-key bottom (12.5 MB),
// nine builds each way, in sets of three alternating: one key at a time 0.91–1.01 s
// (median 0.97), so 0.52–0.80 s (median 0.62). The first delta after a full run or a
// compaction builds its bottom's.
#define KVD_FILTER_AHEAD 32

// Whether the layer whose filter is f (an MDB_val from kvd_layer_filters) may hold k: 0
// only when it holds k neither in its data nor in its tombstones.
static int kvd_filter_may_hashed(const MDB_val *f, uint64_t h) {
	uint64_t g = kvd_fmix(h + 0x9E3779B97F4A7C15ULL);
	const unsigned char *b = kvd_filter_block(f->mv_data, h);
	int i;
	for (i = 0; i < KVD_FILTER_PROBES; i++, g >>= 9) {
		if (!(b[(g & 511) >> 3] & (1u << (g & 7)))) return 0;
	}
	return 1;
}

static int kvd_filter_may(const MDB_val *f, const MDB_val *k) {
	return kvd_filter_may_hashed(f, kvd_key_hash(k->mv_data, k->mv_size));
}

// The filter stored for name, checked whole; out->mv_data is NULL when there is none.
static int kvd_filter_get(MDB_txn *txn, MDB_dbi filters, const char *name, size_t name_len, MDB_val *out) {
	MDB_val k;
	uint32_t magic, probes;
	uint64_t nblocks;
	int rc;
	out->mv_data = NULL; out->mv_size = 0;
	if (!filters) return 0;
	k.mv_data = (void *)name; k.mv_size = name_len;
	rc = mdb_get(txn, filters, &k, out);
	if (rc == MDB_NOTFOUND) { out->mv_data = NULL; out->mv_size = 0; return 0; }
	if (rc) return rc;
	if (out->mv_size >= KVD_FILTER_HEADER) {
		memcpy(&magic, out->mv_data, 4);
		memcpy(&probes, (const char *)out->mv_data + 4, 4);
		memcpy(&nblocks, (const char *)out->mv_data + 8, 8);
		if (magic == KVD_FILTER_MAGIC && probes == KVD_FILTER_PROBES && nblocks &&
		    out->mv_size == KVD_FILTER_HEADER + nblocks * 64) return 0;
	}
	out->mv_data = NULL; out->mv_size = 0;  // not one this build reads: as if there were none
	return 0;
}

// The filters of n layers whose names are laid end to end (out[i].mv_data NULL where a
// layer has none); valid until the transaction ends.
static int kvd_layer_filters(MDB_txn *txn, MDB_dbi filters, const char *names, const uint32_t *nlens, size_t n, MDB_val *out) {
	size_t i;
	int rc;
	for (i = 0; i < n; names += nlens[i], i++) {
		if ((rc = kvd_filter_get(txn, filters, names, nlens[i], &out[i]))) return rc;
	}
	return 0;
}

// Build and store name's filter over its data and tombstones (tomb 0: none), in one write
// transaction, when the layer is readable (one of the nreadable states laid end to end in
// readable) and has no filter yet and at most max_entries keys; *built says whether it did.
static int kvd_filter_build(MDB_env *env, MDB_dbi filters, MDB_dbi states, const char *name, size_t name_len,
                            const char *readable, const uint32_t *rlens, size_t nreadable,
                            MDB_dbi data, MDB_dbi tomb, uint64_t max_entries, int *built) {
	MDB_txn *txn = NULL;
	MDB_cursor *cur = NULL;
	MDB_val k, v;
	MDB_stat st;
	uint64_t entries, nblocks;
	uint32_t magic = KVD_FILTER_MAGIC, probes = KVD_FILTER_PROBES;
	unsigned char *f;
	uint64_t ahead[KVD_FILTER_AHEAD];
	size_t i, nahead = 0;
	int rc, ok = 0, pass;
	*built = 0;
	if ((rc = mdb_txn_begin(env, NULL, 0, &txn))) return rc;
	k.mv_data = (void *)name; k.mv_size = name_len;
	rc = mdb_get(txn, states, &k, &v);
	if (rc == MDB_NOTFOUND) { rc = 0; goto done; }
	if (rc) goto done;
	for (i = 0; i < nreadable; readable += rlens[i], i++) {
		if (v.mv_size == rlens[i] && memcmp(v.mv_data, readable, rlens[i]) == 0) ok = 1;
	}
	if (!ok) goto done;
	rc = mdb_get(txn, filters, &k, &v);
	if (rc == 0) goto done;  // built meanwhile
	if (rc != MDB_NOTFOUND) goto done;
	if ((rc = mdb_stat(txn, data, &st))) goto done;
	entries = st.ms_entries;
	if (tomb) {
		if ((rc = mdb_stat(txn, tomb, &st))) goto done;
		entries += st.ms_entries;
	}
	if (entries > max_entries) { rc = 0; goto done; }
	nblocks = (entries * KVD_FILTER_BITS_PER_KEY + 511) / 512;
	if (!nblocks) nblocks = 1;
	k.mv_data = (void *)name; k.mv_size = name_len;
	v.mv_data = NULL; v.mv_size = KVD_FILTER_HEADER + nblocks * 64;
	if ((rc = mdb_put(txn, filters, &k, &v, MDB_RESERVE))) goto done;
	f = v.mv_data;
	memset(f, 0, v.mv_size);
	memcpy(f, &magic, 4); memcpy(f + 4, &probes, 4); memcpy(f + 8, &nblocks, 8);
	for (pass = 0; pass < 2; pass++) {
		MDB_dbi db = pass ? tomb : data;
		if (pass && !tomb) break;
		if ((rc = mdb_cursor_open(txn, db, &cur))) goto done;
		for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
			ahead[nahead] = kvd_key_hash(k.mv_data, k.mv_size);
			__builtin_prefetch(kvd_filter_block(f, ahead[nahead]), 1);
			if (++nahead == KVD_FILTER_AHEAD) {
				for (i = 0; i < nahead; i++) kvd_filter_add_hashed(f, ahead[i]);
				nahead = 0;
			}
		}
		for (i = 0; i < nahead; i++) kvd_filter_add_hashed(f, ahead[i]);
		nahead = 0;
		mdb_cursor_close(cur); cur = NULL;
		if (rc != MDB_NOTFOUND) goto done;
	}
	rc = mdb_txn_commit(txn); txn = NULL;
	if (rc == 0) *built = 1;
done:
	if (cur) mdb_cursor_close(cur);
	if (txn) mdb_txn_abort(txn);
	return rc;
}

// For each of n keys laid end to end, whether name's filter lets it be there (mask[i] 1),
// in the caller's read transaction; *has is 0, and mask untouched, when name has no filter.
static int kvd_filter_mask(MDB_txn *txn, MDB_dbi filters, const char *name, size_t name_len,
                           const char *keys, const uint32_t *klens, size_t n, unsigned char *mask, int *has) {
	MDB_val f, k;
	size_t i;
	int rc = kvd_filter_get(txn, filters, name, name_len, &f);
	*has = 0;
	if (rc || !f.mv_data) return rc;
	*has = 1;
	for (i = 0; i < n; keys += klens[i], i++) {
		k.mv_data = (void *)keys; k.mv_size = klens[i];
		mask[i] = (unsigned char)kvd_filter_may(&f, &k);
	}
	return 0;
}

// The filters a delete's search below consults (kvd_layer_filters): every layer's but the
// bottom's. A delete's keys are the base's (the removed files' rows a delta version takes
// away or replaces), so the bottom holds nearly every one an upper layer does not, and its
// filter rules out almost none of them. It would cost a cache miss a key all the same: the
// filter of a 10 M-key bottom is 12.5 MB, where an upper layer's (a delta's keys) stays in
// the cache. Side by side on a 10 M-row version whose chain is at its depth limit, 70 k keys
// a delta, medians of 12 deletes, four sets alternating: 0.0695 -> 0.0637 s, and 0.075 ->
// 0.069 s in a second session; a warm delta's load stage 0.160 -> 0.147 s (18 runs each). A
// lookup's or an ingest's keys may be absent (a new key): those keep the bottom's filter.
static int kvd_delete_filters(MDB_txn *txn, MDB_dbi filters, const char *names, const uint32_t *nlens, size_t n, MDB_val *out) {
	int rc = kvd_layer_filters(txn, filters, names, nlens, n, out);
	if (!rc && n) { out[n - 1].mv_data = NULL; out[n - 1].mv_size = 0; }
	return rc;
}

// A walk through a namespace's own tombstones in key order (kvd_tomb_walk), for puts
// checked in key order: the cursor stays on the page of the last key found, which LMDB's
// MDB_SET_RANGE searches first, so most checks search one page, not the tree from its root.
struct kvd_tomb_walk {
	MDB_cursor *cur;
	MDB_val at;  // the tombstone the cursor is on (state 1)
	int state;   // 0: not positioned, 1: on `at`, 2: past the last tombstone
};

// Whether k, not less than the key of the walk's previous call, is one of its tombstones.
static int kvd_tomb_walk(MDB_txn *txn, MDB_dbi own_tomb, struct kvd_tomb_walk *w, MDB_val *k, int *in) {
	MDB_val v;
	int rc, c;
	*in = 0;
	if (w->state == 2) return 0;
	if (w->state == 1 && (c = mdb_cmp(txn, own_tomb, &w->at, k)) >= 0) {
		*in = c == 0;
		return 0;
	}
	w->at = *k;
	rc = mdb_cursor_get(w->cur, &w->at, &v, MDB_SET_RANGE);
	if (rc == MDB_NOTFOUND) { w->state = 2; return 0; }
	if (rc) return rc;
	w->state = 1;
	*in = mdb_cmp(txn, own_tomb, &w->at, k) == 0;
	return 0;
}

// Whether the layers below a layered namespace hold each of m keys visibly
// (EmbeddedEngine._lookup_many), m at most KVD_SEARCH_CHUNK, in any order: found[i] is 1,
// and out[i] the value (valid until the transaction ends), when the first of data[0..n)
// that holds all[i] is not hidden by a tombstone of a newer one (every layer but the last
// has tombstones, tombs[0..n-1)). A layer whose filter (fbuf[j], when fbuf is not NULL)
// rules a key out is skipped for it. The keys go through the layers one after the other,
// each layer taking all the pending keys at once: its filter's block of every key is
// prefetched before any is probed (the bottom's filter is megabytes, a cache miss a key),
// the keys it lets through are searched in its data together (kvd_search_many), and those
// its data does not hold in its tombstones. A key a layer holds or deletes goes no further.
#define KVD_SEARCH_CHUNK 256
static int kvd_below_batch(MDB_txn *txn, const MDB_dbi *data, const MDB_dbi *tombs, const MDB_val *fbuf, size_t nbelow,
                           const MDB_val *all, size_t m, MDB_val *out, unsigned char *found) {
	MDB_val ask[KVD_SEARCH_CHUNK], got[KVD_SEARCH_CHUNK];
	size_t pending[KVD_SEARCH_CHUNK], asked[KVD_SEARCH_CHUNK];
	unsigned char hit[KVD_SEARCH_CHUNK], hashed[KVD_SEARCH_CHUNK];
	uint64_t hash[KVD_SEARCH_CHUNK];
	const unsigned char *block;
	size_t i, j, x, np, na, nt, keep;
	int rc, filtered;
	for (i = 0; i < m; i++) {
		pending[i] = i;
		hashed[i] = 0;
		found[i] = 0;
	}
	np = m;
	for (j = 0; j < nbelow && np; j++) {
		filtered = fbuf != NULL && fbuf[j].mv_data != NULL;
		if (filtered) {  // each key's hash once, whatever the layers checked
			for (i = 0; i < np; i++) {
				x = pending[i];
				if (!hashed[x]) { hash[x] = kvd_key_hash(all[x].mv_data, all[x].mv_size); hashed[x] = 1; }
				block = kvd_filter_block(fbuf[j].mv_data, hash[x]);
				__builtin_prefetch(block);
				__builtin_prefetch(block + 63);  // a block may straddle two lines
			}
		}
		na = keep = 0;
		for (i = 0; i < np; i++) {
			x = pending[i];
			if (filtered && !kvd_filter_may_hashed(&fbuf[j], hash[x])) {
				pending[keep++] = x;  // not in this layer: on to the next
				continue;
			}
			ask[na] = all[x];
			asked[na++] = x;
		}
		if (na && (rc = kvd_search_many(txn, data[j], ask, na, got, hit))) return rc;
		for (i = nt = 0; i < na; i++) {
			if (hit[i]) { out[asked[i]] = got[i]; found[asked[i]] = 1; }
			else { ask[nt] = ask[i]; asked[nt++] = asked[i]; }
		}
		// a key this layer neither holds nor deletes goes on to the next (the bottom has no tombstones)
		if (j + 1 < nbelow && nt) {
			if ((rc = kvd_search_many(txn, tombs[j], ask, nt, got, hit))) return rc;
			for (i = 0; i < nt; i++) {
				if (!hit[i]) pending[keep++] = asked[i];
			}
		}
		np = keep;
	}
	return 0;
}

// The next chunk of keys laid end to end (keys[at..], lengths klens) as MDB_vals in all: at
// most KVD_SEARCH_CHUNK of the n keys; returns how many, and moves *keys past them.
static size_t kvd_key_chunk(const char **keys, const uint32_t *klens, size_t at, size_t n, MDB_val *all) {
	size_t m = n - at < KVD_SEARCH_CHUNK ? n - at : KVD_SEARCH_CHUNK, i;
	for (i = 0; i < m; *keys += klens[at + i], i++) {
		all[i].mv_data = (void *)*keys; all[i].mv_size = klens[at + i];
	}
	return m;
}

// The layers below for n keys (laid end to end, ascending) in the caller's read
// transaction, KVD_SEARCH_CHUNK at a time (kvd_below_batch): found[i] is 1, and out[i] the
// value (valid until the transaction ends), when a layer holds keys[i] visibly. A delete of
// many keys runs this on several threads before its write transaction (Env.Delete), the
// layers below a LOADING namespace being sealed; it is a delete's search, so the bottom's
// filter is not consulted (kvd_delete_filters).
static int kvd_below_many(MDB_txn *txn, const MDB_dbi *data, const MDB_dbi *tombs, size_t nbelow, MDB_dbi filters,
                          const char *names, const uint32_t *nlens, MDB_val *fbuf,
                          const char *keys, const uint32_t *klens, size_t n, MDB_val *out, unsigned char *found) {
	MDB_val all[KVD_SEARCH_CHUNK];
	size_t at, m;
	int rc;
	if ((rc = kvd_delete_filters(txn, filters, names, nlens, nbelow, fbuf))) return rc;
	for (at = 0; at < n; at += m) {
		m = kvd_key_chunk(&keys, klens, at, n, all);
		if ((rc = kvd_below_batch(txn, data, tombs, fbuf, nbelow, all, m, &out[at], &found[at]))) return rc;
	}
	return 0;
}

// The puts an ingest found in none of its own tombstones (npend of them, pend[i] pointing
// into the staged runs), checked against the layers below at once (kvd_below_batch): one a
// layer below holds makes *repeated 1, the running digest inexact. *npend is 0 after.
static int kvd_ingest_below(MDB_txn *txn, const MDB_dbi *below_data, const MDB_dbi *below_tombs, const MDB_val *below_filters,
                            size_t nbelow, const MDB_val *pend, size_t *npend, int *repeated) {
	MDB_val out[KVD_SEARCH_CHUNK];
	unsigned char found[KVD_SEARCH_CHUNK];
	size_t i, n = *npend;
	int rc;
	*npend = 0;
	if (!n) return 0;
	if ((rc = kvd_below_batch(txn, below_data, below_tombs, below_filters, nbelow, pend, n, out, found))) return rc;
	for (i = 0; i < n; i++) {
		if (found[i]) { *repeated = 1; break; }
	}
	return 0;
}

// Ingest a LOADING namespace's staged runs: the rules of the Python engine's
// EmbeddedEngine.ingest. The runs are merged in key order (the newest run winning a
// repeated key, which makes the running digest inexact) into the namespace's data, with
// MDB_APPEND when it is empty (else put without overwriting, and overwritten where the key
// was there: inexact too). The merged data is committed every chunk_bytes, so the
// transaction's dirty pages (malloc'd by LMDB until it commits) stay bounded (10 M nested
// rows held 629 MiB in one transaction); the runs stay staged
// until the last chunk's transaction deletes them (those merged, not any staged meanwhile),
// so a crash between chunks leaves every run staged and part of the data written, which
// the next ingest (or the seal's) writes again over it, inexact. Each chunk's transaction
// first checks the version is still LOADING (else *outcome is KVD_NOT_LOADING and the
// caller hands the rest to the reference DAL); the caller runs one ingest at a time, so
// the runs read in the first transaction stay in the map until the last deletes them.
// *runs_out and *records_out are what was merged. A layered namespace (nbelow > 0: its
// tombstones own_tomb, the layers below it below_data and their tombstones below_tombs)
// checks whether each put hides a pair below that it has not deleted (kvd_tomb_walk,
// kvd_ingest_below).
static int kvd_ingest(MDB_env *env, MDB_dbi data, MDB_dbi stage, MDB_dbi states, MDB_dbi digests,
                      const char *name, size_t name_len, const char *writable, size_t writable_len,
                      MDB_dbi own_tomb, const MDB_dbi *below_data, const MDB_dbi *below_tombs, size_t nbelow,
                      MDB_dbi filters, const char *below_names, const uint32_t *below_nlens,
                      size_t chunk_bytes, uint64_t *runs_out, uint64_t *records_out, int *outcome) {
	MDB_txn *txn = NULL;
	MDB_cursor *cur = NULL, *dcur = NULL;
	MDB_val k, v;
	MDB_stat st;
	struct kvd_run *runs = NULL, **heap = NULL;
	MDB_val *below_filters = NULL;
	struct kvd_tomb_walk tombs = {0};
	MDB_val pend[KVD_SEARCH_CHUNK];  // puts to check against the layers below (kvd_ingest_below)
	size_t npend = 0;
	size_t nruns = 0, cap = 0, live, i;
	unsigned char *prefix = NULL;
	uint64_t records = 0, last_number = 0;
	size_t chunk = 0;
	unsigned int flags;
	int rc, repeated = 0;
	*outcome = KVD_STORED;
	*runs_out = *records_out = 0;
	if (!(prefix = malloc(name_len + 1))) return ENOMEM;
	memcpy(prefix, name, name_len);
	prefix[name_len] = 0;
	if (nbelow && !(below_filters = malloc(nbelow * sizeof *below_filters))) { rc = ENOMEM; goto done; }
	if ((rc = mdb_txn_begin(env, NULL, 0, &txn))) { txn = NULL; goto done; }
	if ((rc = kvd_check_writable(txn, states, name, name_len, writable, writable_len, outcome)) || *outcome != KVD_STORED) goto done;
	if (nbelow && (rc = kvd_layer_filters(txn, filters, below_names, below_nlens, nbelow, below_filters))) goto done;
	if ((rc = mdb_cursor_open(txn, stage, &cur))) goto done;
	k.mv_data = prefix; k.mv_size = name_len + 1;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		if (k.mv_size != name_len + 9 || memcmp(k.mv_data, prefix, name_len + 1) != 0) break;
		if (nruns == cap) {
			struct kvd_run *grown = realloc(runs, (cap = cap ? 2 * cap : 64) * sizeof *runs);
			if (!grown) { rc = ENOMEM; goto done; }
			runs = grown;
		}
		struct kvd_run *r = &runs[nruns];
		if (v.mv_size < 4) { rc = MDB_CORRUPTED; goto done; }
		memcpy(&r->left, v.mv_data, 4);
		r->at = (const unsigned char *)v.mv_data + 4;
		r->index = nruns++;
		last_number = kvd_run_number(&k, name_len);
	}
	if (rc && rc != MDB_NOTFOUND) goto done;
	if (nruns == 0) { rc = 0; goto done; }  // nothing staged: nothing to commit
	if (!(heap = malloc(nruns * sizeof *heap))) { rc = ENOMEM; goto done; }
	for (i = live = 0; i < nruns; i++) {
		if (runs[i].left) { kvd_run_load(&runs[i]); heap[live++] = &runs[i]; }
	}
	for (i = live / 2; i-- > 0;) kvd_sift_down(heap, live, i);
	if ((rc = mdb_stat(txn, data, &st))) goto done;
	flags = st.ms_entries == 0 ? MDB_APPEND : MDB_NOOVERWRITE;
	if ((rc = mdb_cursor_open(txn, data, &dcur))) goto done;
	if (nbelow && (rc = mdb_cursor_open(txn, own_tomb, &tombs.cur))) goto done;
	while (live) {
		struct kvd_run *r = heap[0];
		const unsigned char *key = r->at + 8, *val = key + r->klen;
		uint32_t klen = r->klen, vlen = r->vlen;
		uint64_t key8 = r->prefix;
		records++;
		// the next records with this key (newer runs): the last of them wins
		for (;;) {
			r->at = val + vlen;
			if (--r->left) { kvd_run_load(r); } else { heap[0] = heap[--live]; }
			if (live) kvd_sift_down(heap, live, 0);
			if (!live) break;
			r = heap[0];
			if (r->prefix != key8 || r->klen != klen || memcmp(r->at + 8, key, klen) != 0) break;
			key = r->at + 8; val = key + klen; vlen = r->vlen;
			repeated = 1;
			records++;
		}
		k.mv_data = (void *)key; k.mv_size = klen;
		v.mv_data = (void *)val; v.mv_size = vlen;
		rc = mdb_cursor_put(dcur, &k, &v, flags);
		if (rc == MDB_KEYEXIST && flags == MDB_NOOVERWRITE) {
			repeated = 1;
			v.mv_data = (void *)val; v.mv_size = vlen;  // MDB_NOOVERWRITE pointed v at the stored value
			rc = mdb_cursor_put(dcur, &k, &v, 0);
		}
		if (rc) goto done;
		if (nbelow && !repeated) {
			// a put hides a pair its bases hold that it has not deleted first (not in its own
			// tombstones): the running digest still counts that pair, so it becomes inexact.
			// Such puts are checked below KVD_SEARCH_CHUNK at a time, before each commit.
			int deleted;
			k.mv_data = (void *)key; k.mv_size = klen;
			if ((rc = kvd_tomb_walk(txn, own_tomb, &tombs, &k, &deleted))) goto done;
			if (!deleted) {
				pend[npend].mv_data = (void *)key; pend[npend++].mv_size = klen;
				if (npend == KVD_SEARCH_CHUNK &&
				    (rc = kvd_ingest_below(txn, below_data, below_tombs, below_filters, nbelow, pend, &npend, &repeated)))
					goto done;
			}
		}
		chunk += (size_t)klen + vlen;
		if (chunk >= chunk_bytes && live) {
			if ((rc = kvd_ingest_below(txn, below_data, below_tombs, below_filters, nbelow, pend, &npend, &repeated))) goto done;
			if (repeated && (rc = kvd_add_digest(txn, digests, name, name_len, 0, 0, 0, 0))) goto done;
			mdb_cursor_close(dcur); dcur = NULL;
			mdb_cursor_close(cur); cur = NULL;
			if (tombs.cur) { mdb_cursor_close(tombs.cur); tombs.cur = NULL; }
			rc = mdb_txn_commit(txn); txn = NULL;
			if (rc) goto done;
			if ((rc = mdb_txn_begin(env, NULL, 0, &txn))) { txn = NULL; goto done; }
			if ((rc = kvd_check_writable(txn, states, name, name_len, writable, writable_len, outcome)) || *outcome != KVD_STORED) goto done;
			// the filters are the same records, read again in this transaction
			if (nbelow && (rc = kvd_layer_filters(txn, filters, below_names, below_nlens, nbelow, below_filters))) goto done;
			if ((rc = mdb_cursor_open(txn, stage, &cur))) goto done;
			if ((rc = mdb_cursor_open(txn, data, &dcur))) goto done;
			if (nbelow) {
				tombs.state = 0;
				if ((rc = mdb_cursor_open(txn, own_tomb, &tombs.cur))) goto done;
			}
			chunk = 0;
		}
	}
	// delete the runs merged (the records read above are not used past this point)
	k.mv_data = prefix; k.mv_size = name_len + 1;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_GET_CURRENT)) {
		if (k.mv_size != name_len + 9 || memcmp(k.mv_data, prefix, name_len + 1) != 0) break;
		if (kvd_run_number(&k, name_len) > last_number) break;  // staged while this ingest ran: the next one merges it
		if ((rc = mdb_cursor_del(cur, 0))) goto done;
	}
	if (rc && rc != MDB_NOTFOUND && rc != EINVAL) goto done;
	if ((rc = kvd_ingest_below(txn, below_data, below_tombs, below_filters, nbelow, pend, &npend, &repeated))) goto done;
	if (repeated && (rc = kvd_add_digest(txn, digests, name, name_len, 0, 0, 0, 0))) goto done;
	mdb_cursor_close(dcur); dcur = NULL;
	mdb_cursor_close(cur); cur = NULL;
	if (tombs.cur) { mdb_cursor_close(tombs.cur); tombs.cur = NULL; }
	rc = mdb_txn_commit(txn); txn = NULL;
	if (rc == 0) { *runs_out = nruns; *records_out = records; }
done:
	if (tombs.cur) mdb_cursor_close(tombs.cur);
	if (dcur) mdb_cursor_close(dcur);
	if (cur) mdb_cursor_close(cur);
	if (txn) mdb_txn_abort(txn);
	free(runs); free(heap); free(prefix); free(below_filters);
	return rc;
}

#define KVD_STAGED 2
#define KVD_NOT_EMPTY 3

// A merged view of layers (newest first; data[i] and tombs[i] each, the last layer without
// tombstones when flat): every key one of them holds or deletes, in key order, with the
// newest such layer's word on it — its pair, or its tombstone (a layer's own pair wins over
// its own tombstone). The rules of the Python engine's EmbeddedEngine._overlay. Stream 2i is
// layer i's data, 2i + 1 its tombstones: of equal keys the lowest stream wins. The keys and
// values returned point into the map, valid while the transaction lasts and the layers are
// not written.
typedef struct {
	MDB_cursor **cur;
	MDB_val *keys, *vals;
	// order: the live streams by their keys, least first (of equal keys the lowest stream
	// first; live of them); moved: room for the streams a key moves on. alone is 1 when the
	// first stream's key is below every other's, 0 when another is at it too, -1 unknown.
	// A key from the first stream alone costs one compare (with the second's key), one from
	// several a binary search among the live streams per stream moved: a 10 M-record walk
	// through 8 layers spent 42 % of its time comparing keys with every stream's, twice.
	size_t *order, *moved;
	size_t live, streams;
	int alone;
} kvd_merged;

static void kvd_merged_close(kvd_merged *m) {
	size_t s;
	if (m->cur) { for (s = 0; s < m->streams; s++) if (m->cur[s]) mdb_cursor_close(m->cur[s]); }
	free(m->cur); free(m->keys); free(m->vals); free(m->order); free(m->moved);
	memset(m, 0, sizeof *m);
}

// memcmp order, the shorter first of two keys equal as far as it goes (LMDB's order),
// compared here eight bytes at a time and then byte by byte: keys are often a few bytes (an
// encoded integer), where a call to memcmp was most of the compare's cost.
static inline int kvd_key_cmp(const MDB_val *a, const MDB_val *b) {
	const unsigned char *x = a->mv_data, *y = b->mv_data;
	size_t l = a->mv_size < b->mv_size ? a->mv_size : b->mv_size, i = 0;
	uint64_t u, v;
	for (; i + 8 <= l; i += 8) {
		memcpy(&u, x + i, 8);
		memcpy(&v, y + i, 8);
		if (u != v) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
			u = __builtin_bswap64(u); // the bytes' order as a number's
			v = __builtin_bswap64(v);
#endif
			return u < v ? -1 : 1;
		}
	}
	for (; i < l; i++)
		if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
	return (a->mv_size > b->mv_size) - (a->mv_size < b->mv_size);
}

// Stream s (at its key) into order, after every live stream before it.
static void kvd_merged_insert(kvd_merged *m, size_t s) {
	size_t lo = 0, hi = m->live, mid;
	int c;
	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		c = kvd_key_cmp(&m->keys[m->order[mid]], &m->keys[s]);
		if (c < 0 || (c == 0 && m->order[mid] < s)) lo = mid + 1;
		else hi = mid;
	}
	memmove(m->order + lo + 1, m->order + lo, (m->live - lo) * sizeof *m->order);
	m->order[lo] = s;
	m->live++;
	m->alone = -1;
}

// A non-empty after (after_len bytes) starts the view past that key: every stream at its
// first key greater (the caller's key is read only during the call).
static int kvd_merged_open(MDB_txn *txn, const MDB_dbi *data, const MDB_dbi *tombs, size_t n, int flat,
                           const char *after, size_t after_len, kvd_merged *m) {
	size_t s;
	int rc;
	memset(m, 0, sizeof *m);
	m->streams = flat ? 2 * n - 1 : 2 * n;
	m->cur = calloc(m->streams, sizeof *m->cur);
	m->keys = calloc(m->streams, sizeof *m->keys);
	m->vals = calloc(m->streams, sizeof *m->vals);
	m->order = calloc(m->streams, sizeof *m->order);
	m->moved = calloc(m->streams, sizeof *m->moved);
	if (!m->cur || !m->keys || !m->vals || !m->order || !m->moved) { kvd_merged_close(m); return ENOMEM; }
	for (s = 0; s < m->streams; s++) {
		if ((rc = mdb_cursor_open(txn, s % 2 ? tombs[s / 2] : data[s / 2], &m->cur[s]))) { kvd_merged_close(m); return rc; }
		if (after_len) {
			m->keys[s].mv_data = (void *)after; m->keys[s].mv_size = after_len;
			rc = mdb_cursor_get(m->cur[s], &m->keys[s], &m->vals[s], MDB_SET_RANGE);
			if (rc == 0 && m->keys[s].mv_size == after_len && memcmp(m->keys[s].mv_data, after, after_len) == 0)
				rc = mdb_cursor_get(m->cur[s], &m->keys[s], &m->vals[s], MDB_NEXT);
		} else {
			rc = mdb_cursor_get(m->cur[s], &m->keys[s], &m->vals[s], MDB_FIRST);
		}
		if (rc && rc != MDB_NOTFOUND) { kvd_merged_close(m); return rc; }
		if (rc == 0) kvd_merged_insert(m, s);
	}
	return 0;
}

// The next key: *pair is 1 with its value in *v, or 0 where the newest word is a tombstone.
// MDB_NOTFOUND past the last key.
static int kvd_merged_next(kvd_merged *m, MDB_val *k, MDB_val *v, int *pair) {
	size_t best, g, i, s;
	int rc;
	if (!m->live) return MDB_NOTFOUND;
	best = m->order[0];
	*k = m->keys[best];
	*v = m->vals[best];
	*pair = best % 2 == 0;
	if (m->alone < 0) m->alone = m->live == 1 || kvd_key_cmp(&m->keys[m->order[1]], k) != 0;
	if (m->alone) {
		// the first stream alone holds the key: it moves on, first still while below the second
		rc = mdb_cursor_get(m->cur[best], &m->keys[best], &m->vals[best], MDB_NEXT);
		if (rc == 0 && (m->live == 1 || kvd_key_cmp(&m->keys[best], &m->keys[m->order[1]]) < 0)) return 0;
		if (rc && rc != MDB_NOTFOUND) return rc;
		m->live--;
		memmove(m->order, m->order + 1, m->live * sizeof *m->order);
		m->alone = -1;
		if (rc == 0) kvd_merged_insert(m, best);
		return 0;
	}
	// every stream at this key (the first g of order) moves past it (k points into a source
	// page, unchanged)
	for (g = 2; g < m->live && kvd_key_cmp(&m->keys[m->order[g]], k) == 0; g++) ;
	memcpy(m->moved, m->order, g * sizeof *m->order);
	m->live -= g;
	memmove(m->order, m->order + g, m->live * sizeof *m->order);
	m->alone = -1;
	for (i = 0; i < g; i++) {
		s = m->moved[i];
		rc = mdb_cursor_get(m->cur[s], &m->keys[s], &m->vals[s], MDB_NEXT);
		if (rc == MDB_NOTFOUND) continue;
		if (rc) return rc;
		kvd_merged_insert(m, s);
	}
	return 0;
}

// Up to max of the visible pairs next (tombstones skipped) into keys/vals; *got is how many,
// fewer than max only at the end.
static int kvd_merged_pairs(kvd_merged *m, size_t max, MDB_val *keys, MDB_val *vals, size_t *got) {
	int rc, pair;
	*got = 0;
	while (*got < max) {
		rc = kvd_merged_next(m, &keys[*got], &vals[*got], &pair);
		if (rc == MDB_NOTFOUND) return 0;
		if (rc) return rc;
		if (pair) (*got)++;
	}
	return 0;
}

// Up to max of the visible pairs next, copied into a page laid out column-wise: keys end to
// end into kbuf (kcap bytes) and their lengths into klens, values likewise into vbuf and
// vlens; *got pairs, *kused and *vused bytes. A pair that does not fit is left in *pk and
// *pv with *full 1 (the caller makes room and takes it); fewer than max pairs without it
// only at the end.
static int kvd_merged_page(kvd_merged *m, size_t max, char *kbuf, size_t kcap, uint32_t *klens,
                           char *vbuf, size_t vcap, uint32_t *vlens, size_t *got, size_t *kused, size_t *vused,
                           MDB_val *pk, MDB_val *pv, int *full) {
	MDB_val k, v;
	size_t n = 0, ku = 0, vu = 0;
	int rc = 0, pair;
	*full = 0;
	while (n < max) {
		rc = kvd_merged_next(m, &k, &v, &pair);
		if (rc == MDB_NOTFOUND) { rc = 0; break; }
		if (rc) break;
		if (!pair) continue;
		if (k.mv_size > kcap - ku || v.mv_size > vcap - vu) { *pk = k; *pv = v; *full = 1; break; }
		if (k.mv_size) memcpy(kbuf + ku, k.mv_data, k.mv_size);
		if (v.mv_size) memcpy(vbuf + vu, v.mv_data, v.mv_size);
		klens[n] = (uint32_t)k.mv_size;
		vlens[n] = (uint32_t)v.mv_size;
		ku += k.mv_size;
		vu += v.mv_size;
		n++;
	}
	*got = n; *kused = ku; *vused = vu;
	return rc;
}

// Merge layers into a LOADING version made from the layer below them (the merged view
// above, which copy_records builds in Python without this data plane): the newest word on
// each key goes to the version, its pair to the version's data or its tombstone to the
// version's tombstones, both appended, in one write transaction. flat: the last layer is
// the chain's bottom, with no tombstones (tombs has n - 1 handles) and nothing below, so the
// version is flat and a key deleted is simply not written (own_tomb unused). The version
// must be LOADING (else *outcome is KVD_NOT_LOADING) with empty data and tombstones (else
// KVD_NOT_EMPTY); nothing is written then. *merged_out is the keys written.
static int kvd_merge_layers(MDB_env *env, MDB_dbi states, const char *name, size_t name_len,
                            const char *writable, size_t writable_len, MDB_dbi own, MDB_dbi own_tomb,
                            const MDB_dbi *data, const MDB_dbi *tombs, size_t n, int flat,
                            const char *tombstone, size_t tombstone_len, uint64_t *merged_out, int *outcome) {
	MDB_txn *txn = NULL;
	MDB_cursor *put = NULL, *del = NULL;
	MDB_val k, v, tv;
	MDB_stat st;
	kvd_merged m;
	int rc, pair;
	uint64_t merged = 0;
	memset(&m, 0, sizeof m);
	*outcome = KVD_STORED;
	*merged_out = 0;
	if ((rc = mdb_txn_begin(env, NULL, 0, &txn))) { txn = NULL; goto done; }
	if ((rc = kvd_check_writable(txn, states, name, name_len, writable, writable_len, outcome)) || *outcome != KVD_STORED) goto done;
	if ((rc = mdb_stat(txn, own, &st))) goto done;
	if (st.ms_entries) { *outcome = KVD_NOT_EMPTY; goto done; }
	if (!flat) {
		if ((rc = mdb_stat(txn, own_tomb, &st))) goto done;
		if (st.ms_entries) { *outcome = KVD_NOT_EMPTY; goto done; }
	}
	if ((rc = kvd_merged_open(txn, data, tombs, n, flat, NULL, 0, &m))) goto done;
	if ((rc = mdb_cursor_open(txn, own, &put)) || (!flat && (rc = mdb_cursor_open(txn, own_tomb, &del)))) goto done;
	tv.mv_data = (void *)tombstone; tv.mv_size = tombstone_len;
	while ((rc = kvd_merged_next(&m, &k, &v, &pair)) == 0) {
		if (pair) rc = mdb_cursor_put(put, &k, &v, MDB_APPEND);
		else if (!flat) rc = mdb_cursor_put(del, &k, &tv, MDB_APPEND);
		else continue;
		if (rc) goto done;
		merged++;
	}
	if (rc != MDB_NOTFOUND) goto done;
	mdb_cursor_close(put); put = NULL;
	if (del) { mdb_cursor_close(del); del = NULL; }
	kvd_merged_close(&m);
	rc = mdb_txn_commit(txn); txn = NULL;
	if (rc == 0) *merged_out = merged;
done:
	if (put) mdb_cursor_close(put);
	if (del) mdb_cursor_close(del);
	kvd_merged_close(&m);
	if (txn) mdb_txn_abort(txn);
	return rc;
}

// The first half of a delete (EmbeddedEngine.delete_batch), in the caller's write
// transaction: the namespace must be LOADING with nothing staged (else *outcome says which,
// and the caller hands the delete to the reference DAL). For each key (ascending, once
// each): flags[i] bit 1 when the namespace's own data holds it, bit 2 when a layer below
// holds it visibly (it then gets a tombstone); out[i] the pair the delete takes away (its
// own, else the one below unless its own tombstone already hides it), NULL when none. With
// below_found (kvd_below_many's answers, searched beforehand), the layers below are not
// searched again: bit 4 of flags[i] then says the pair below is taken (out[i] is NULL);
// without, they are searched here, KVD_SEARCH_CHUNK keys at a time (kvd_below_batch).
static int kvd_delete_find(MDB_txn *txn, MDB_dbi states, MDB_dbi stage, const char *name, size_t name_len,
                           const char *writable, size_t writable_len, MDB_dbi own, MDB_dbi own_tomb,
                           const MDB_dbi *below_data, const MDB_dbi *below_tombs, size_t nbelow,
                           MDB_dbi filters, const char *below_names, const uint32_t *below_nlens, MDB_val *below_filters,
                           const char *keys, const uint32_t *klens, size_t n, const unsigned char *below_found,
                           MDB_val *out, unsigned char *flags, int *outcome) {
	MDB_cursor *cur;
	MDB_val k, v, all[KVD_SEARCH_CHUNK], below[KVD_SEARCH_CHUNK];
	unsigned char found[KVD_SEARCH_CHUNK];
	size_t at, m, i;
	int rc;
	const char *kp = keys;
	unsigned char *prefix;
	*outcome = KVD_STORED;
	if ((rc = kvd_check_writable(txn, states, name, name_len, writable, writable_len, outcome)) || *outcome != KVD_STORED) return rc;
	if (!(prefix = malloc(name_len + 1))) return ENOMEM;
	memcpy(prefix, name, name_len);
	prefix[name_len] = 0;
	if ((rc = mdb_cursor_open(txn, stage, &cur))) { free(prefix); return rc; }
	k.mv_data = prefix; k.mv_size = name_len + 1;
	rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
	if (rc == 0 && k.mv_size == name_len + 9 && memcmp(k.mv_data, prefix, name_len + 1) == 0) *outcome = KVD_STAGED;
	mdb_cursor_close(cur);
	free(prefix);
	if (rc && rc != MDB_NOTFOUND) return rc;
	if (*outcome != KVD_STORED) return 0;
	if (nbelow && !below_found && (rc = kvd_delete_filters(txn, filters, below_names, below_nlens, nbelow, below_filters))) return rc;
	for (at = 0; at < n; at += m) {
		m = kvd_key_chunk(&kp, klens, at, n, all);
		// the layers below, unless searched already (kvd_below_many: the caller has the pairs)
		if (nbelow && !below_found &&
		    (rc = kvd_below_batch(txn, below_data, below_tombs, below_filters, nbelow, all, m, below, found)))
			return rc;
		for (i = 0; i < m; i++) {
			size_t x = at + i;
			flags[x] = 0;
			out[x].mv_data = NULL; out[x].mv_size = 0;
			rc = mdb_get(txn, own, &all[i], &out[x]);
			if (rc == 0) flags[x] |= 1;
			else if (rc != MDB_NOTFOUND) return rc;
			if (!nbelow || !(below_found ? below_found[x] : found[i])) continue;
			flags[x] |= 2;
			if (flags[x] & 1) continue;
			rc = mdb_get(txn, own_tomb, &all[i], &v);
			if (rc == MDB_NOTFOUND) {
				if (below_found) flags[x] |= 4;  // the caller has the pair below
				else out[x] = below[i];
			} else if (rc) return rc;
		}
	}
	return 0;
}

// The second half: delete the own pairs, put the tombstones, take (dcount, dsum, dbytes)
// — the taken pairs' digest, negated modulo 2^64 — off the running digest, and commit.
// The transaction ends here whatever happens.
static int kvd_delete_apply(MDB_txn *txn, MDB_dbi own, MDB_dbi own_tomb, MDB_dbi digests,
                            const char *name, size_t name_len, const char *tombstone, size_t tombstone_len,
                            const char *keys, const uint32_t *klens, size_t n, const unsigned char *flags,
                            uint64_t dcount, uint64_t dsum, uint64_t dbytes) {
	MDB_val k, v;
	MDB_cursor *cur = NULL;
	size_t i;
	int rc = 0;
	unsigned int append = MDB_APPEND;  // the keys ascend: past the last tombstone, each is appended
	const char *kp = keys;
	if (own_tomb) rc = mdb_cursor_open(txn, own_tomb, &cur);  // 0: a flat version, no layer below
	for (i = 0; i < n && !rc; kp += klens[i], i++) {
		k.mv_data = (void *)kp; k.mv_size = klens[i];
		if (flags[i] & 1) rc = mdb_del(txn, own, &k, NULL);
		if (!rc && (flags[i] & 2)) {
			v.mv_data = (void *)tombstone; v.mv_size = tombstone_len;
			rc = mdb_cursor_put(cur, &k, &v, append);
			if (rc == MDB_KEYEXIST && append) {  // not past the last one: put where it belongs
				append = 0;
				v.mv_data = (void *)tombstone; v.mv_size = tombstone_len;
				rc = mdb_cursor_put(cur, &k, &v, 0);
			}
		}
	}
	if (cur) mdb_cursor_close(cur);
	if (!rc && dcount) rc = kvd_add_digest(txn, digests, name, name_len, dcount, dsum, dbytes, 1);
	if (rc) { mdb_txn_abort(txn); return rc; }
	return mdb_txn_commit(txn);
}

// Look n keys up (laid end to end in keys) in one call; out[i].mv_data is NULL when a key
// is missing. The values point into the map and are valid until the transaction ends. The
// keys are searched KVD_SEARCH_CHUNK at a time with kvd_search_many.
static int kvd_get_many(MDB_txn *txn, MDB_dbi dbi, const char *keys, const uint32_t *klens, size_t n, MDB_val *out) {
	MDB_val ask[KVD_SEARCH_CHUNK];
	unsigned char hit[KVD_SEARCH_CHUNK];
	size_t at, m, i;
	int rc;
	const char *kp = keys;
	for (at = 0; at < n; at += m) {
		m = kvd_key_chunk(&kp, klens, at, n, ask);
		if ((rc = kvd_search_many(txn, dbi, ask, m, &out[at], hit))) return rc;
		for (i = 0; i < m; i++) {
			if (!hit[i]) { out[at + i].mv_data = NULL; out[at + i].mv_size = 0; }
		}
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

// Create a named database if missing and put one record in another (for tests: the
// Python DAL creates the store's databases).
static int kvd_create_and_put(MDB_env *env, const char *name, MDB_dbi dbi, const char *k, size_t kl, const char *v, size_t vl) {
	MDB_txn *txn;
	MDB_dbi created;
	MDB_val key, val;
	int rc = mdb_txn_begin(env, NULL, 0, &txn);
	if (rc) return rc;
	if (name && (rc = mdb_dbi_open(txn, name, MDB_CREATE, &created))) { mdb_txn_abort(txn); return rc; }
	if (k) {
		key.mv_data = (void *)k; key.mv_size = kl;
		val.mv_data = (void *)v; val.mv_size = vl;
		if ((rc = mdb_put(txn, dbi, &key, &val, 0))) { mdb_txn_abort(txn); return rc; }
	}
	return mdb_txn_commit(txn);
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
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
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
	env *C.MDB_env
	mu  sync.Mutex // mdb_dbi_open must not run in two transactions at once
	// one ingest at a time: an ingest reads the runs in its first transaction and uses
	// them until its last, which deletes them (see kvd_ingest)
	ingestMu sync.Mutex
	// IngestChunkBytes is how much merged data an ingest commits at a time.
	IngestChunkBytes int
	dbis             map[string]DBI
	// what the writeback goroutine hands to the disk (see writeback)
	wrote   atomic.Bool  // a write has committed since the last tick
	writing atomic.Int32 // long writes (ingests, merges) running: they commit as they go
	stop    chan struct{}
	stopped chan struct{}
	closed  sync.Once
}

// WritebackEvery is how often the store's newly written pages are handed to the disk.
const WritebackEvery = 50 * time.Millisecond

// writeback starts the disk writing what the store's writes left in the page cache, every
// WritebackEvery while there is something new, on a goroutine of its own. A commit flushes
// its pages (MDB_NOMETASYNC, see Open), so without this a long write's pages — an ingest
// chunk of 64 MiB — would all be written by the flush at its commit, and the writer lock
// held meanwhile; started early, the writing overlaps the merge and the load instead (on
// a 2 M-row nested version, measured when commits were not flushed: the seal's fsync
// 0.25 s → 0.03 s). It changes no durability promise: what is durable is still what a
// flush has waited for, and a write error is still reported to the flush that follows it.
func (e *Env) writeback() {
	defer close(e.stopped)
	tick := time.NewTicker(WritebackEvery)
	defer tick.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-tick.C:
			if e.wrote.Swap(false) || e.writing.Load() > 0 {
				startWriteback(e)
			}
		}
	}
}

// startWriteback hands what the store's commits wrote to the disk (a variable for the tests).
var startWriteback = func(e *Env) { C.kvd_start_writeback(e.env) }

// long marks a write that commits as it goes (its pages are handed over at every tick
// while it runs); call the function it returns when the write ends.
func (e *Env) long() func() {
	e.writing.Add(1)
	return func() {
		e.writing.Add(-1)
		e.wrote.Store(true)
	}
}

// Open opens the store in dir, which must already hold one (the Python DAL creates it).
func Open(dir string, o Options) (*Env, error) {
	var env *C.MDB_env
	if err := check(C.mdb_env_create(&env)); err != nil {
		return nil, err
	}
	e := &Env{env: env, dbis: map[string]DBI{}, IngestChunkBytes: 64 << 20, stop: make(chan struct{}), stopped: make(chan struct{})}
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
	// MDB_NOMETASYNC, not MDB_NOSYNC: a commit's pages are on the disk before its meta page
	// is written, so a machine crash can undo the last commit but not damage the store (as
	// the Python engine opens it: bulldozer/kv/backends/embedded.py)
	flags := C.uint(C.MDB_NOMETASYNC | C.MDB_NORDAHEAD | C.MDB_NOTLS)
	if o.WriteMap {
		flags |= C.MDB_WRITEMAP
	}
	cdir := C.CString(dir)
	defer C.free(unsafe.Pointer(cdir))
	if err := check(C.mdb_env_open(env, cdir, flags, 0o644)); err != nil {
		C.mdb_env_close(env)
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	go e.writeback()
	return e, nil
}

// Close closes the environment (no transaction may be live); closing it again does nothing.
func (e *Env) Close() {
	e.closed.Do(func() {
		close(e.stop)
		<-e.stopped
		C.mdb_env_close(e.env)
	})
}

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

// StageBatch stages a batch of a LOADING namespace as one sorted run, growing its running
// digest (see kvd_stage_batch). loading is false, and nothing is written, when the
// namespace is not (or no longer) LOADING.
func (e *Env) StageBatch(stage, states, digests DBI, name string, b Batch, d Digest) (loading bool, err error) {
	var outcome C.int
	cname := []byte(name)
	writable := []byte(shared.StatesWritable) // the one state a version takes writes in
	rc := C.kvd_stage_batch(e.env, C.MDB_dbi(stage), C.MDB_dbi(states), C.MDB_dbi(digests),
		ptr(cname), C.size_t(len(cname)), ptr(writable), C.size_t(len(writable)),
		ptr(b.Keys), lens(b.KeyLengths), ptr(b.Values), lens(b.ValueLengths), C.size_t(len(b.KeyLengths)),
		C.uint64_t(d.Count), C.uint64_t(d.Sum), C.uint64_t(d.Bytes), &outcome)
	e.wrote.Store(true)
	if err := check(rc); err != nil {
		return false, err
	}
	return outcome == C.KVD_STORED, nil
}

// Layers are the databases a layered namespace's writes check against (the zero value for a
// namespace without a base): its tombstones, and the data and tombstones of the layers
// below it (bulldozer.kv.backends.embedded; every layer but the last has tombstones), with
// the layers' names and the database of their filters (0: none; see kvd_filter_build).
type Layers struct {
	Tombs       DBI
	Data, Below []DBI
	Names       []string
	Filters     DBI
}

// names are the layers' names laid end to end, and their lengths.
func (l Layers) names() ([]byte, []uint32) { return laidOut(l.Names) }

// laidOut are strings laid end to end, and their lengths (how the C code takes a list).
func laidOut(strs []string) ([]byte, []uint32) {
	var blob []byte
	lengths := make([]uint32, len(strs))
	for i, s := range strs {
		blob = append(blob, s...)
		lengths[i] = uint32(len(s))
	}
	return blob, lengths
}

func dbis(d []DBI) *C.MDB_dbi {
	if len(d) == 0 {
		return nil
	}
	return (*C.MDB_dbi)(unsafe.Pointer(&d[0]))
}

// Ingest merges a LOADING namespace's staged runs into its data in key order, in one
// transaction (see kvd_ingest): runs and records are what it merged. loading is false, and
// nothing is changed, when the namespace is not (or no longer) LOADING. A layered
// namespace's puts are checked against its layers (see kvd_ingest).
func (e *Env) Ingest(data, stage, states, digests DBI, name string, l Layers) (loading bool, runs, records uint64, err error) {
	e.ingestMu.Lock()
	defer e.ingestMu.Unlock()
	defer e.long()()
	var outcome C.int
	var cruns, crecords C.uint64_t
	cname := []byte(name)
	writable := []byte(shared.StatesWritable)
	names, nlens := l.names()
	rc := C.kvd_ingest(e.env, C.MDB_dbi(data), C.MDB_dbi(stage), C.MDB_dbi(states), C.MDB_dbi(digests),
		ptr(cname), C.size_t(len(cname)), ptr(writable), C.size_t(len(writable)),
		C.MDB_dbi(l.Tombs), dbis(l.Data), dbis(l.Below), C.size_t(len(l.Data)),
		C.MDB_dbi(l.Filters), ptr(names), lens(nlens),
		C.size_t(e.IngestChunkBytes), &cruns, &crecords, &outcome)
	if err := check(rc); err != nil {
		return false, 0, 0, err
	}
	return outcome == C.KVD_STORED, uint64(cruns), uint64(crecords), nil
}

// Delete deletes keys (laid end to end, ascending, once each) from a LOADING namespace in
// one write transaction, the rules of EmbeddedEngine.delete_batch: its own pairs go, a key
// a layer below holds visibly gets a tombstone, and the pairs taken away (hashed by a hash
// function newHash makes, one per goroutine) come off the running digest. ok is false, and
// nothing is changed, when the namespace is not LOADING or has staged runs (the reference
// DAL ingests them first). The goroutine holds its OS thread for the transaction, as LMDB
// requires of a write transaction.
//
// From DeleteSplitMin keys on, the layers below are searched first, before the write
// transaction, by one goroutine per core, each in a read transaction of its own: they are
// sealed, so what the write transaction would find there is the same. A search through a
// large bottom layer waits on memory for most of its time (about 1.5 us a key in a 10 M-row
// version), and a delta deletes tens of thousands of keys a call.
func (e *Env) Delete(own, stage, states, digests DBI, name string, l Layers, keys []byte, klens []uint32,
	newHash func() func(key, value []byte) uint64) (deleted uint64, ok bool, err error) {
	defer e.wrote.Store(true)
	n := len(klens)
	var below *belowPairs
	if len(l.Data) > 0 && n >= DeleteSplitMin {
		if below, err = e.searchBelow(l, keys, klens, newHash); err != nil {
			return 0, false, err
		}
	}
	cname := []byte(name)
	writable := []byte(shared.StatesWritable)
	tombstone := []byte(shared.StoreTombstone)
	out := (*C.MDB_val)(C.malloc(C.size_t(n+1) * C.size_t(unsafe.Sizeof(C.MDB_val{}))))
	defer C.free(unsafe.Pointer(out))
	flags := (*C.uchar)(C.malloc(C.size_t(n + 1)))
	defer C.free(unsafe.Pointer(flags))
	names, nlens := l.names()
	filters := (*C.MDB_val)(C.malloc(C.size_t(len(l.Data)+1) * C.size_t(unsafe.Sizeof(C.MDB_val{}))))
	defer C.free(unsafe.Pointer(filters))
	var found *C.uchar
	if below != nil {
		found = (*C.uchar)(unsafe.Pointer(&below.found[0]))
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var txn *C.MDB_txn
	if err := check(C.mdb_txn_begin(e.env, nil, 0, &txn)); err != nil {
		return 0, false, err
	}
	var outcome C.int
	rc := C.kvd_delete_find(txn, C.MDB_dbi(states), C.MDB_dbi(stage), ptr(cname), C.size_t(len(cname)),
		ptr(writable), C.size_t(len(writable)), C.MDB_dbi(own), C.MDB_dbi(l.Tombs),
		dbis(l.Data), dbis(l.Below), C.size_t(len(l.Data)), C.MDB_dbi(l.Filters), ptr(names), lens(nlens), filters,
		ptr(keys), lens(klens), C.size_t(n), found, out, flags, &outcome)
	if rc != 0 || outcome != C.KVD_STORED {
		C.mdb_txn_abort(txn)
		return 0, false, check(rc)
	}
	var d Digest
	var kp uint64
	hash := newHash()
	taken := unsafe.Slice((*byte)(unsafe.Pointer(flags)), n)
	for i, v := range unsafe.Slice(out, n) {
		kl := uint64(klens[i])
		switch {
		case v.mv_data != nil:
			value := unsafe.Slice((*byte)(v.mv_data), int(v.mv_size))
			d.Count--
			d.Sum -= hash(keys[kp:kp+kl], value)
			d.Bytes -= kl + uint64(len(value))
			deleted++
		case taken[i]&4 != 0: // the pair below, hashed by searchBelow
			d.Count--
			d.Sum -= below.hashes[i]
			d.Bytes -= below.sizes[i]
			deleted++
		}
		kp += kl
	}
	rc = C.kvd_delete_apply(txn, C.MDB_dbi(own), C.MDB_dbi(l.Tombs), C.MDB_dbi(digests), ptr(cname), C.size_t(len(cname)),
		ptr(tombstone), C.size_t(len(tombstone)), ptr(keys), lens(klens), C.size_t(n), flags,
		C.uint64_t(d.Count), C.uint64_t(d.Sum), C.uint64_t(d.Bytes))
	if err := check(rc); err != nil {
		return 0, false, err
	}
	return deleted, true, nil
}

// searchChunk is how many keys a delete's search below (searchPart) asks kvd_below_many
// for at a time, hashing the pairs they found before the next: those pairs' leaf pages are
// still in the cache (KVD_SEARCH_CHUNK, the keys it searches together). Hashed after the
// whole part, each value was read from memory again: on a 10 M-row version, 12 % of the
// data plane's time in a delta's deletes was that read (perf, runtime.memmove under the hash).
const searchChunk = C.KVD_SEARCH_CHUNK

// DeleteSplitMin is the fewest keys a Delete searches the layers below for on several
// goroutines (fewer are searched in its write transaction).
var DeleteSplitMin = 4096

// belowPairs are what the layers below a namespace hold visibly of a delete's keys: found[i]
// is 1 when they hold keys[i], and that pair's hash and size (key and value) then.
type belowPairs struct {
	found  []byte
	hashes []uint64
	sizes  []uint64
}

// searchBelow searches the layers below for keys, split into one contiguous part per
// core, each in a read transaction of its own (kvd_below_many), hashing the pairs found
// while the transaction holds them.
func (e *Env) searchBelow(l Layers, keys []byte, klens []uint32, newHash func() func(key, value []byte) uint64) (*belowPairs, error) {
	n := len(klens)
	b := &belowPairs{found: make([]byte, n), hashes: make([]uint64, n), sizes: make([]uint64, n)}
	parts := min(runtime.GOMAXPROCS(0), max(1, n/max(1, DeleteSplitMin/2)))
	names, nlens := l.names()
	errs := make([]error, parts)
	var wg sync.WaitGroup
	start, offset := 0, 0
	for p := range parts {
		end := n * (p + 1) / parts
		size := 0
		for _, kl := range klens[start:end] {
			size += int(kl)
		}
		if end > start {
			wg.Add(1)
			go func(p, start, end, offset int) {
				defer wg.Done()
				errs[p] = e.searchPart(l, names, nlens, keys[offset:offset+size], klens[start:end], b, start, newHash())
			}(p, start, end, offset)
		}
		start, offset = end, offset+size
	}
	wg.Wait()
	return b, errors.Join(errs...)
}

// searchPart is searchBelow's part from index first on: keys and klens are that part's.
func (e *Env) searchPart(l Layers, names []byte, nlens []uint32, keys []byte, klens []uint32, b *belowPairs, first int,
	hash func(key, value []byte) uint64) error {
	m := len(klens)
	out := (*C.MDB_val)(C.malloc(C.size_t(m) * C.size_t(unsafe.Sizeof(C.MDB_val{}))))
	defer C.free(unsafe.Pointer(out))
	fbuf := (*C.MDB_val)(C.malloc(C.size_t(len(l.Data)+1) * C.size_t(unsafe.Sizeof(C.MDB_val{}))))
	defer C.free(unsafe.Pointer(fbuf))
	found := b.found[first : first+m]
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var txn *C.MDB_txn
	if err := check(C.mdb_txn_begin(e.env, nil, C.MDB_RDONLY, &txn)); err != nil {
		return err
	}
	defer C.mdb_txn_abort(txn)
	outs := unsafe.Slice(out, m)
	var kp uint64
	for at := 0; at < m; at += searchChunk { // each chunk's pairs hashed while their leaves are in the cache
		end := min(m, at+searchChunk)
		rc := C.kvd_below_many(txn, dbis(l.Data), dbis(l.Below), C.size_t(len(l.Data)), C.MDB_dbi(l.Filters),
			ptr(names), lens(nlens), fbuf, ptr(keys[kp:]), lens(klens[at:end]), C.size_t(end-at), &outs[at],
			(*C.uchar)(unsafe.Pointer(&found[at])))
		if err := check(rc); err != nil {
			return err
		}
		for i := at; i < end; i++ {
			kl := uint64(klens[i])
			if found[i] != 0 {
				value := unsafe.Slice((*byte)(outs[i].mv_data), int(outs[i].mv_size))
				b.hashes[first+i] = hash(keys[kp:kp+kl], value)
				b.sizes[first+i] = kl + uint64(len(value))
			}
			kp += kl
		}
	}
	return nil
}

// MergeLayers writes into the LOADING version name (its data own and tombstones ownTomb,
// both empty) what the layers data/tombs (newest first) change over the layer below them,
// in one write transaction (see kvd_merge_layers): merged is the keys written. With one
// tombstone handle fewer than data handles, the last layer is the chain's bottom: the
// version comes out flat (every visible pair, no tombstones; ownTomb is not used). loading
// is false, and nothing is written, when the version is not LOADING; an error when its data
// or tombstones are not empty.
func (e *Env) MergeLayers(states DBI, name string, own, ownTomb DBI, data, tombs []DBI) (loading bool, merged uint64, err error) {
	cflat, err := flatness(data, tombs)
	if err != nil {
		return false, 0, err
	}
	defer e.long()()
	cname := []byte(name)
	writable := []byte(shared.StatesWritable)
	tombstone := []byte(shared.StoreTombstone)
	var outcome C.int
	var n C.uint64_t
	rc := C.kvd_merge_layers(e.env, C.MDB_dbi(states), ptr(cname), C.size_t(len(cname)), ptr(writable), C.size_t(len(writable)),
		C.MDB_dbi(own), C.MDB_dbi(ownTomb), dbis(data), dbis(tombs), C.size_t(len(data)), cflat,
		ptr(tombstone), C.size_t(len(tombstone)), &n, &outcome)
	if err := check(rc); err != nil {
		return false, 0, err
	}
	if outcome == C.KVD_NOT_EMPTY {
		return true, 0, fmt.Errorf("version %s already holds records or tombstones", name)
	}
	return outcome == C.KVD_STORED, uint64(n), nil
}

// flatness is kvd_merged_open's flat for layers' handles: 1 with one tombstone handle fewer
// than data handles (the last layer is the chain's bottom), 0 with as many; else an error.
func flatness(data, tombs []DBI) (C.int, error) {
	switch {
	case len(data) > 0 && len(tombs) == len(data)-1:
		return 1, nil
	case len(data) > 0 && len(tombs) == len(data):
		return 0, nil
	}
	return 0, fmt.Errorf("%d layers' data but %d layers' tombstones", len(data), len(tombs))
}

// openMerged opens m, the merged view of VisiblePairs, in a read transaction of its own
// that first (when not nil) looks at first; end closes both.
func (e *Env) openMerged(data, tombs []DBI, after []byte, first func(*Txn) error, m *C.kvd_merged) (end func(), err error) {
	cflat, err := flatness(data, tombs)
	if err != nil {
		return nil, err
	}
	txn, err := e.BeginRead()
	if err != nil {
		return nil, err
	}
	if first != nil {
		if err := first(txn); err != nil {
			txn.Abort()
			return nil, err
		}
	}
	if err := check(C.kvd_merged_open(txn.txn, dbis(data), dbis(tombs), C.size_t(len(data)), cflat,
		ptr(after), C.size_t(len(after)), m)); err != nil {
		txn.Abort()
		return nil, err
	}
	return func() { C.kvd_merged_close(m); txn.Abort() }, nil
}

// Buffers lends pages their blobs: Get is a buffer of at least size bytes (its length
// size), Put takes one back (a mem.BufferPool's methods).
type Buffers interface {
	Get(size int) *[]byte
	Put(buf *[]byte)
}

// A Page is pairs laid out column-wise: keys end to end in Keys (its length the bytes the
// page holds) and their lengths, values likewise; Keys and Values are buffers of the
// Buffers the page was read with, its owner's to hand back.
type Page struct {
	Keys, Values             *[]byte
	KeyLengths, ValueLengths []uint32
}

// pageSample is how many pairs VisiblePage copies before it sizes the rest of the page
// from them: a page regrown as it filled made a scan of 10 M records 3.3 s, against 2.4 s.
const pageSample = 1024

// VisiblePage is up to limit (at least 1) of the pairs VisiblePairs sees past after, copied
// out of the map into one page in the walk itself (no slice per pair, no call per batch),
// its blobs from pool. They are sized from the first pairs, up to a message's worth
// (shared.LimitsMaxMessageBytes), and grow when a pair does not fit.
func (e *Env) VisiblePage(data, tombs []DBI, after []byte, limit int, first func(*Txn) error, pool Buffers) (*Page, error) {
	var m C.kvd_merged
	end, err := e.openMerged(data, tombs, after, first, &m)
	if err != nil {
		return nil, err
	}
	defer end()
	sample := min(limit, pageSample)
	keys, values := pool.Get(32*sample), pool.Get(64*sample)
	*keys, *values = (*keys)[:cap(*keys)], (*values)[:cap(*values)]
	page := &Page{Keys: keys, Values: values, KeyLengths: make([]uint32, limit), ValueLengths: make([]uint32, limit)}
	got, ku, vu := 0, 0, 0
	for got < limit {
		want := limit - got
		if got < sample {
			want = sample - got
		}
		var n, kn, vn C.size_t
		var pk, pv C.MDB_val
		var full C.int
		rc := C.kvd_merged_page(&m, C.size_t(want), ptr((*keys)[ku:]), C.size_t(len(*keys)-ku), lens(page.KeyLengths[got:]),
			ptr((*values)[vu:]), C.size_t(len(*values)-vu), lens(page.ValueLengths[got:]), &n, &kn, &vn, &pk, &pv, &full)
		if err := check(rc); err != nil {
			pool.Put(keys)
			pool.Put(values)
			return nil, err
		}
		got, ku, vu = got+int(n), ku+int(kn), vu+int(vn)
		if full != 0 { // room for the pair left over, and it
			k := unsafe.Slice((*byte)(pk.mv_data), int(pk.mv_size))
			v := unsafe.Slice((*byte)(pv.mv_data), int(pv.mv_size))
			keys, values = grown(pool, keys, ku, len(k)), grown(pool, values, vu, len(v))
			ku += copy((*keys)[ku:], k)
			vu += copy((*values)[vu:], v)
			page.KeyLengths[got], page.ValueLengths[got] = uint32(len(k)), uint32(len(v))
			got++
		} else if int(n) < want {
			break // the end
		}
		if got == sample && limit > sample { // the rest of the page at the sample's sizes
			keys = grown(pool, keys, ku, min(ku*(limit-got)/got, shared.LimitsMaxMessageBytes))
			values = grown(pool, values, vu, min(vu*(limit-got)/got, shared.LimitsMaxMessageBytes))
		}
	}
	*keys, *values = (*keys)[:ku], (*values)[:vu]
	page.Keys, page.Values = keys, values
	page.KeyLengths, page.ValueLengths = page.KeyLengths[:got], page.ValueLengths[:got]
	return page, nil
}

// grown is buf with room for more bytes past its first used: itself when it has it, else a
// buffer of pool at least twice as long holding its used bytes (buf goes back to pool).
func grown(pool Buffers, buf *[]byte, used, more int) *[]byte {
	if len(*buf)-used >= more {
		return buf
	}
	out := pool.Get(max(2*len(*buf), used+more))
	*out = (*out)[:cap(*out)]
	copy(*out, (*buf)[:used])
	pool.Put(buf)
	return out
}

// VisiblePairs calls fn with every pair a read through layers (data/tombs, newest first,
// as the merged view in kvd_merged_open takes them: with one tombstone handle fewer, the last
// layer is the chain's bottom) sees, in key order, a batch at a time, in one read
// transaction: a consistent snapshot, which first (when not nil) looks at first. It starts
// past the key after (from the first key when after is empty) and stops after limit pairs
// (0: at the end). The slices point into the map and are valid only during the call;
// first's or fn's error stops the walk and is returned.
func (e *Env) VisiblePairs(data, tombs []DBI, after []byte, limit int, first func(*Txn) error, fn func(keys, values [][]byte) error) error {
	var m C.kvd_merged
	end, err := e.openMerged(data, tombs, after, first, &m)
	if err != nil {
		return err
	}
	defer end()
	const batch = 1024
	ks := (*[batch]C.MDB_val)(C.malloc(C.size_t(batch) * C.size_t(unsafe.Sizeof(C.MDB_val{}))))
	defer C.free(unsafe.Pointer(ks))
	vs := (*[batch]C.MDB_val)(C.malloc(C.size_t(batch) * C.size_t(unsafe.Sizeof(C.MDB_val{}))))
	defer C.free(unsafe.Pointer(vs))
	keys, values := make([][]byte, batch), make([][]byte, batch)
	for left := limit; ; left -= batch {
		want := batch
		if limit > 0 && left < batch {
			want = left
		}
		var got C.size_t
		if err := check(C.kvd_merged_pairs(&m, C.size_t(want), &ks[0], &vs[0], &got)); err != nil {
			return err
		}
		n := int(got)
		for i := 0; i < n; i++ {
			keys[i] = unsafe.Slice((*byte)(ks[i].mv_data), int(ks[i].mv_size))
			values[i] = unsafe.Slice((*byte)(vs[i].mv_data), int(vs[i].mv_size))
		}
		if n > 0 {
			if err := fn(keys[:n], values[:n]); err != nil {
				return err
			}
		}
		if n < want || limit > 0 && left <= batch {
			return nil // the end, or limit pairs
		}
	}
}

// The outcomes of BuildFilter.
const (
	FilterNotBuilt = iota // the layer is not readable (or is gone), or has a filter already
	FilterBuilt
	FilterTooLarge // more keys than maxEntries: it gets none
)

// BuildFilter builds and stores the key filter of the layer name (its data and its
// tombstones, tomb 0 when it has none) in one write transaction, if it is readable
// (shared.StatesReadable), has none yet and holds at most maxEntries keys (see
// kvd_filter_build).
func (e *Env) BuildFilter(filters, states DBI, name string, data, tomb DBI, maxEntries uint64) (int, error) {
	defer e.wrote.Store(true)
	readable, rlens := laidOut(shared.StatesReadable)
	var entries C.MDB_stat
	if txn, err := e.BeginRead(); err == nil { // the size first: no write transaction for a layer too large
		rc := C.mdb_stat(txn.txn, C.MDB_dbi(data), &entries)
		n := uint64(entries.ms_entries)
		if rc == 0 && tomb != 0 {
			rc = C.mdb_stat(txn.txn, C.MDB_dbi(tomb), &entries)
			n += uint64(entries.ms_entries)
		}
		txn.Abort()
		if err := check(rc); err != nil {
			return FilterNotBuilt, err
		}
		if n > maxEntries {
			return FilterTooLarge, nil
		}
	}
	cname := []byte(name)
	var built C.int
	rc := C.kvd_filter_build(e.env, C.MDB_dbi(filters), C.MDB_dbi(states), ptr(cname), C.size_t(len(cname)),
		ptr(readable), lens(rlens), C.size_t(len(rlens)), C.MDB_dbi(data), C.MDB_dbi(tomb), C.uint64_t(maxEntries), &built)
	if err := check(rc); err != nil {
		return FilterNotBuilt, err
	}
	if built != 0 {
		return FilterBuilt, nil
	}
	return FilterNotBuilt, nil
}

// HasFilter is whether the layer name has a stored key filter.
func (t *Txn) HasFilter(filters DBI, name string) (bool, error) {
	var f C.MDB_val
	cname := []byte(name)
	if err := check(C.kvd_filter_get(t.txn, C.MDB_dbi(filters), ptr(cname), C.size_t(len(cname)), &f)); err != nil {
		return false, err
	}
	return f.mv_data != nil, nil
}

// FilterMask is, for each key (laid end to end), whether the layer name's filter lets it
// be in that layer; ok is false when the layer has no filter.
func (t *Txn) FilterMask(filters DBI, name string, keys []byte, klens []uint32) (mask []byte, ok bool, err error) {
	n := len(klens)
	if n == 0 || filters == 0 {
		return nil, false, nil
	}
	cmask := (*C.uchar)(C.malloc(C.size_t(n)))
	defer C.free(unsafe.Pointer(cmask))
	cname := []byte(name)
	var has C.int
	if err := check(C.kvd_filter_mask(t.txn, C.MDB_dbi(filters), ptr(cname), C.size_t(len(cname)),
		ptr(keys), lens(klens), C.size_t(n), cmask, &has)); err != nil || has == 0 {
		return nil, false, err
	}
	return C.GoBytes(unsafe.Pointer(cmask), C.int(n)), true, nil
}

// createDB creates the named database (tests only: the Python DAL creates the store).
func (e *Env) createDB(name string) error {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return check(C.kvd_create_and_put(e.env, cname, 0, nil, 0, nil, 0))
}

// put writes one record (tests only).
func (e *Env) put(dbi DBI, key, value []byte) error {
	return check(C.kvd_create_and_put(e.env, nil, C.MDB_dbi(dbi), ptr(key), C.size_t(len(key)), ptr(value), C.size_t(len(value))))
}

// depth is the height of dbi's B-tree (tests only: a search through branch pages).
func (t *Txn) depth(dbi DBI) (int, error) {
	var st C.MDB_stat
	if err := check(C.mdb_stat(t.txn, C.MDB_dbi(dbi), &st)); err != nil {
		return 0, err
	}
	return int(st.ms_depth), nil
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
