"""The exporter-toolkit web config file (`--web.config.file`): its strict parsing into `WebConfig`.

The TLS context and client-certificate checks built from it are the web front's (`web/tls.py`).

The YAML format is the one node_exporter reads (exporter-toolkit `docs/web-configuration.md`), so
one file can serve both. Parsing is strict like the toolkit's `yaml.UnmarshalStrict`: an unknown
key is an error. A toolkit key that we cannot honour is an error too, not silently ignored,
because an ignored cipher list or client-certificate policy would leave the operator believing
in protection they do not have.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import NoReturn

from rnic_exporter.config.yaml import strict_loader as _strict_loader  # one home: --config uses it too
from rnic_exporter.errors import ConfigError


class ClientAuthType(StrEnum):
    """`tls_server_config.client_auth_type`, named as in Go's crypto/tls."""

    NO_CLIENT_CERT = "NoClientCert"
    REQUEST_CLIENT_CERT = "RequestClientCert"
    REQUIRE_ANY_CLIENT_CERT = "RequireAnyClientCert"
    VERIFY_CLIENT_CERT_IF_GIVEN = "VerifyClientCertIfGiven"
    REQUIRE_AND_VERIFY_CLIENT_CERT = "RequireAndVerifyClientCert"


# Older toolkit versions spelled RequireAnyClientCert this way and still accept it.
_CLIENT_AUTH_ALIASES = {"RequireClientCert": ClientAuthType.REQUIRE_ANY_CLIENT_CERT}

TLS_VERSIONS: Mapping[str, ssl.TLSVersion] = MappingProxyType(
    {
        "TLS10": ssl.TLSVersion.TLSv1,
        "TLS11": ssl.TLSVersion.TLSv1_1,
        "TLS12": ssl.TLSVersion.TLSv1_2,
        "TLS13": ssl.TLSVersion.TLSv1_3,
    }
)

# The toolkit lets only these headers be configured, some only to fixed values, "to ensure
# consistency in the Prometheus ecosystem"; mirroring it keeps one file valid for both exporters.
ALLOWED_HEADERS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "Strict-Transport-Security": (),
        "X-Content-Type-Options": ("nosniff",),
        "X-Frame-Options": ("deny", "sameorigin"),
        "X-XSS-Protection": (),
        "Content-Security-Policy": (),
    }
)

# Toolkit keys we parse but cannot honour, with what to do instead. An empty value is accepted
# because it means "toolkit default" there too.
_UNSUPPORTED = {
    "rate_limit": "is not implemented by rnic-exporter; remove it",
    "tls_server_config.cert": "inline certificates are not supported; put the PEM in a file and use cert_file",
    "tls_server_config.key": "inline keys are not supported; put the PEM in a file and use key_file",
    "tls_server_config.client_ca": "inline CAs are not supported; put the PEM in a file and use client_ca_file",
    "tls_server_config.cipher_suites": "Go cipher-suite names are not supported; remove it to use OpenSSL's defaults",
    "tls_server_config.curve_preferences": "is not supported; remove it to use OpenSSL's defaults",
}

_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
_TLS_KEYS = (
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
    "client_allowed_sans",
    "prefer_server_cipher_suites",
    "cert",
    "key",
    "client_ca",
    "cipher_suites",
    "curve_preferences",
)
_HTTP_KEYS = ("headers", "http2")


# What htpasswd -B and Go's bcrypt produce; the cost is two digits, the salt+hash 53 characters.
_BCRYPT_HASH = re.compile(rb"\$2[aby]\$(?P<cost>\d\d)\$[./A-Za-z0-9]{53}")
_BCRYPT_COSTS = range(4, 32)


