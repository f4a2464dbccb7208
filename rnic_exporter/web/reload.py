"""Hot reload of the web config: only complete, settled files, and never a silent loss of security.

A rewrite in place (`cat > web.yml`, most editors, a ConfigMap volume written by hand) first
truncates the file and then writes it, so a watcher can see an empty or half-written file. An
empty file is a valid "no TLS, no auth" config at start-up, which is why reloading it used to
turn authentication off for anyone scraping in that instant. So a reload:
- applies only content that two checks at least `interval` apart read identically (with an
  interval of 0, two reads back to back) and that still matches after it was loaded;
- treats an empty file as an error;
- refuses a config that would turn TLS on or off, remove basic auth, or weaken client
  certificate checks: these need a restart, so nobody loses protection by accident;
- keeps the running config on any failure, says why once per distinct problem, and reports it
  in `ok` (the exporter's config_last_reload_successful gauge).
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rnic_exporter.config.web_file import ClientAuthType, WebConfig, parse_web_config
from rnic_exporter.errors import ConfigError
from rnic_exporter.web.auth import BasicAuth
from rnic_exporter.web.tls import build_ssl_context

log = logging.getLogger(__name__)
_clock = time.monotonic  # tests step time through the settle interval without sleeping
# How often content that failed to load is tried again while it stays the same.
_RETRY_FAILED = 10.0

Fingerprints = dict[Path, bytes | None]

# How much each client-certificate policy checks; a reload may not lower it.
_CLIENT_CHECK_STRENGTH = {
    ClientAuthType.NO_CLIENT_CERT: 0,
    ClientAuthType.REQUEST_CLIENT_CERT: 0,
    ClientAuthType.REQUIRE_ANY_CLIENT_CERT: 1,
    ClientAuthType.VERIFY_CLIENT_CERT_IF_GIVEN: 1,
    ClientAuthType.REQUIRE_AND_VERIFY_CLIENT_CERT: 2,
}


@dataclass(frozen=True)
class Security:
    """One loaded web config with what is derived from it; swapped whole on reload."""

    config: WebConfig
    ssl_context: ssl.SSLContext | None
    auth: BasicAuth

    @classmethod
    def build(cls, config: WebConfig, previous: BasicAuth | None = None) -> Security:
        """`previous`: the running config's checker, whose successes for unchanged users carry over."""
        return cls(config, build_ssl_context(config), BasicAuth(config.basic_auth_users, previous=previous))


def fingerprint(paths: Sequence[Path]) -> Fingerprints:
    """A digest of each file's content (None: unreadable).

    Content rather than mtime: an in-place rewrite within one clock tick keeps mtime and size,
    and these files are a few kilobytes read at most once per interval.
    """
    digests: Fingerprints = {}
    for path in paths:
        try:
            digests[path] = hashlib.sha256(path.read_bytes()).digest()
        except OSError:
            digests[path] = None
    return digests


def weakening(running: WebConfig, new: WebConfig) -> str | None:
    """Why `new` may not replace `running` without a restart, or None."""
    old_tls, new_tls = running.tls_server_config, new.tls_server_config
    if (old_tls is None) != (new_tls is None):
        return "tls_server_config: turning TLS on or off needs a restart"
    if running.basic_auth_users and not new.basic_auth_users:
        return "basic_auth_users: removing every user would turn authentication off; that needs a restart"
    if old_tls is not None and new_tls is not None:
        if _CLIENT_CHECK_STRENGTH[new_tls.client_auth_type] < _CLIENT_CHECK_STRENGTH[old_tls.client_auth_type]:
            return (
                f"tls_server_config.client_auth_type: weakening {old_tls.client_auth_type} to "
                f"{new_tls.client_auth_type} needs a restart"
            )
        if old_tls.client_allowed_sans and not new_tls.client_allowed_sans:
            return "tls_server_config.client_allowed_sans: removing the SAN restriction needs a restart"
    return None


class _MovingError(Exception):
    """The file changed between the check and the read."""


