"""NetlinkWatcher on real interfaces: a fresh network namespace with veth pairs, driven by `ip`."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rnic_exporter.sources.netlink import IpAddress, NetlinkEvent, NetlinkWatcher
from tests.support.limits import assert_failed_once_then_recovered, descriptors_exhausted
from tests.support.netns import Netns, network_namespace
from tests.support.processes import free_port, http_get
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

NETDEV = "ens1f0np0"
IFA_F_TENTATIVE = 0x40
IFA_F_PERMANENT = 0x80


class Recorder:
    """What the watcher reported, in order, from its thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str]] = []
        self.events: list[NetlinkEvent] = []

    def on_change(self, ifname: str, kind: str) -> None:
        with self.lock:
            self.calls.append((ifname, kind))

    def on_event(self, event: NetlinkEvent) -> None:
        with self.lock:
            self.events.append(event)

    def address_events(self, kind: str, address: str) -> list[NetlinkEvent]:
        with self.lock:
            return [e for e in self.events if e.kind == kind and e.address and e.address.address == address]


@pytest.fixture
def ns() -> Iterator[Netns]:
    with network_namespace({NETDEV: "0c:42:a1:41:00:36"}) as created:
        yield created


@contextmanager
def watching(ns: Netns, recorder: Recorder, rcvbuf: int = 1 << 20) -> Iterator[NetlinkWatcher]:
    with ns.entered():  # the watcher's thread is born inside the namespace and stays there
        watcher = NetlinkWatcher(recorder.on_change, on_event=recorder.on_event, rcvbuf=rcvbuf)
        watcher.start()
    try:
        yield watcher
    finally:
        watcher.close()


def v4(watcher: NetlinkWatcher, netdev: str = NETDEV) -> set[str]:
    return {a.address for a in watcher.addresses().get(netdev, ()) if a.family == "ipv4"}


def test_start_dumps_what_is_already_there_without_calling_back(ns: Netns) -> None:
    ns.ip("addr", "add", "10.0.0.1/24", "dev", NETDEV)
    recorder = Recorder()
    with watching(ns, recorder) as watcher:
        assert watcher.healthy and watcher.errors == 0
        links = watcher.links()
        assert links[NETDEV].admin_up and links[NETDEV].index > 1
        assert set(links) >= {"lo", NETDEV}
        assert IpAddress("10.0.0.1", 24, "ipv4", 0, IFA_F_PERMANENT) in watcher.addresses()[NETDEV]
        assert IpAddress("127.0.0.1", 8, "ipv4", 254, IFA_F_PERMANENT) in watcher.addresses()["lo"]
        assert recorder.address_events("address_added", "10.0.0.1") == []


def test_ipv4_address_added_and_removed(ns: Netns) -> None:
    recorder = Recorder()
    with watching(ns, recorder) as watcher:
        ns.ip("addr", "add", "10.0.0.1/24", "dev", NETDEV)
        wait_for(lambda: recorder.address_events("address_added", "10.0.0.1"), timeout=5, what="RTM_NEWADDR")
        assert (NETDEV, "address_added") in recorder.calls
        assert v4(watcher) == {"10.0.0.1"}

        ns.ip("addr", "del", "10.0.0.1/24", "dev", NETDEV)
        wait_for(lambda: recorder.address_events("address_removed", "10.0.0.1"), timeout=5, what="RTM_DELADDR")
        assert (NETDEV, "address_removed") in recorder.calls
        assert v4(watcher) == set()


def test_ipv6_reannouncements_are_one_change(ns: Netns) -> None:
    """DAD announces the address tentative, then again without the flag: one address_added."""
    recorder = Recorder()
    with watching(ns, recorder) as watcher:
        ns.ip("addr", "add", "2001:db8::1/64", "dev", NETDEV)

        def settled() -> IpAddress | None:
            return next(
                (
                    a
                    for a in watcher.addresses().get(NETDEV, ())
                    if a.address == "2001:db8::1" and not a.flags & IFA_F_TENTATIVE
                ),
                None,
            )

        addr = wait_for(settled, timeout=10, what="2001:db8::1 past duplicate address detection")
        assert (addr.prefixlen, addr.family, addr.scope) == (64, "ipv6", 0)
        added = recorder.address_events("address_added", "2001:db8::1")
        assert len(added) == 1
        assert added[0].address is not None and added[0].address.flags & IFA_F_TENTATIVE  # the first announcement