@dataclass(frozen=True)
class TLSServerConfig:
    """`tls_server_config`, with file paths already resolved against the config's directory."""

    cert_file: Path
    key_file: Path
    client_auth_type: ClientAuthType = ClientAuthType.NO_CLIENT_CERT
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    client_allowed_sans: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file the TLS context is built from, so a rotation of any of them is noticed."""
        ca = () if self.client_ca_file is None else (self.client_ca_file,)
        return (self.cert_file, self.key_file, *ca)


@dataclass(frozen=True)
class HTTPServerConfig:
    """`http_server_config`. `http2` is accepted for compatibility; we only speak HTTP/1.1."""

    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    http2: bool = True


@dataclass(frozen=True)
class WebConfig:
    """A whole web config; `source` is None when no file was given (plain HTTP, no auth)."""

    source: Path | None = None
    tls_server_config: TLSServerConfig | None = None
    http_server_config: HTTPServerConfig = field(default_factory=HTTPServerConfig)
    basic_auth_users: Mapping[str, bytes] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    @property
    def files(self) -> tuple[Path, ...]:
        """The config file and everything it points at: what a reload has to watch."""
        own = () if self.source is None else (self.source,)
        tls = () if self.tls_server_config is None else self.tls_server_config.files
        return (*own, *tls)


# A web config is a few kilobytes and at most four levels deep (top, tls_server_config,
# client_allowed_sans, item). The bounds turn a runaway file into a one-line error instead of a
# RecursionError in PyYAML (which is recursive), seconds of parsing (its scanner is quadratic in
# flow nesting) or a memory spike; 256 KiB is still some 3,000 users.
MAX_BYTES = 256 * 1024
MAX_DEPTH = 16
# Quoted scalars and comments, which may hold brackets that do not nest anything.
_NOT_STRUCTURE = re.compile(r"'[^']*'|\"(?:[^\"\\]|\\.)*\"|#[^\n]*")
_FLOW_BRACKET = re.compile(r"[\[\]{}]")


def load_web_config(path: Path | str, *, allow_empty: bool = True) -> WebConfig:
    """Read and validate a web config file; every problem is a ConfigError naming file and key."""
    source = Path(path).absolute()
    try:
        raw = source.read_bytes()
    except OSError as exc:
        raise ConfigError(f"web config {source}: cannot read it: {error_reason(exc)}") from exc
    return parse_web_config(source, raw, allow_empty=allow_empty)


def parse_web_config(source: Path, raw: bytes, *, allow_empty: bool = True) -> WebConfig:
    """Validate the bytes of a web config read from `source` (relative paths resolve against it).

    `allow_empty=False` (reloads): a file with no document is an error, not "no TLS, no auth",
    because that is also what a file looks like in the middle of a non-atomic rewrite.
    """
    if len(raw) > MAX_BYTES:
        web_config_error(source, "(file)", f"{len(raw)} bytes; a web config is at most {MAX_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        web_config_error(source, "(file)", f"not UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start}")
    import yaml  # only with a web config: PyYAML costs ~1.4 MB of resident memory

    try:
        _check_depth(source, text)
        document = yaml.load(text, Loader=_strict_loader())
    except yaml.YAMLError as exc:
        # PyYAML's messages span lines (context, a caret); a log line should be one line.
        raise ConfigError(f"web config {source}: not valid YAML: {' '.join(str(exc).split())}") from exc
    except RecursionError as exc:  # a bound we missed above; never let it reach a serving thread
        raise ConfigError(f"web config {source}: nested too deeply") from exc
    if document is None and not allow_empty:
        web_config_error(
            source,
            "(file)",
            "empty (or only comments); an incomplete write looks like this, so it is "
            "not read as 'no TLS, no auth': to run without them, restart with that file",
        )
    return _Parser(source).web_config(document)


def _check_depth(source: Path, text: str) -> None:
    """Refuse nesting beyond MAX_DEPTH before PyYAML builds anything.

    Flow brackets first, by a regex pass (fast, where PyYAML's scanner is slow); then the event
    stream, which PyYAML parses without recursion, for block nesting.
    """
    import yaml

    depth = 0
    for bracket in _FLOW_BRACKET.finditer(_NOT_STRUCTURE.sub("", text)):
        depth += 1 if bracket[0] in "[{" else -1
        if depth > MAX_DEPTH:
            web_config_error(source, "(file)", f"nested more than {MAX_DEPTH} levels deep")
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark else 0
                web_config_error(source, "(file)", f"nested more than {MAX_DEPTH} levels deep (line {line})")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


class _Parser:
    """Turns the loaded YAML into a WebConfig, failing with the key path on the first problem."""

    def __init__(self, source: Path) -> None:
        self.source = source

    def fail(self, key: str, reason: str) -> NoReturn:
        web_config_error(self.source, key, reason)

    def web_config(self, document: object) -> WebConfig:
        top = self.mapping(document, "(top level)", _TOP_KEYS, prefix="")
        tls = self.tls(top.get("tls_server_config"))
        return WebConfig(
            source=self.source,
            tls_server_config=tls,
            http_server_config=self.http(top.get("http_server_config")),
            basic_auth_users=self.users(top.get("basic_auth_users")),
        )

    def mapping(self, value: object, key: str, allowed: Collection[str] | None, prefix: str) -> dict[str, object]:
        """A YAML mapping with string keys, all of them supported and in `allowed` (None: any)."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(key, f"must be a mapping, got {_yaml_type(value)}")
        for name, item in value.items():
            path = f"{prefix}{name}"
            if not isinstance(name, str):
                self.fail(path, "keys must be strings")
            if path in _UNSUPPORTED and item not in (None, "", [], {}):
                self.fail(path, _UNSUPPORTED[path])
            if allowed is not None and name not in allowed:
                self.fail(path, f"unknown key; expected one of {', '.join(sorted(allowed))}")
        return value

    def string(self, value: object, key: str) -> str:
        if not isinstance(value, str):
            self.fail(key, f"must be a string, got {_yaml_type(value)}")
        return value

    def boolean(self, value: object, key: str, default: bool) -> bool:
        if value is None:
            return default
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {_yaml_type(value)}")
        return value

    def readable_file(self, value: object, key: str) -> Path:
        """A path resolved against the config file's directory (as the toolkit's SetDirectory does)."""
        text = self.string(value, key)
        if not text:
            self.fail(key, "must not be empty")
        if "\0" in text:  # no file name holds one; open() would raise ValueError, not OSError
            self.fail(key, f"contains a NUL byte at offset {text.index(chr(0))}; no file name can")
        path = Path(text) if Path(text).is_absolute() else self.source.parent / text
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            self.fail(key, f"cannot read {path}: {error_reason(exc)}")
        return path

    def choice(self, value: object, key: str, choices: Collection[str], default: str) -> str:
        if value is None:
            return default
        text = self.string(value, key)
        if text not in choices:
            self.fail(key, f"{text!r} is not one of {', '.join(choices)}")
        return text

    def tls(self, value: object) -> TLSServerConfig | None:
        key = "tls_server_config"
        section = self.mapping(value, key, _TLS_KEYS, prefix=f"{key}.")
        if not section:
            return None
        for required in ("cert_file", "key_file"):
            if section.get(required) in (None, ""):
                self.fail(f"{key}.{required}", "missing; required whenever tls_server_config is given")
        config = TLSServerConfig(
            cert_file=self.readable_file(section["cert_file"], f"{key}.cert_file"),
            key_file=self.readable_file(section["key_file"], f"{key}.key_file"),
            client_auth_type=self.client_auth_type(section.get("client_auth_type")),
            client_ca_file=(
                None
                if section.get("client_ca_file") in (None, "")
                else self.readable_file(section["client_ca_file"], f"{key}.client_ca_file")
            ),
            min_version=self.choice(section.get("min_version"), f"{key}.min_version", TLS_VERSIONS, "TLS12"),
            max_version=self.choice(section.get("max_version"), f"{key}.max_version", TLS_VERSIONS, "TLS13"),
            client_allowed_sans=self.string_list(section.get("client_allowed_sans"), f"{key}.client_allowed_sans"),
            prefer_server_cipher_suites=self.boolean(
                section.get("prefer_server_cipher_suites"), f"{key}.prefer_server_cipher_suites", default=True
            ),
        )
        self.check_tls_consistency(config)
        return config

    def client_auth_type(self, value: object) -> ClientAuthType:
        key = "tls_server_config.client_auth_type"
        if value is None or value == "":
            return ClientAuthType.NO_CLIENT_CERT
        text = self.string(value, key)
        if text in _CLIENT_AUTH_ALIASES:
            return _CLIENT_AUTH_ALIASES[text]
        try:
            return ClientAuthType(text)
        except ValueError:
            self.fail(key, f"{text!r} is not one of {', '.join(ClientAuthType)}")

    def check_tls_consistency(self, tls: TLSServerConfig) -> None:
        key = "tls_server_config"
        verifying = (ClientAuthType.VERIFY_CLIENT_CERT_IF_GIVEN, ClientAuthType.REQUIRE_AND_VERIFY_CLIENT_CERT)
        if tls.client_auth_type is ClientAuthType.REQUIRE_ANY_CLIENT_CERT:
            self.fail(
                f"{key}.client_auth_type",
                "RequireAnyClientCert is not supported: Python's ssl module can only require a client "
                "certificate that it also verifies; use RequireAndVerifyClientCert with client_ca_file",
            )
        if tls.client_auth_type in verifying and tls.client_ca_file is None:
            self.fail(
                f"{key}.client_ca_file",
                f"required when client_auth_type is {tls.client_auth_type} (the CA that signs scraper certificates)",
            )
        if tls.client_ca_file is not None and tls.client_auth_type is ClientAuthType.NO_CLIENT_CERT:
            self.fail(f"{key}.client_ca_file", "set, but client_auth_type is NoClientCert, so it would be ignored")
        if tls.client_allowed_sans and tls.client_auth_type is not ClientAuthType.REQUIRE_AND_VERIFY_CLIENT_CERT:
            self.fail(f"{key}.client_allowed_sans", "requires client_auth_type RequireAndVerifyClientCert")
        if TLS_VERSIONS[tls.min_version] > TLS_VERSIONS[tls.max_version]:
            self.fail(f"{key}.min_version", f"{tls.min_version} is above max_version {tls.max_version}")

    def string_list(self, value: object, key: str) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            self.fail(key, f"must be a list of strings, got {_yaml_type(value)}")
        return tuple(self.string(item, f"{key}[{index}]") for index, item in enumerate(value))

    def http(self, value: object) -> HTTPServerConfig:
        key = "http_server_config"
        section = self.mapping(value, key, _HTTP_KEYS, prefix=f"{key}.")
        return HTTPServerConfig(
            headers=self.headers(section.get("headers")),
            http2=self.boolean(section.get("http2"), f"{key}.http2", default=True),
        )

    def headers(self, value: object) -> Mapping[str, str]:
        key = "http_server_config.headers"
        section = self.mapping(value, key, None, prefix=f"{key}.")
        headers: dict[str, str] = {}
        for name, raw in section.items():
            if name not in ALLOWED_HEADERS:
                self.fail(f"{key}.{name}", f"cannot be configured; allowed: {', '.join(ALLOWED_HEADERS)}")
            header_value = self.string(raw, f"{key}.{name}")
            allowed_values = ALLOWED_HEADERS[name]
            if allowed_values and header_value not in allowed_values:
                self.fail(f"{key}.{name}", f"{header_value!r} is not one of {', '.join(allowed_values)}")
            # A newline here would let the config inject arbitrary headers into every response.
            if any(ord(char) < 0x20 or ord(char) == 0x7F for char in header_value):
                self.fail(f"{key}.{name}", "must not contain control characters such as newlines")
            headers[name] = header_value
        return MappingProxyType(headers)

    def users(self, value: object) -> Mapping[str, bytes]:
        key = "basic_auth_users"
        if value is None:
            return MappingProxyType({})
        if not isinstance(value, dict):
            self.fail(key, f"must be a mapping of user name to bcrypt hash, got {_yaml_type(value)}")
        users: dict[str, bytes] = {}
        for user, hashed in value.items():
            if not isinstance(user, str):
                self.fail(f"{key}.{user}", f"user names must be strings, got {_yaml_type(user)} (quote it)")
            if ":" in user:
                self.fail(f"{key}.{user}", "user names cannot contain ':' (basic auth splits on the first one)")
            users[user] = self.bcrypt_hash(hashed, f"{key}.{user}")
        return MappingProxyType(users)

    def bcrypt_hash(self, value: object, key: str) -> bytes:
        hashed = self.string(value, key).strip().encode("ascii", errors="replace")
        match = _BCRYPT_HASH.fullmatch(hashed)
        if match is None or int(match["cost"]) not in _BCRYPT_COSTS:
            self.fail(key, "not a bcrypt hash ($2y$<cost>$...); make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`")
        return hashed


def web_config_error(source: Path | None, key: str, reason: str) -> NoReturn:
    where = "web config" if source is None else f"web config {source}"
    raise ConfigError(f"{where}: {key}: {reason}")


def error_reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _yaml_type(value: object) -> str:
    names = {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "nothing",
    }
    return names.get(type(value), type(value).__name__)
