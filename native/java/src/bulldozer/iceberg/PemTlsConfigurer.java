package bulldozer.iceberg;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.net.ssl.KeyManager;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManager;
import javax.net.ssl.TrustManagerFactory;
import org.apache.iceberg.rest.auth.TLSConfigurer;

/**
 * TLS for Iceberg's Java REST client as pyiceberg's REST catalog takes it, from the same
 * catalog properties (Bulldozer gives pyiceberg them as its {@code ssl} settings):
 *
 * <ul>
 *   <li>{@code ssl.cabundle}: a PEM file of the certificates that alone are trusted (as
 *       requests' {@code verify} takes it); without it, the JVM's default trust;
 *   <li>{@code ssl.client.cert}, {@code ssl.client.key}: the client's certificate (PEM, its
 *       chain after it) and its private key (PEM, PKCS #8, unencrypted; in the certificate's
 *       file where no key file is named), for a server asking for one.
 * </ul>
 *
 * <p>Iceberg calls {@link #initialize} with the catalog's properties when it builds the REST
 * client ({@code rest.client.tls.configurer-impl}); any file that cannot be read fails it.
 * Hostnames are verified as by default.
 */
public class PemTlsConfigurer implements TLSConfigurer {
  public static final String CA_BUNDLE = "ssl.cabundle";
  public static final String CLIENT_CERT = "ssl.client.cert";
  public static final String CLIENT_KEY = "ssl.client.key";

  private static final Pattern CERTIFICATE =
      Pattern.compile("-----BEGIN CERTIFICATE-----([A-Za-z0-9+/=\\s]+)-----END CERTIFICATE-----");
  private static final Pattern PRIVATE_KEY =
      Pattern.compile("-----BEGIN PRIVATE KEY-----([A-Za-z0-9+/=\\s]+)-----END PRIVATE KEY-----");

  private SSLContext context;

  @Override
  public void initialize(Map<String, String> properties) {
    try {
      TrustManager[] trust = null; // the JVM's default
      String bundle = properties.get(CA_BUNDLE);
      if (bundle != null) {
        KeyStore trusted = emptyStore();
        int n = 0;
        for (Certificate cert : certificates(bundle)) {
          trusted.setCertificateEntry("ca-" + n++, cert);
        }
        TrustManagerFactory factory = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        factory.init(trusted);
        trust = factory.getTrustManagers();
      }
      KeyManager[] keys = null; // none: no client certificate
      String cert = properties.get(CLIENT_CERT);
      if (cert != null) {
        String key = properties.getOrDefault(CLIENT_KEY, cert); // else in the certificate's file
        List<Certificate> chain = certificates(cert);
        KeyStore identity = emptyStore();
        char[] none = new char[0];
        identity.setKeyEntry("client", privateKey(key), none, chain.toArray(new Certificate[0]));
        KeyManagerFactory factory = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
        factory.init(identity, none);
        keys = factory.getKeyManagers();
      }
      context = SSLContext.getInstance("TLS");
      context.init(keys, trust, null);
    } catch (IOException | GeneralSecurityException e) {
      throw new IllegalArgumentException("the REST catalog's TLS settings: " + e, e);
    }
  }

  @Override
  public SSLContext sslContext() {
    return context;
  }

  private static KeyStore emptyStore() throws IOException, GeneralSecurityException {
    KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
    store.load(null, null);
    return store;
  }

  /** The certificates of a PEM file, in order (its other blocks, a private key, left alone). */
  private static List<Certificate> certificates(String path) throws IOException, GeneralSecurityException {
    CertificateFactory factory = CertificateFactory.getInstance("X.509");
    List<Certificate> found = new ArrayList<>();
    Matcher pem = CERTIFICATE.matcher(Files.readString(Path.of(path)));
    while (pem.find()) {
      byte[] der = Base64.getMimeDecoder().decode(pem.group(1));
      found.add(factory.generateCertificate(new ByteArrayInputStream(der)));
    }
    if (found.isEmpty()) {
      throw new GeneralSecurityException(path + " holds no PEM certificate");
    }
    return found;
  }

  private static PrivateKey privateKey(String path) throws IOException, GeneralSecurityException {
    Matcher pem = PRIVATE_KEY.matcher(Files.readString(Path.of(path)));
    if (!pem.find()) {
      throw new GeneralSecurityException(path + " holds no unencrypted PKCS #8 private key");
    }
    PKCS8EncodedKeySpec spec = new PKCS8EncodedKeySpec(Base64.getMimeDecoder().decode(pem.group(1)));
    GeneralSecurityException last = null;
    for (String algorithm : new String[] {"RSA", "EC", "Ed25519", "Ed448"}) {
      try {
        return KeyFactory.getInstance(algorithm).generatePrivate(spec);
      } catch (GeneralSecurityException e) {
        last = e;
      }
    }
    throw last;
  }
}