def test_admin_down_up_and_carrier_loss(ns: Netns) -> None:
    recorder = Recorder()
    with watching(ns, recorder) as watcher:
        ns.ip("link", "set", NETDEV, "down")
        wait_for(lambda: not watcher.links()[NETDEV].admin_up, timeout=5, what="admin down")
        assert watcher.links()[NETDEV].operstate == "down"
        assert (NETDEV, "link") in recorder.calls

        ns.ip("link", "set", NETDEV, "up")
        wait_for(lambda: watcher.links()[NETDEV].admin_up, timeout=5, what="admin up")
        wait_for(lambda: watcher.links()[NETDEV].operstate == "up", timeout=5, what="operstate up")

        ns.set_carrier(NETDEV, False)  # the peer goes down: no carrier here, admin state unchanged
        # Carrier changes pass the kernel's linkwatch, which may hold them back up to a second.
        wait_for(lambda: not watcher.links()[NETDEV].lower_up, timeout=5, what="carrier loss")
        assert watcher.links()[NETDEV].admin_up
        assert watcher.links()[NETDEV].operstate == "down"  # veth: no carrier reads "down", not lowerlayerdown
        ns.set_carrier(NETDEV, True)
        wait_for(lambda: watcher.links()[NETDEV].lower_up, timeout=5, what="carrier back")


def test_mtu_and_mac_changes_are_announced(ns: Netns) -> None:
    """The exporter re-reads a RoCE netdev's sysfs files only on announcements (and the slow safety
    sweep): an MTU or MAC change must be one, though neither moves the link's state."""
    recorder = Recorder()
    with watching(ns, recorder) as watcher:
        ns.ip("link", "set", NETDEV, "mtu", "4200")
        wait_for(lambda: watcher.links()[NETDEV].mtu == 4200, timeout=5, what="MTU change")
        assert (NETDEV, "link") in recorder.calls
        with recorder.lock:
            recorder.calls.clear()
        ns.ip("link", "set", NETDEV, "address", "0c:42:a1:41:00:37")
        wait_for(lambda: watcher.links()[NETDEV].mac == "0c:42:a1:41:00:37", timeout=5, what="MAC change")
        assert (NETDEV, "link") in recorder.calls


def test_deleted_link_takes_its_addresses(ns: Netns) -> None:
    ns.ip("link", "add", "rnxa", "type", "veth", "peer", "name", "rnxb")
    ns.ip("addr", "add", "10.5.0.1/24", "dev", "rnxa")
    recorder = Recorder()
    with watching(ns, recorder) as watcher:
        assert v4(watcher, "rnxa") == {"10.5.0.1"}
        ns.ip("link", "del", "rnxa")
        wait_for(
            lambda: "rnxa" not in watcher.links() and "rnxb" not in watcher.links(),
            timeout=5,
            what="both veth ends gone",
        )
        assert "rnxa" not in watcher.addresses()
        assert recorder.address_events("address_removed", "10.5.0.1")
        with recorder.lock:
            assert any(e.ifname == "rnxa" and e.kind == "link" and e.link is None for e in recorder.events)


def test_close_is_prompt_while_waiting_and_leaks_nothing(ns: Netns) -> None:
    before = set(os.listdir("/proc/self/fd"))
    recorder = Recorder()
    with watching(ns, recorder) as watcher:
        assert watcher.healthy
        time.sleep(0.2)  # let the thread settle into get() with nothing to read
        started = time.monotonic()
        watcher.close()
        took = time.monotonic() - started
    assert took < 0.5, f"close() took {took:.3f}s"
    assert watcher._thread is not None and not watcher._thread.is_alive()
    assert not watcher.healthy
    assert set(os.listdir("/proc/self/fd")) <= before  # socket, event loop and its pipes closed


def test_a_full_receive_buffer_redumps_and_loses_nothing(ns: Netns, tmp_path: Path) -> None:
    """A stalled watcher lets the kernel drop events (ENOBUFS): the re-dump brings the state back."""
    stalled, release = threading.Event(), threading.Event()

    class Staller(Recorder):
        def on_change(self, ifname: str, kind: str) -> None:
            super().on_change(ifname, kind)
            if not stalled.is_set():
                stalled.set()
                release.wait(10)

    recorder = Staller()
    before = set(os.listdir("/proc/self/fd"))
    with watching(ns, recorder, rcvbuf=4096) as watcher:
        ns.ip("addr", "add", "10.8.0.1/32", "dev", NETDEV)
        wait_for(stalled.is_set, timeout=5, what="the watcher stalled in its callback")
        batch = tmp_path / "add.ip"
        batch.write_text("".join(f"addr add 10.9.{i // 250}.{i % 250 + 1}/32 dev {NETDEV}\n" for i in range(300)))
        ns.ip("-batch", str(batch))
        release.set()
        wanted = {"10.8.0.1"} | {f"10.9.{i // 250}.{i % 250 + 1}" for i in range(300)}
        wait_for(lambda: v4(watcher) == wanted, timeout=10, what="all 301 addresses after the re-dump")
        assert watcher.overruns >= 1 and watcher.errors >= watcher.overruns
        assert watcher.healthy

        def reported() -> bool:  # the re-dump reported what the dropped messages would have
            with recorder.lock:
                added = {e.address.address for e in recorder.events if e.kind == "address_added" and e.address}
            return added >= wanted

        # The state is updated before its callbacks run, so the last ones may still be on their way.
        wait_for(reported, timeout=10, what="an address_added event for every address")
        started = time.monotonic()
        watcher.close()
        assert time.monotonic() - started < 0.5
    assert set(os.listdir("/proc/self/fd")) <= before  # the overrun socket was closed, not leaked


