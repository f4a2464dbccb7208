"""Differential test helpers: the simulator's tree next to the kernel's, normalised and compared.

Host side (and the offline unit test). The kernel half is tests/kernel/scenarios/sim_diff.py; its
trees are also kept as fixtures in tests/fixtures/kernel-rxe-6.1/ (text dumps, `dump_text`).

    python -m tests.kernel.simdiff --write-fixture OUT/sim_diff/result.json   # refresh the fixtures
"""

from __future__ import annotations

import argparse
import errno
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.kernel.lab import Tree, TreeEntry, tree

REPO = Path(__file__).resolve().parents[2]
FIXTURE_DIR = REPO / "tests/fixtures/kernel-rxe-6.1"
STEPS = ("created", "addresses", "peer_down", "peer_up", "deleted")
IPV4 = "10.77.0.1"
IPV6 = "fd00:77::1"
# Generic driver-model entries every device has; the exporter never reads them, the simulator does
# not write them. Reported, not compared.
GENERIC = ("uevent", "power", "subsystem")
# ib_cm's per-port counters (`ports/N/cm_{rx,tx}_*/`): present only while the ib_cm module is loaded
# (rdma_cm users load it: an earlier scenario's rping or pyverbs CMID), whatever the device; the
# exporter reads none of them and the simulator does not write them.
CM_COUNTERS = re.compile(r"^ports/\d+/cm_(?:rx|tx)_[a-z]+(?:/|$)")

# -- text dumps (fixtures) ----------------------------------------------------------------------

_RUN = re.compile(r"^(.*/)?(\d+)$")


def _payload(entry: TreeEntry) -> str:
    if entry["kind"] == "dir":
        return "dir" if "errno" not in entry else f"dir\terrno\t{entry['errno']}"
    if entry["kind"] == "link":
        return f"link\ttarget\t{json.dumps(entry['target'])}"
    if "errno" in entry:
        return f"file\terrno\t{entry['errno']}"
    return f"file\tvalue\t{json.dumps(entry['value'])}"


