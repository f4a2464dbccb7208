"""TLS for the web front, from the web config file (`config/web_file.py`): the server context, client
certificates, and the SAN allow-list."""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from rnic_exporter.config.web_file import (
    TLS_VERSIONS,
    ClientAuthType,
    TLSServerConfig,
    WebConfig,
    error_reason,
    web_config_error,
)


def build_ssl_context(config: WebConfig) -> ssl.SSLContext | None:
    """The server-side TLS context for `config`, or None when it does not enable TLS.

    Loading the key pair here (not lazily per handshake) is what turns a mismatched or garbled
    certificate into a start-up error instead of every scrape failing.
    """
    tls = config.tls_server_config
    if tls is None:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS[tls.min_version]
    ctx.maximum_version = TLS_VERSIONS[tls.max_version]
    if tls.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    # We never speak h2; saying so in ALPN stops clients that offer it from guessing.
    ctx.set_alpn_protocols(["http/1.1"])
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file, password=_refuse_passphrase)
    except (OSError, ValueError) as exc:
        # OpenSSL's own words ("PEM lib") do not say what is wrong with the files.
        hint = " (need a PEM certificate chain and its matching unencrypted PEM key)"
        hint = hint if isinstance(exc, ssl.SSLError) else ""
        reason = f"cannot use {tls.cert_file} with key {tls.key_file}: {error_reason(exc)}{hint}"
        web_config_error(config.source, "tls_server_config.cert_file", reason)
    _configure_client_auth(ctx, tls, config.source)
    return ctx


def _configure_client_auth(ctx: ssl.SSLContext, tls: TLSServerConfig, source: Path | None) -> None:
    # RequestClientCert asks for a certificate but never verifies or uses it, so not asking at all
    # is indistinguishable to the client and to us.
    if tls.client_auth_type in (ClientAuthType.NO_CLIENT_CERT, ClientAuthType.REQUEST_CLIENT_CERT):
        ctx.verify_mode = ssl.CERT_NONE
        return
    if tls.client_auth_type is ClientAuthType.VERIFY_CLIENT_CERT_IF_GIVEN:
        ctx.verify_mode = ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_REQUIRED
    assert tls.client_ca_file is not None  # the parser enforces it for verifying policies
    try:
        ctx.load_verify_locations(cafile=tls.client_ca_file)
    except (OSError, ValueError) as exc:
        why = f"cannot load {tls.client_ca_file}: {error_reason(exc)}"
        web_config_error(source, "tls_server_config.client_ca_file", why)


def _refuse_passphrase() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal, hanging a daemon at start-up.
    raise ValueError("the key file is encrypted; give an unencrypted key (restrict it with file permissions)")


def client_sans_allowed(peercert: Mapping[str, Any] | None, allowed: Collection[str]) -> bool:
    """Whether a verified client certificate carries one of `allowed` as a SAN (toolkit semantics).

    Like the toolkit this matches DNS names, e-mail addresses, IP addresses and URIs exactly.
    IP addresses are compared as addresses because OpenSSL prints IPv6 uncompressed and upper case.
    """
    if not allowed:
        return True
    if not peercert:
        return False
    wanted = {_canonical_ip(name) or name for name in allowed}
    for kind, value in peercert.get("subjectAltName", ()):
        candidate = _canonical_ip(value) if kind == "IP Address" else value
        if kind in ("DNS", "email", "URI", "IP Address") and candidate in wanted:
            return True
    return False


def _canonical_ip(text: str) -> str | None:
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        return None