def test_failures_are_counted_logged_once_and_retried(ns: Netns, caplog: pytest.LogCaptureFixture) -> None:
    """No descriptor left (EMFILE): not fatal, counted, one log line, and it recovers by itself."""
    caplog.set_level(logging.INFO, logger="rnic_exporter.netlink")
    recorder = Recorder()
    # Room for the watcher's event loop (epoll and a socket pair) and nothing more: every
    # attempt to open the netlink socket fails with EMFILE.
    with ns.entered(), descriptors_exhausted(spare=3):
        watcher = NetlinkWatcher(recorder.on_change, on_event=recorder.on_event, retry_initial_s=0.02, retry_max_s=0.05)
        watcher.start()
        assert not watcher.healthy
        wait_for(lambda: watcher.errors >= 3, timeout=5, what="several failed attempts")
    try:
        wait_for(lambda: watcher.healthy, timeout=5, what="recovery once descriptors are available")
        ns.ip("addr", "add", "10.0.0.1/24", "dev", NETDEV)
        wait_for(lambda: recorder.address_events("address_added", "10.0.0.1"), timeout=5, what="events after recovery")
    finally:
        watcher.close()
    assert_failed_once_then_recovered(caplog, "netlink failed")


def test_a_failing_callback_does_not_stop_the_watcher(ns: Netns) -> None:
    seen: list[str] = []

    def flaky(ifname: str, kind: str) -> None:
        seen.append(kind)
        if len(seen) == 1:
            raise RuntimeError("consumer bug")

    recorder = Recorder()
    with ns.entered():
        watcher = NetlinkWatcher(flaky, on_event=recorder.on_event)
        watcher.start()
    try:
        ns.ip("addr", "add", "10.0.0.1/24", "dev", NETDEV)
        ns.ip("addr", "add", "10.0.0.2/24", "dev", NETDEV)
        wait_for(
            lambda: v4(watcher) == {"10.0.0.1", "10.0.0.2"} and seen.count("address_added") == 2,
            timeout=5,
            what="both addresses despite the raising callback",
        )
        assert watcher.healthy and watcher.errors == 0
    finally:
        watcher.close()


# -- the namespace helper the netlink tests stand on -----------------------------------------


def test_namespace_helper_cleans_up_on_failure_and_after_a_crashed_run() -> None:
    with pytest.raises(RuntimeError), network_namespace(["ens1f0np0"]) as ns:
        names = (ns.name, ns.peer_ns)
        raise RuntimeError("test body failed")
    assert not set(names) & set(_netns_names())

    # A run killed inside the block leaves its namespaces behind; the next run removes them.
    crashed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os\nfrom tests.support.netns import network_namespace\n"
            "with network_namespace(['ens1f0np0']) as ns:\n    print(ns.name, ns.peer_ns, flush=True)\n"
            "    os.kill(os.getpid(), 9)\n",
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    left = crashed.stdout.split()
    assert crashed.returncode == -9 and len(left) == 2 and set(left) <= set(_netns_names())
    with network_namespace([]):
        assert not set(left) & set(_netns_names())


def _netns_names() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def test_a_server_inside_the_namespace_is_reachable_from_the_test_process(ns: Netns, tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text("inside\n")
    port = free_port()
    ns.popen(
        [sys.executable, "-m", "http.server", "--bind", ns.address, "--directory", str(tmp_path), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    status, _, body = wait_for(lambda: _get(ns.url(port, "/index.html")), timeout=10, what="http.server inside")
    assert (status, body) == (200, b"inside\n")
    assert ns.run("cat", "/proc/net/dev").stdout.count(NETDEV) == 1  # run() executes inside
    assert NETDEV not in Path("/proc/net/dev").read_text()


def _get(url: str) -> tuple[int, dict[str, str], bytes] | None:
    try:
        return http_get(url, timeout=1)
    except OSError:
        return None
