// Hive's metastore server, its transaction tables (NEXT_LOCK_ID, HIVE_LOCKS, ...) made
// first: the metastore's own schema creation (DataNucleus) leaves them out, and a table's
// commit takes a lock in them (pyiceberg's and Iceberg's Hive catalogs both do). Hive's
// schematool would run its SQL scripts, which the pyspark wheel's jars do not carry. Run as
// a single-file program: java -cp JARS Metastore.java -p PORT.
public class Metastore {
  public static void main(String[] args) throws Throwable {
    org.apache.hadoop.hive.metastore.txn.TxnDbUtil.prepDb(new org.apache.hadoop.hive.conf.HiveConf());
    org.apache.hadoop.hive.metastore.HiveMetaStore.main(args);
  }
}
