"""The one YAML loader of the exporter's own files (`--config`, `--web.config.file`).

PyYAML's SafeLoader silently keeps the last of two equal keys, which would make a user listed
twice use whichever hash happens to come last, or a `poll_interval_seconds` given twice take the
second: duplicates are an error here, as Go's `yaml.UnmarshalStrict` makes them for the
exporter-toolkit. Built on first use so PyYAML is imported only when a YAML file is read
(it costs about 1.4 MB of resident memory).
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any


@functools.cache
def strict_loader() -> type[Any]:
    """SafeLoader that rejects duplicate keys; on libyaml's parser when PyYAML has it.

    libyaml is a state machine with a nesting limit (1,000 levels, then "exceeded maximum nesting
    depth"); PyYAML's own parser takes seconds for a few thousand levels of `[[[`, which on SIGHUP
    would stall the poll loop. The constructor (and so the duplicate check) is Python either way.
    """
    import yaml

    base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # same constructor API

    class StrictLoader(base):  # type: ignore[misc,valid-type]
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
            seen: set[object] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, Hashable) and key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key!r}",
                        key_node.start_mark,
                    )
                if isinstance(key, Hashable):
                    seen.add(key)
            mapping: dict[Hashable, Any] = super().construct_mapping(node, deep)
            return mapping

    return StrictLoader


def yaml_error(exc: Exception, source: object) -> str:
    """A PyYAML error as one line that names the file (PyYAML says "<unicode string>" for text it
    was handed, and spreads context, marks and a caret over several lines)."""
    return " ".join(str(exc).replace('"<unicode string>"', f'"{source}"').split())
