"""The front door: `rnic-exporter serve|show|gids|check|demo`.

Command bodies hold no logic: they turn flags into a config and call one function.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import IntEnum
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from rnic_exporter import __version__
from rnic_exporter.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


class Exit(IntEnum):
    """Exit codes are part of the interface: job prologues branch on them."""

    OK = 0
    PROBLEMS = 1  # `check`: something is wrong with an RNIC
    USAGE = 2  # bad flag, unusable path or config, could not start


def fail(message: str) -> NoReturn:
    click.echo(f"rnic-exporter: error: {message}", err=True)
    raise SystemExit(Exit.USAGE)


def sysfs_option(f: F) -> F:
    return click.option(
        "--path.sysfs", "sysfs", default="/sys", show_default=True, metavar="DIR",
        help="sysfs mount point (a captured or simulated tree works too).",
    )(f)


def device_filter_options(f: F) -> F:
    f = click.option("--collector.infiniband.device-include", "device_include", metavar="REGEX", default=None,
                     help="Read only RDMA devices whose name matches.")(f)
    return click.option("--collector.infiniband.device-exclude", "device_exclude", metavar="REGEX",
                        default=None, help="Never read RDMA devices whose name matches.")(f)


@click.group(context_settings={"auto_envvar_prefix": "RNIC_EXPORTER", "show_default": True,
                               "help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="rnic-exporter")
def main() -> None:
    """Watch RDMA NICs (RoCE and InfiniBand) and warn before they kill a training job.

    Every flag can also be set through an environment variable: RNIC_EXPORTER_<COMMAND>_<FLAG>,
    e.g. RNIC_EXPORTER_SHOW_PATH_SYSFS.
    """


def _snapshot(sysfs: str, device_include: str | None = None, device_exclude: str | None = None) -> Any:
    from rnic_exporter.sources.snapshot import HostReader, ReaderSettings
    from rnic_exporter.sources.sysfs import SysfsRoot

    try:
        settings = ReaderSettings.build(device_include, device_exclude)
        reader = HostReader(SysfsRoot(Path(sysfs)), settings)
    except ConfigError as exc:
        fail(str(exc))
    try:
        return reader.read(full_gid_tables=True)
    finally:
        reader.close()


def _say_if_empty(snap: Any, sysfs: str) -> bool:
    """A host without RDMA devices is not an error: say so plainly (exit 0)."""
    if snap.devices:
        return False
    click.echo(f"No RDMA devices found under {sysfs}/class/infiniband.")
    return True


def _emit_json(data: object) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


@main.command()
@sysfs_option
@device_filter_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the stable scripting interface).")
def show(sysfs: str, device_include: str | None, device_exclude: str | None, as_json: bool) -> None:
    """One row per RDMA port: state, rate, netdev, PCIe, IPv4, NCCL's GID index, unreadable files."""
    from rnic_exporter import views

    snap = _snapshot(sysfs, device_include, device_exclude)
    if as_json:
        _emit_json(views.show_json(snap, sysfs))
        return
    if _say_if_empty(snap, sysfs):
        return
    click.echo(views.format_table(views.SHOW_COLUMNS, views.show_rows(snap)))
    if snap.errors:
        click.echo(f"\n{len(snap.errors)} attribute(s) could not be read:", err=True)
        for e in snap.errors:
            click.echo(f"  {e.where()}: {e.reason}", err=True)


@main.command()
@sysfs_option
@click.option("--device", "-d", "device", metavar="NAME", default=None, help="Only this RDMA device.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the stable scripting interface).")
def gids(sysfs: str, device: str | None, as_json: bool) -> None:
    """The GID tables, like show_gids; the row NCCL would auto-select is marked.

    NCCL's choice honours NCCL_IB_ADDR_FAMILY, NCCL_IB_ADDR_RANGE and NCCL_IB_ROCE_VERSION_NUM
    from the environment, as NCCL itself does.
    """
    from rnic_exporter import views

    snap = _snapshot(sysfs)
    if device is not None and snap.device(device) is None:
        fail(f"no RDMA device {device!r} under {sysfs}/class/infiniband "
             f"(found: {', '.join(d.name for d in snap.devices) or 'none'})")
    if as_json:
        _emit_json(views.gids_json(snap, device))
        return
    if _say_if_empty(snap, sysfs):
        return
    rows = views.gid_rows(snap, device)
    click.echo(views.format_table(views.GID_COLUMNS, rows))
    click.echo(f"n_gids_found={len(rows)}")