class WebConfigWatcher:
    """The current web config, reloaded when its file or a file it names changes.

    `maybe_reload` is cheap and never blocks (whoever finds a check running uses the current
    config); call it from the serving path. A ConfigError at construction is a start-up error.
    """

    def __init__(self, path: Path | None, interval: float = 1.0) -> None:
        self.path = None if path is None else path.absolute()
        self.interval = interval
        self.ok = True  # the last reload attempt applied, or the files are back to the running content
        self._lock = threading.Lock()
        self._next_check = 0.0
        self._candidate: tuple[Fingerprints, float] | None = None  # changed content first seen at
        self._last_error: str | None = None
        self._failed: tuple[Fingerprints, float] | None = None  # content that failed, and when
        self._applied: Fingerprints | None = None  # None: unknown, check again
        if self.path is None:
            self.security = Security.build(WebConfig())
        else:
            self.security, self._applied = self._load(allow_empty=True, watched=())

    @property
    def files(self) -> tuple[Path, ...]:
        return self.security.config.files

    def current(self) -> Security:
        self.maybe_reload()
        return self.security

    def maybe_reload(self) -> None:
        now = _clock()
        if self.path is None or now < self._next_check or not self._lock.acquire(blocking=False):
            return
        try:
            if now >= self._next_check:
                self._next_check = now + self.interval
                self._check(now, settle=self.interval > 0)
        finally:
            self._lock.release()

    def reload(self) -> None:
        """Check now (SIGHUP, tests) without waiting for the content to settle."""
        if self.path is None:
            return
        with self._lock:
            self._last_error = self._failed = None  # an explicit reload always tries and reports
            self._check(_clock(), settle=False)

    def _check(self, now: float, *, settle: bool) -> None:
        seen = fingerprint(self.files)
        if seen == self._applied:
            self._candidate = None
            if not self.ok:
                log.info("web config %s is back to the running content", self.path)
                self.ok, self._last_error = True, None
            return
        if self._failed is not None and self._failed[0] == seen and now < self._failed[1] + _RETRY_FAILED:
            return  # the same broken content: do not parse it again on every check
        if settle and (self._candidate is None or self._candidate[0] != seen):
            self._candidate = (seen, now)  # apply it only if it still reads the same next time
            return
        self._candidate = None
        try:
            security, applied = self._load(allow_empty=False, watched=seen, previous=self.security.auth)
            reason = weakening(self.security.config, security.config)
            if reason is not None:
                raise ConfigError(f"web config {self.path}: {reason}")
        except _MovingError:
            return  # being written right now: read it again at the next check
        except ConfigError as exc:
            self._fail(str(exc), seen, now)
            return
        except Exception as exc:  # whatever the file holds, serving goes on with the running config
            log.exception("web config reload raised")
            self._fail(f"web config {self.path}: unexpected {type(exc).__name__}: {exc}", seen, now)
            return
        self.security, self._applied, self._failed = security, applied, None
        self.ok, self._last_error = True, None
        log.info("web config reloaded from %s", self.path)

    def _fail(self, message: str, seen: Fingerprints, now: float) -> None:
        # Retry the same content now and then (the fix may be a file we do not watch yet, such as
        # a certificate still to be copied), but say so once per distinct problem.
        self.ok = False
        self._failed = (seen, now)
        if message != self._last_error:
            log.error("web config reload failed, keeping the running config: %s", message)
            self._last_error = message

    def _load(
        self, *, allow_empty: bool, watched: Fingerprints | Sequence[Path], previous: BasicAuth | None = None
    ) -> tuple[Security, Fingerprints | None]:
        """Load from one read of the file; the fingerprints to remember, None if a file moved meanwhile."""
        assert self.path is not None
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"web config {self.path}: cannot read it: {exc.strerror or exc}") from exc
        before = watched if isinstance(watched, dict) else fingerprint(watched)
        if self.path in before and before[self.path] != hashlib.sha256(raw).digest():
            raise _MovingError
        security = Security.build(parse_web_config(self.path, raw, allow_empty=allow_empty), previous)
        after = fingerprint(security.config.files)
        # What we parsed is the config file as `raw`; the TLS files were read by OpenSSL by name.
        consistent = after.get(self.path) == hashlib.sha256(raw).digest() and all(
            before[path] == after[path] for path in before.keys() & after.keys()
        )
        return security, after if consistent else None