def dump_text(t: Tree) -> str:
    """One line per entry, `path<TAB>kind<TAB>what<TAB>JSON`; runs of numbered siblings with the same
    entry are collapsed to `dir/{A..B}` (a 1024-slot GID table of zeros is one line)."""
    lines: list[str] = []
    keys = sorted(t, key=lambda p: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", p)])
    i = 0
    while i < len(keys):
        path = keys[i]
        m = _RUN.match(path)
        j = i
        if m:
            prefix, first = m.group(1) or "", int(m.group(2))
            while j + 1 < len(keys):
                nxt = _RUN.match(keys[j + 1])
                if not nxt or (nxt.group(1) or "") != prefix or int(nxt.group(2)) != first + (j + 1 - i):
                    break
                if t[keys[j + 1]] != t[path]:
                    break
                j += 1
            if j > i:
                lines.append(f"{prefix}{{{first}..{first + j - i}}}\t{_payload(t[path])}")
                i = j + 1
                continue
        lines.append(f"{path}\t{_payload(t[path])}")
        i += 1
    return "\n".join(lines) + "\n"


def load_text(text: str) -> Tree:
    out: Tree = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.split("\t")
        path, kind = parts[0], parts[1]
        entry: TreeEntry = {"kind": kind}
        if len(parts) >= 4:
            entry[parts[2]] = json.loads(parts[3]) if parts[2] in ("value", "target") else parts[3]
        m = re.match(r"^(.*)\{(\d+)\.\.(\d+)\}$", path)
        if m:
            for n in range(int(m.group(2)), int(m.group(3)) + 1):
                out[f"{m.group(1)}{n}"] = dict(entry)
        else:
            out[path] = entry
    return out


# -- the simulator side -------------------------------------------------------------------------


def sim_tree(root: Path, name: str, overlay: dict[str, int]) -> Tree:
    """`tree()` of the simulated device, with the errnos the simulator says its files answer."""
    t = tree(root / "class/infiniband" / name)
    for key, code in overlay.items():
        prefix = f"class/infiniband/{name}/"
        if key.startswith(prefix) and key[len(prefix) :] in t:
            t[key[len(prefix) :]] = {"kind": "file", "errno": errno.errorcode.get(code, str(code))}
    return t


def sim_steps(workdir: Path) -> tuple[dict[str, Tree], dict[str, Any]]:
    """The kernel scenario's steps played on SimHost: one RoCE device, 1024 GID slots as rxe has."""
    from rnic_exporter.sim import SimHost

    host = SimHost.build(workdir / "sys", roce=1, infiniband=0, ethernet_gbps=10, driver="rxe")
    dev = next(iter(host.devices))
    for address in list(host.device(dev).addresses):
        host.remove_address(dev, address)
    trees: dict[str, Tree] = {}

    def snap(step: str) -> None:
        trees[step] = sim_tree(host.root, dev, host.errno_overlay)

    snap("created")
    host.add_address(dev, IPV4)
    host.add_address(dev, IPV6)
    snap("addresses")
    host.set_port_up(dev, False)
    snap("peer_down")
    host.set_port_up(dev, True)
    snap("peer_up")
    host.remove_address(dev, IPV4)
    host.remove_address(dev, IPV6)
    snap("deleted")
    host.remove_device(dev)
    removed = {"class_entry_exists": (host.root / "class/infiniband" / dev).exists()}
    info = {"netdev": host.device(dev).netdev, "mac": host.device(dev).mac, "removed": removed}
    return trees, info


# -- normalisation and comparison ---------------------------------------------------------------

_GUID = re.compile(r"^[0-9a-f]{4}(:[0-9a-f]{4}){3}\n$")
_GID = re.compile(r"^[0-9a-f]{4}(:[0-9a-f]{4}){7}\n$")
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000\n"


def normalise(t: Tree, netdev: str) -> dict[str, str]:
    """path -> comparable text: GUIDs, link-local GIDs, the netdev's name and counter values replaced."""
    out: dict[str, str] = {}
    for path, entry in t.items():
        if path.split("/")[0] in GENERIC or CM_COUNTERS.match(path):
            continue
        if entry["kind"] != "file" or "value" not in entry:
            out[path] = _payload(entry)
            continue
        v = entry["value"]
        if _GUID.match(v):
            v = "<guid>\n"
        elif _GID.match(v) and v.startswith("fe80:") and v != "fe80:0000:0000:0000:0000:0000:0000:0000\n":
            v = "<link-local gid>\n"
        elif v.strip() == netdev:
            v = "<netdev>\n"
        elif "counters/" in path and re.fullmatch(r"\d+\n", v) and not path.endswith("lifespan"):
            v = "<count>\n"
        out[path] = f"file\tvalue\t{json.dumps(v)}"
    return out


def compare(kernel: Tree, kernel_netdev: str, sim: Tree, sim_netdev: str) -> list[str]:
    """Every difference between the normalised trees, one readable line each (empty: they agree)."""
    k, s = normalise(kernel, kernel_netdev), normalise(sim, sim_netdev)
    diffs: list[str] = []
    # A directory on one side only is one line (with what it holds), not one line per file in it.
    lone: list[str] = []
    for side, mine, other in (("kernel", k, s), ("sim", s, k)):
        for path in sorted(mine):
            if mine[path] == "dir" and path not in other and not any(path.startswith(d + "/") for d in lone):
                inside = sorted(p[len(path) + 1 :] for p in mine if p.startswith(path + "/"))
                diffs.append(f"only in {side + ':':7} {path}/  ({len(inside)} entries: {', '.join(inside)})")
                lone.append(path)
    # hw_counters names are the driver's: one line per side with the names only it has.
    hw = "ports/1/hw_counters/"
    for side, mine, other in (("kernel", k, s), ("sim", s, k)):
        names = sorted(p[len(hw) :] for p in mine if p.startswith(hw) and p not in other)
        if names:
            diffs.append(f"only in {side + ':':7} {hw}{{{', '.join(names)}}}")
    skip = tuple(d + "/" for d in lone)
    for path in sorted(set(k) | set(s)):
        if path in lone or path.startswith(skip) or (path.startswith(hw) and (path not in k or path not in s)):
            continue
        if path not in s:
            diffs.append(f"only in kernel: {path}  {k[path]}")
        elif path not in k:
            diffs.append(f"only in sim:    {path}  {s[path]}")
        elif k[path] != s[path]:
            diffs.append(f"differs:        {path}  kernel {k[path]}  sim {s[path]}")
    return collapse_lines(diffs)


def collapse_lines(lines: list[str]) -> list[str]:
    """Fold runs of diff lines that differ only in a slot number (`gid_attrs/types/5..1023`)."""
    out: list[str] = []
    key: Callable[[str], str] = lambda line: re.sub(r"/\d+(\s)", r"/N\1", line, count=1)  # noqa: E731
    i = 0
    while i < len(lines):
        j = i
        while j + 1 < len(lines) and key(lines[j + 1]) == key(lines[i]):
            j += 1
        if j == i:
            out.append(lines[i])
        else:
            numbers = [re.search(r"/(\d+)\s", line) for line in lines[i : j + 1]]
            which = ",".join(m.group(1) for m in numbers if m)
            out.append(f"{key(lines[i])}  [N = {which}]")
        i = j + 1
    return out


def gid_rows(t: Tree) -> dict[int, tuple[str, str, str]]:
    """The non-empty GID slots: index -> (gid, type or errno, ndev or errno)."""
    rows: dict[int, tuple[str, str, str]] = {}
    for path, entry in t.items():
        m = re.fullmatch(r"ports/1/gids/(\d+)", path)
        if not m or entry.get("value") == ZERO_GID:
            continue
        n = m.group(1)

        def val(p: str) -> str:
            e = t.get(p, {})
            return e.get("value", "").strip() or e.get("errno", "<missing>")

        rows[int(n)] = (
            entry.get("value", "").strip(),
            val(f"ports/1/gid_attrs/types/{n}"),
            val(f"ports/1/gid_attrs/ndevs/{n}"),
        )
    return dict(sorted(rows.items()))


def write_fixture(result: dict[str, Any], dest: Path = FIXTURE_DIR) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for step in STEPS:
        path = dest / f"{step}.txt"
        path.write_text(dump_text(result["steps"][step]["tree"]))
        written.append(path)
    meta = {k: result[k] for k in ("kernel", "mac", "netdev", "addresses", "removed")}
    meta["net"] = {step: result["steps"][step]["net"] for step in STEPS}
    meta["realpath"] = result["steps"]["created"]["realpath"]
    (dest / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    written.append(dest / "meta.json")
    return written


def load_fixture(dest: Path = FIXTURE_DIR) -> tuple[dict[str, Tree], dict[str, Any]]:
    trees = {step: load_text((dest / f"{step}.txt").read_text()) for step in STEPS}
    meta: dict[str, Any] = json.loads((dest / "meta.json").read_text())
    return trees, meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--write-fixture", type=Path, metavar="RESULT_JSON", required=True)
    args = parser.parse_args(argv)
    for path in write_fixture(json.loads(args.write_fixture.read_text())):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
