package org.apache.iceberg.rest.auth;

/**
 * What {@code bulldozer.iceberg.PemTlsConfigurer} is compiled against: the methods it
 * overrides of Iceberg's interface of this name (in iceberg-spark-runtime, which the driver
 * gets at run time; its other methods keep their defaults there). Only for the compiler: the
 * jar holds Bulldozer's classes alone. That the two agree is tested by loading a table over
 * TLS through Iceberg's own REST client (tests/integration/test_lakehouse.py).
 */
public interface TLSConfigurer {
  default void initialize(java.util.Map<String, String> properties) {}

  default javax.net.ssl.SSLContext sslContext() {
    return null;
  }
}
