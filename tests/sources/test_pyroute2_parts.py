"""pyroute2's submodules load without the package __init__ (which imports all of pyroute2), and the
package still works whole for anyone who asks it for a name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import json, sys
from rnic_exporter.sources import pyroute2_parts
iproute = pyroute2_parts.module("iproute.linux")
ethtool = pyroute2_parts.module("ethtool")
parts = {
    "classes": [iproute.AsyncIPRoute.__name__, ethtool.Ethtool.__name__],
    "heavy": sorted(m for m in ("pyroute2.ndb.main", "pyroute2.ipdb", "pyroute2.plan9", "sqlite3") if m in sys.modules),
    "modules": sum(1 for name in sys.modules if name.startswith("pyroute2")),
}
from pyroute2 import IPRoute, NDB  # someone else in the process wants the whole package
import pyroute2
parts["whole"] = [IPRoute.__name__, NDB.__name__, "pyroute2.ndb.main" in sys.modules, hasattr(pyroute2, "__version__")]
try:
    pyroute2.no_such_name
except AttributeError:
    parts["missing"] = "AttributeError"
print(json.dumps(parts))
"""


def test_submodules_load_alone_and_the_package_loads_whole_on_demand() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    ).stdout
    parts = json.loads(out)
    assert parts["classes"] == ["AsyncIPRoute", "Ethtool"]
    assert parts["heavy"] == [], parts  # the package __init__ did not run
    full = subprocess.run(
        [sys.executable, "-c", "import sys, pyroute2; print(sum(1 for n in sys.modules if n.startswith('pyroute2')))"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert parts["modules"] < int(full) - 40, (parts, full)
    assert parts["whole"] == ["IPRoute", "NDB", True, True]
    assert parts["missing"] == "AttributeError"
