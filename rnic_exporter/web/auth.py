"""HTTP basic auth against the web config's bcrypt hashes, safe to expose to a hostile network.

bcrypt is slow on purpose (cost 10 is ~70 ms of one core), so every check that reaches it is a
resource an unauthenticated client can spend. What bounds that here:
- successful checks are cached per user (an HMAC under a key that exists only in this process,
  never the plaintext), so a scraper pays bcrypt once, and a reloaded config keeps the success of
  each user whose hash it did not change (a certificate rotation rewrites the file: the scraper
  must not queue behind a flood again), while a changed hash drops it at once;
- failed checks are cached for a short while per exact credential, so a client repeating one
  wrong password costs one check per `failure_ttl`, not one per request;
- at most one check per distinct credential runs at a time (single flight): the others wait for
  its verdict;
- checks run one at a time on one thread, and callers are called back instead of blocking, so no
  request-serving thread ever waits for bcrypt;
- the queue is fair between client addresses (IPv6 by /64, what one host is given): each address
  has its own FIFO and the thread takes one check from each in turn. Distinct wrong passwords miss
  the failure cache, so one FIFO for all let 300 guessing clients put a legitimate first scrape
  19 s behind (Prometheus gives up at 10 s); now Prometheus, on an address of its own, waits for
  one check per address with guesses queued, not for every guess queued.
An unknown user name is checked against the hash of a configured user picked by a keyed hash of
the name, so it takes the same code path at a cost that real users have, and the answer time
does not tell which names exist (several costs are spread over unknown names as over real users).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

Verdict = Callable[[bool], None]

# How long a failed credential is answered from memory. It is keyed by the exact password, so a
# user who fixes a typo is not held up; it only spares bcrypt from the same guess repeated.
FAILURE_TTL = 10.0
# Bounds the failure cache under a flood of distinct guesses; the oldest entries go first.
MAX_CACHED_FAILURES = 4096


@dataclass(frozen=True)
class Credential:
    """A credential that only bcrypt can judge; `digest` identifies it in the caches."""

    digest: bytes
    user: str
    secret: bytes
    target: bytes
    known: bool


@dataclass
class _Flight:
    credential: Credential
    waiters: list[Verdict] = field(default_factory=list)


class BasicAuth:
    """Checks basic-auth credentials against bcrypt hashes; one instance per loaded web config.

    A new config builds a new BasicAuth, which drops the failure cache and the success of every
    user whose hash changed, so a rotated password stops working at once.
    """

    def __init__(
        self,
        users: Mapping[str, bytes],
        *,
        failure_ttl: float = FAILURE_TTL,
        max_cached_failures: int = MAX_CACHED_FAILURES,
        previous: BasicAuth | None = None,
    ) -> None:
        self._users = dict(users)
        self._decoys = tuple(self._users[name] for name in sorted(self._users))
        # The previous config's key, so its successes still match; only those of users whose hash
        # is the same are kept (a success is a password matching that hash).
        self._hmac_key: bytes = secrets.token_bytes(32) if previous is None else previous._hmac_key
        self._failure_ttl = failure_ttl
        self._max_failures = max_cached_failures
        self._lock = threading.Lock()
        self._successes: dict[str, bytes] = {} if previous is None else previous._kept_successes(self._users)
        self._failures: OrderedDict[bytes, float] = OrderedDict()
        self._flights: dict[bytes, _Flight] = {}
        # client address (group) -> its checks in arrival order; in turn order (served goes last)
        self._queues: OrderedDict[str, deque[bytes]] = OrderedDict()
        self._draining = False

    @property
    def enabled(self) -> bool:
        return bool(self._users)

    @property
    def pending(self) -> int:
        """Distinct credentials queued for bcrypt or being checked."""
        with self._lock:
            return len(self._flights)

    def _kept_successes(self, users: Mapping[str, bytes]) -> dict[str, bytes]:
        with self._lock:
            return {user: digest for user, digest in self._successes.items() if users.get(user) == self._users[user]}

    # -- the non-blocking interface the server uses ----------------------------------------

    def decide(self, authorization: str | None) -> bool | Credential:
        """The verdict for an `Authorization` header if it needs no bcrypt, else what to submit."""
        if not self._users:
            return True
        credentials = parse_basic_authorization(authorization)
        if credentials is None:
            return False
        return self._lookup(*credentials)

    def submit(self, credential: Credential, verdict: Verdict, source: str = "") -> None:
        """Queue a bcrypt check for a client at address `source`; `verdict` is called with the
        outcome on the checking thread."""
        with self._lock:
            flight = self._flights.get(credential.digest)
            if flight is not None:  # the same credential is queued or being checked: share it
                flight.waiters.append(verdict)
                return
            self._flights[credential.digest] = _Flight(credential, [verdict])
            group = source_group(source)
            queue = self._queues.get(group)
            if queue is None:
                queue = self._queues[group] = deque()
            queue.append(credential.digest)
            if self._draining:
                return
            self._draining = True
        try:
            threading.Thread(target=self._drain, name="rnic-web-bcrypt", daemon=True).start()
        except RuntimeError as exc:  # "can't start new thread": deny rather than hang the request
            log.warning("cannot start the bcrypt thread: %s", exc)
            self._fail_queued()

    # -- blocking conveniences (tests, tools) -----------------------------------------------

    def check(self, user: str, password: str | bytes) -> bool:
        if not self._users:
            return False
        outcome = self._lookup(user, password.encode("utf-8") if isinstance(password, str) else password)
        return outcome if isinstance(outcome, bool) else self._wait(outcome)

    # -- internals ----------------------------------------------------------------------------

    def _lookup(self, user: str, secret: bytes) -> bool | Credential:
        stored = self._users.get(user)
        target = stored if stored is not None else self._decoy(user)
        digest = hmac.new(self._hmac_key, b"\0".join((user.encode("utf-8"), target, secret)), hashlib.sha256).digest()
        # The same steps whether or not the user exists; only a real user can have a success.
        cached = hmac.compare_digest(self._successes.get(user, b""), digest)
        if cached and stored is not None:
            return True
        with self._lock:
            expiry = self._failures.get(digest)
        if expiry is not None and expiry > time.monotonic():
            return False
        return Credential(digest, user, secret, target, stored is not None)

    def _decoy(self, user: str) -> bytes:
        """The hash an unknown user is checked against: always the same one for the same name."""
        pick = hmac.new(self._hmac_key, b"decoy\0" + user.encode("utf-8"), hashlib.sha256).digest()
        return self._decoys[int.from_bytes(pick[:8], "big") % len(self._decoys)]

    def _wait(self, credential: Credential) -> bool:
        done = threading.Event()
        outcome: list[bool] = []

        def verdict(ok: bool) -> None:
            outcome.append(ok)
            done.set()

        self.submit(credential, verdict)
        done.wait()
        return outcome[0]

    def _drain(self) -> None:
        _lower_priority()
        while True:
            with self._lock:
                if not self._queues:
                    self._draining = False
                    return
                group, queue = next(iter(self._queues.items()))
                flight = self._flights[queue.popleft()]
                if queue:
                    self._queues.move_to_end(group)  # its next check after one of every other address
                else:
                    del self._queues[group]
            credential = flight.credential
            ok = _bcrypt_matches(credential.secret, credential.target) and credential.known
            with self._lock:
                del self._flights[credential.digest]
                if ok:
                    self._successes[credential.user] = credential.digest
                else:
                    self._failures[credential.digest] = time.monotonic() + self._failure_ttl
                    self._failures.move_to_end(credential.digest)
                    while len(self._failures) > self._max_failures:
                        self._failures.popitem(last=False)
                waiters = flight.waiters
            _notify(waiters, ok)

    def cancel(self) -> None:
        """Deny every queued check (the server is stopping: their connections are closing); the
        one being checked ends the thread's work."""
        with self._lock:
            flights = [self._flights.pop(digest) for queue in self._queues.values() for digest in queue]
            self._queues.clear()
        for flight in flights:
            _notify(flight.waiters, False)

    def _fail_queued(self) -> None:
        self.cancel()
        with self._lock:
            self._draining = False