def serve_options(f: F) -> F:
    from rnic_exporter.agent import DEFAULT_LISTEN
    from rnic_exporter.logsetup import FORMATTERS, LEVELS

    options = [
        click.option("--web.listen-address", "listen", multiple=True, default=[DEFAULT_LISTEN],
                     metavar="[HOST]:PORT", help="Address to listen on; repeat for several. 19879 is outside "
                     "Prometheus' allocated exporter range 9100-9999."),
        click.option("--web.telemetry-path", "telemetry_path", default="/metrics", help="Path of the metrics."),
        click.option("--web.config.file", "web_config", default=None, metavar="FILE",
                     type=click.Path(dir_okay=False, path_type=Path),
                     help="exporter-toolkit web config (TLS, basic auth), as node_exporter uses."),
        click.option("--config", "config_file", default=None, metavar="FILE",
                     type=click.Path(dir_okay=False, path_type=Path),
                     help="Config file (TOML, or YAML by .yml/.yaml). Flags beat the file; SIGHUP reloads it."),
        click.option("--poll.interval", "poll_interval", type=click.FloatRange(min=0.05), default=5.0,
                     help="Seconds between sysfs polls. Scrapes are served from the last poll."),
        click.option("--log.level", "log_level", type=click.Choice(list(LEVELS)), default="info"),
        click.option("--log.format", "log_format", type=click.Choice(sorted(FORMATTERS)), default="logfmt"),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _serve_config(sysfs: str, listen: tuple[str, ...], telemetry_path: str, web_config: Path | None,
                  config_file: Path | None, poll_interval: float, device_include: str | None,
                  device_exclude: str | None) -> Any:
    from rnic_exporter.agent import ServeConfig
    from rnic_exporter.sources.snapshot import ReaderSettings

    return ServeConfig(
        sysfs=Path(sysfs), listen=tuple(listen), telemetry_path=telemetry_path, web_config_file=web_config,
        poll_interval_s=poll_interval, reader=ReaderSettings.build(device_include, device_exclude),
        config_file=config_file,
    )


def _explicit(ctx: click.Context) -> frozenset[str]:
    """Parameters the operator set (flag or environment): these beat the config file."""
    sources = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    return frozenset(name for name in ctx.params if ctx.get_parameter_source(name) in sources)


@main.command()
@sysfs_option
@device_filter_options
@serve_options
@click.pass_context
def serve(ctx: click.Context, sysfs: str, device_include: str | None, device_exclude: str | None,
          listen: tuple[str, ...], telemetry_path: str, web_config: Path | None, config_file: Path | None,
          poll_interval: float, log_level: str, log_format: str) -> None:
    """Run the exporter daemon: poll sysfs, serve Prometheus metrics."""
    from rnic_exporter import agent
    from rnic_exporter.logsetup import configure

    configure(log_level, log_format)
    try:
        config = _serve_config(sysfs, listen, telemetry_path, web_config, config_file, poll_interval,
                               device_include, device_exclude)
        raise SystemExit(agent.run(config, _explicit(ctx)))
    except ConfigError as exc:
        fail(str(exc))


@main.command()
@click.option("--devices", type=click.IntRange(2, 24), default=8, help="Simulated RNICs (a quarter InfiniBand).")
@click.option("--step.seconds", "step_seconds", type=click.FloatRange(min=1.0), default=20.0,
              help="Seconds between the injected failures.")
@click.option("--web.listen-address", "listen", multiple=True, default=["127.0.0.1:19879"], metavar="[HOST]:PORT")
@click.option("--poll.interval", "poll_interval", type=click.FloatRange(min=0.05), default=2.0)
@click.option("--log.format", "log_format", type=click.Choice(["logfmt", "json"]), default="logfmt")
def demo(devices: int, step_seconds: float, listen: tuple[str, ...], poll_interval: float, log_format: str) -> None:
    """Serve metrics of a simulated host and play the failures rnic-exporter exists for.

    No RDMA hardware needed: a simulated sysfs tree in a temporary directory gets a port flap
    with a GID index shift, a speed drop, a PCIe downtrain and a NIC that disappears and comes
    back, one step at a time. Watch http://127.0.0.1:19879/metrics move. Ctrl-C cleans up.
    """
    from rnic_exporter.demo import run_demo
    from rnic_exporter.logsetup import configure

    configure("info", log_format)
    try:
        raise SystemExit(run_demo(devices=devices, step_seconds=step_seconds, listen=listen,
                                  poll_interval=poll_interval, echo=click.echo))
    except ConfigError as exc:
        fail(str(exc))


def run() -> None:
    """Entry point that turns stray ConfigErrors into one-line messages (never a traceback)."""
    try:
        main(standalone_mode=True)
    except ConfigError as exc:
        fail(str(exc))


if __name__ == "__main__":  # pragma: no cover
    run()


__all__ = ["Exit", "main"]
