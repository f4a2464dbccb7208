"""pyroute2's modules without pyroute2's package `__init__`, which imports all of pyroute2.

Any `import pyroute2.<sub>` runs `pyroute2/__init__.py` first, and that (0.9.x) imports every class
the library has: IPDB, NDB (with sqlite3), nftables, IPVS, WireGuard, plan9 and the rest, about
260 modules and 5 MB of resident memory for a daemon that uses two classes (`AsyncIPRoute`,
`Ethtool`). `module()` registers the package as a bare one (its path and spec, no code run), so
importing a submodule loads that submodule and what it imports, nothing else.

Nothing is lost for other users in the same process: the first time anyone asks the package for
a name that is not a submodule (`from pyroute2 import IPRoute`), the package's own `__init__` runs
into the same module object, as a normal import would have done.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any

PACKAGE = "pyroute2"

_lock = threading.RLock()


def module(name: str) -> ModuleType:
    """`pyroute2.<name>`, imported without pyroute2's package `__init__` unless that ran already."""
    with _lock:
        if PACKAGE not in sys.modules:
            sys.modules[PACKAGE] = _bare_package(PACKAGE)
    return importlib.import_module(f"{PACKAGE}.{name}")


def _bare_package(package: str) -> ModuleType:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        raise ImportError(f"no package named {package!r}", name=package)
    bare = importlib.util.module_from_spec(spec)  # __path__, __spec__, __file__: enough for submodules
    loader = spec.loader

    def load_on_demand(attr: str) -> Any:
        # The import system asks a package for its submodules before importing them
        # (`from pyroute2 import config` inside pyroute2): those load alone.
        if not attr.startswith("__") and importlib.util.find_spec(f"{package}.{attr}") is not None:
            return importlib.import_module(f"{package}.{attr}")
        if attr.startswith("__") and attr != "__all__":
            raise AttributeError(f"module {package!r} has no attribute {attr!r}")
        with _lock:
            if bare.__dict__.get("__getattr__") is load_on_demand:
                del bare.__dict__["__getattr__"]  # from now on an ordinary, fully loaded package
                loader.exec_module(bare)
        return bare.__dict__[attr] if attr in bare.__dict__ else _missing(package, attr)

    bare.__dict__["__getattr__"] = load_on_demand  # PEP 562: asked for names the module lacks
    return bare


def _missing(package: str, attr: str) -> Any:
    raise AttributeError(f"module {package!r} has no attribute {attr!r}")
