"""A REST catalog's TLS settings: the certificates a catalog served over HTTPS is trusted by
(a private certificate authority's), and the client certificate it asks for (mutual TLS).

``BULLDOZER_CATALOGS`` holds a catalog's settings as strings, so they are flat keys:

- ``ssl.cabundle``: a PEM file of the certificates that alone are trusted for the catalog
  (as requests' ``verify`` takes one); without it, the system's usual trust;
- ``ssl.client.cert``: a PEM file of the client's certificate (its chain after it), and
  ``ssl.client.key`` its private key (PEM, unencrypted; in the certificate's file where
  none is given).

pyiceberg takes them as its REST catalog's ``ssl`` setting (``{"cabundle": …, "client":
{"cert": …, "key": …}}``, ``pyiceberg_ssl``); Iceberg's Java REST client, which the Spark
engine's reader opens the table with, through ``bulldozer.iceberg.PemTlsConfigurer``
(``native/java``), which reads the same keys from the catalog's properties (a test holds
the Java class's names to ``SETTINGS``). Every file is checked before a run reads anything
(``check``), as Python's TLS would load it: one that is missing, does not parse, a key that
is not the certificate's, or an encrypted key — OpenSSL would ask for its passphrase on the
terminal, which a scheduler's task never answers — is refused in one line. So is any other
``ssl.*`` key, and a TLS setting on a catalog that is not REST: neither library would read
it."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from bulldozer.errors import CatalogError

__all__ = [
    "CA_BUNDLE",
    "CLIENT_CERT",
    "CLIENT_KEY",
    "SETTINGS",
    "check",
    "failed_handshake",
    "pyiceberg_ssl",
    "rest_catalog",
    "tls_settings",
]

CA_BUNDLE = "ssl.cabundle"
CLIENT_CERT = "ssl.client.cert"
CLIENT_KEY = "ssl.client.key"
SETTINGS = (CA_BUNDLE, CLIENT_CERT, CLIENT_KEY)


def tls_settings(properties: Mapping[str, str]) -> dict[str, str]:
    """The catalog's TLS settings (``SETTINGS`` it sets)."""
    return {key: properties[key] for key in SETTINGS if key in properties}


def check(name: str, kind: str, properties: Mapping[str, str]) -> None:
    """A CatalogError, in one line, for TLS settings of catalog ``name`` (of type ``kind``)
    that would not be applied as given (see the module)."""
    unknown = sorted(k for k in properties if (k == "ssl" or k.startswith("ssl.")) and k not in SETTINGS)
    if unknown:
        raise CatalogError(
            f"catalog {name!r} sets {', '.join(unknown)}, which no engine reads: a REST catalog's TLS settings are "
            f"{', '.join(SETTINGS)}"
        )
    given = tls_settings(properties)
    if not given:
        return
    if kind != "rest":
        raise CatalogError(
            f"catalog {name!r} sets {', '.join(given)}: TLS settings are a REST catalog's, and this one is of type "
            f"{kind}, whose client would not read them"
        )
    if CLIENT_KEY in given and CLIENT_CERT not in given:
        raise CatalogError(f"catalog {name!r} sets {CLIENT_KEY} without {CLIENT_CERT}: give the key's certificate")
    import ssl

    if CA_BUNDLE in given:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=given[CA_BUNDLE])
        except (OSError, ssl.SSLError) as exc:
            raise CatalogError(
                f"catalog {name!r}: its {CA_BUNDLE} {given[CA_BUNDLE]!r} is not a file of PEM certificates "
                f"({_why(exc)})"
            ) from None
    if CLIENT_CERT in given:
        _check_client(name, given[CLIENT_CERT], given.get(CLIENT_KEY))


class _Encrypted(Exception):
    """OpenSSL asked for the private key's passphrase."""


def _passphrase() -> str:
    raise _Encrypted


def _check_client(name: str, cert: str, key: str | None) -> None:
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    where = f"{cert!r} and {key!r}" if key else repr(cert)
    try:
        context.load_cert_chain(cert, key, password=_passphrase)
    except _Encrypted:
        raise CatalogError(
            f"catalog {name!r}: the private key of its client certificate ({key or cert!r}) is encrypted, and no "
            "engine can be given its passphrase (OpenSSL would ask for it on the terminal): give it unencrypted, "
            "readable by this user alone"
        ) from None
    except (OSError, ssl.SSLError) as exc:
        raise CatalogError(
            f"catalog {name!r}: its client certificate and key ({where}) do not load as a PEM certificate and its "
            f"private key ({_why(exc)})"
        ) from None


def _why(exc: BaseException) -> str:
    """What an OSError or SSLError says, in a few words."""
    import ssl

    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).lower().replace("_", " ")
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def failed_handshake(exc: BaseException) -> bool:
    """Whether ``exc`` (what opening a catalog raised) is a failed TLS handshake (requests'
    ``SSLError``, whose text alone says ``EOF occurred in violation of protocol`` where the
    server wanted a client certificate)."""
    import ssl

    from requests.exceptions import SSLError  # pyiceberg's dependency

    return isinstance(exc, SSLError | ssl.SSLError)


def rest_catalog(name: str, properties: Mapping[str, str]) -> Any:
    """pyiceberg's REST catalog ``name`` with ``properties`` (``pyiceberg_ssl``), whose
    ``ssl.cabundle`` holds whatever the environment says. requests lets
    ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE`` (set on many machines, this one's too)
    override a session's own ``verify`` (psf/requests#3829): pyiceberg's catalog then
    trusted the system's bundle in place of the catalog's, and a catalog with a private
    authority's certificate failed its handshake (``self-signed certificate in certificate
    chain``)."""
    return _rest_catalog_class()(name, **pyiceberg_ssl(properties))


@functools.cache
def _rest_catalog_class() -> type:
    from pyiceberg.catalog.rest import RestCatalog

    class _RestCatalog(RestCatalog):
        def _create_session(self) -> Any:
            session = super()._create_session()
            bundle = (self.properties.get("ssl") or {}).get("cabundle")
            if bundle is not None:
                environment = session.merge_environment_settings

                def merged(url: Any, proxies: Any, stream: Any, verify: Any, cert: Any) -> Any:
                    settings = environment(url, proxies, stream, verify, cert)
                    settings["verify"] = bundle  # the environment's proxies stay
                    return settings

                session.merge_environment_settings = merged  # type: ignore[method-assign]
            return session

    return _RestCatalog


def pyiceberg_ssl(properties: Mapping[str, str]) -> dict[str, Any]:
    """``properties`` as pyiceberg's REST catalog takes them: the TLS settings as its
    ``ssl`` setting."""
    given = tls_settings(properties)
    if not given:
        return dict(properties)
    opened: dict[str, Any] = {k: v for k, v in properties.items() if k not in SETTINGS}
    nested: dict[str, Any] = {}
    if CA_BUNDLE in given:
        nested["cabundle"] = given[CA_BUNDLE]
    if CLIENT_CERT in given:
        nested["client"] = {"cert": given[CLIENT_CERT], **({"key": given[CLIENT_KEY]} if CLIENT_KEY in given else {})}
    opened["ssl"] = nested
    return opened