def source_group(address: str) -> str:
    """The queue a client's checks share: its IPv4 address, or its IPv6 /64 (one host's subnet,
    whose other addresses it can use at will); an IPv4-mapped IPv6 address is its IPv4 one."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


# Nice increment of the bcrypt thread: a flood of guesses then takes only the CPU that serving
# scrapes leaves, on a node whose cores belong to training jobs anyway.
_BCRYPT_NICE = 10


def _lower_priority() -> None:
    """Lower this thread's scheduling priority (Linux: nice is per thread); best effort."""
    with suppress(AttributeError, OSError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + _BCRYPT_NICE))


def _notify(waiters: list[Verdict], ok: bool) -> None:
    for waiter in waiters:
        try:
            waiter(ok)
        except Exception:  # one broken continuation must not stop the others or the thread
            log.exception("basic-auth continuation failed")


def parse_basic_authorization(value: str | None) -> tuple[str, bytes] | None:
    """(user, password) from `Basic <base64>`, or None for anything else.

    The password stays bytes: Go compares raw bytes, and a non-UTF-8 password must still work.
    """
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, colon, password = raw.partition(b":")
    if not colon:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


def _bcrypt_matches(password: bytes, hashed: bytes) -> bool:
    import bcrypt  # only with basic auth configured

    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:
        # bcrypt 5 refuses passwords over 72 bytes instead of silently comparing only the first
        # 72; treating them as wrong is the safe side of that difference.
        return False
