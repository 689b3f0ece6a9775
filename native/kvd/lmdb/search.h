// The data plane's searches compiled with LMDB (search.c).
#ifndef KVD_SEARCH_H
#define KVD_SEARCH_H

#include <stddef.h>
#include "lmdb.h"

int kvd_search_many(MDB_txn *txn, MDB_dbi dbi, const MDB_val *keys, size_t n, MDB_val *out, unsigned char *found);

#endif
