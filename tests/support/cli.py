"""The exporter's command line as click defines it, for tests of files that name its flags."""

from __future__ import annotations

from rnic_exporter.cli import main


def serve_flags() -> set[str]:
    """Every flag `rnic-exporter serve` accepts, `--no-` forms included."""
    serve = main.commands["serve"]
    return {opt for param in serve.params for opt in (*param.opts, *param.secondary_opts)}
