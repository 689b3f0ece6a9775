// LMDB, compiled here in one unit with the data plane's search of many keys, which reads
// LMDB's pages as LMDB's own search does (its cursor, page and node internals are private
// to mdb.c). scripts/build_native.sh puts LMDB's sources in c/, where the Go tool does not
// compile them on their own.
#include "c/mdb.c"
#include "search.h"

// How many keys' searches kvd_search_many overlaps.
#define KVD_SEARCH_GROUP 16

// mdb_get for n keys of one database (found[i] 1 and out[i] its value, valid until the
// transaction ends, when it holds keys[i]), KVD_SEARCH_GROUP keys at a time: each key's
// search goes down the branch pages to its leaf page's address first, without reading the
// leaf, and every line of that leaf is prefetched; then the group's leaves are searched.
// The branch pages near the root are in the cache, the leaves mostly not (a key a few
// thousand leaves away from the last): one search at a time waited for each leaf's lines in
// turn (its header, its node offsets, then node after node of the binary search, and the
// page's translation), where the group's misses now overlap. Measured on the bottom of a
// 10 M-row version (127 k leaf pages, depth 4), 70 k keys sorted, one thread, caches
// flushed before each pass: 0.049-0.052 s with mdb_get, 0.026-0.027 s here; 8 and 32 keys
// a group as fast as 16, prefetching only the leaf's first four lines 0.036 s.
// A database of duplicate keys (MDB_DUPSORT), which the data plane does not make, is
// searched with mdb_get.
int kvd_search_many(MDB_txn *txn, MDB_dbi dbi, const MDB_val *keys, size_t n, MDB_val *out, unsigned char *found) {
	MDB_cursor mc[KVD_SEARCH_GROUP];
	MDB_val key;
	MDB_page *mp;
	MDB_node *node;
	size_t at, g, j, off, psize;
	int rc, exact, depth;
	indx_t i;
	if (!TXN_DBI_EXIST(txn, dbi, DB_USRVALID)) return EINVAL;
	if (txn->mt_flags & MDB_TXN_BLOCKED) return MDB_BAD_TXN;
	if (txn->mt_dbs[dbi].md_flags & MDB_DUPSORT) {
		for (at = 0; at < n; at++) {
			key = keys[at];
			rc = mdb_get(txn, dbi, &key, &out[at]);
			if (rc && rc != MDB_NOTFOUND) return rc;
			found[at] = rc == 0;
		}
		return 0;
	}
	psize = txn->mt_env->me_psize;
	for (at = 0; at < n; at += g) {
		g = n - at < KVD_SEARCH_GROUP ? n - at : KVD_SEARCH_GROUP;
		for (j = 0; j < g; j++) {
			MDB_cursor *m = &mc[j];
			key = keys[at + j];
			found[at + j] = 0;
			mdb_cursor_init(m, txn, dbi, NULL);
			rc = mdb_page_search(m, &key, MDB_PS_ROOTONLY);  // the root, the tree refreshed if stale
			if (rc == MDB_NOTFOUND) { m->mc_snum = 0; continue; }  // an empty database
			if (rc) return rc;
			depth = m->mc_db->md_depth;
			mp = m->mc_pg[0];
			// as mdb_page_search_root, to the leaf's address (mdb_page_get reads no page)
			while (m->mc_snum < depth) {
				if (!IS_BRANCH(mp)) return MDB_CORRUPTED;
				node = mdb_node_search(m, &key, &exact);
				if (node == NULL) i = NUMKEYS(mp) - 1;
				else {
					i = m->mc_ki[m->mc_top];
					if (!exact) {
						if (i == 0) return MDB_CORRUPTED;
						i--;
					}
				}
				node = NODEPTR(mp, i);
				if ((rc = mdb_page_get(m, NODEPGNO(node), &mp, NULL))) return rc;
				m->mc_ki[m->mc_top] = i;
				if ((rc = mdb_cursor_push(m, mp))) return rc;
			}
			for (off = 0; off < psize; off += 64) __builtin_prefetch((const char *)mp + off);
		}
		for (j = 0; j < g; j++) {
			MDB_cursor *m = &mc[j];
			if (m->mc_snum == 0) continue;
			mp = m->mc_pg[m->mc_top];
			if (!IS_LEAF(mp) || IS_LEAF2(mp)) return MDB_CORRUPTED;
			key = keys[at + j];
			exact = 0;
			node = mdb_node_search(m, &key, &exact);
			if (node == NULL || !exact) continue;
			if ((rc = mdb_node_read(m, node, &out[at + j]))) return rc;
			found[at + j] = 1;
		}
	}
	return 0;
}
