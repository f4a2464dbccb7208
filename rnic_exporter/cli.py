"""The front door: `rnic-exporter serve|show|gids|check|demo`.

Command bodies hold no logic: they turn flags into a config and call one function.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from enum import IntEnum
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from rnic_exporter import __version__
from rnic_exporter.config.bounds import (
    DEMO_DEVICES,
    DEMO_STEP,
    DEVICES,
    FOLLOW_DELAY,
    POLL_INTERVAL,
    NumberParam,
)
from rnic_exporter.config.otlp import otlp_options
from rnic_exporter.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


class Exit(IntEnum):
    """Exit codes are part of the interface: job prologues branch on them."""

    OK = 0
    PROBLEMS = 1  # `check`: something is wrong with an RNIC
    USAGE = 2  # bad flag, unusable path or config, could not start


INTERRUPTED = 130  # Ctrl-C (SIGINT), as a shell reports 128 + 2: neither OK nor "problems"


def fail(message: str) -> NoReturn:
    click.echo(f"rnic-exporter: error: {message}", err=True)
    raise SystemExit(Exit.USAGE)


def sysfs_option(f: F) -> F:
    return click.option(
        "--path.sysfs",
        "sysfs",
        default="/sys",
        show_default=True,
        metavar="DIR",
        help="sysfs mount point (a captured or simulated tree works too).",
    )(f)


def device_filter_options(f: F) -> F:
    f = click.option(
        "--collector.infiniband.device-include",
        "device_include",
        metavar="REGEX",
        default=None,
        help="Read only RDMA devices whose name matches.",
    )(f)
    return click.option(
        "--collector.infiniband.device-exclude",
        "device_exclude",
        metavar="REGEX",
        default=None,
        help="Never read RDMA devices whose name matches.",
    )(f)


def counter_filter_options(f: F) -> F:
    """node_exporter-style filters of the driver counters (`rnic_exporter/sources/counter_filter.py`)."""
    f = click.option(
        "--collector.hw_counters.exclude",
        "hw_counters_exclude",
        metavar="REGEX",
        default=None,
        help="Never read hw_counters/ files whose name matches (anchored: ^(?:REGEX)$).",
    )(f)
    f = click.option(
        "--collector.hw_counters.include",
        "hw_counters_include",
        metavar="REGEX",
        default=None,
        help="Read only the hw_counters/ files whose name matches (anchored: ^(?:REGEX)$).",
    )(f)
    return click.option(
        "--collector.hw_counters/--no-collector.hw_counters",
        "hw_counters",
        default=True,
        help="Read the driver counters of hw_counters/ (rnic_port_hw_stat_total, rnic_device_hw_stat_total).",
    )(f)


def _duration_text(seconds: float) -> str:
    """5.0 -> 5s, 0.5 -> 500ms, 60 -> 1m: how --help shows a duration default (as it is typed)."""
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    if seconds >= 1 and seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"


class HelpOption(click.Option):
    """Defaults as an operator reads them: an on/off flag says on or off (click prints the name of
    the flag that is the default, `no-collector.consumers`), a duration `5s` (click prints `5.0`)."""

    def get_help_extra(self, ctx: click.Context) -> Any:
        extra = super().get_help_extra(ctx)
        if "default" in extra and self.is_flag and self.secondary_opts:
            extra["default"] = "on" if self.default else "off"
        elif (
            "default" in extra
            and isinstance(self.type, NumberParam)
            and self.type.bound.duration
            and isinstance(self.default, int | float)
            and not isinstance(self.default, bool)
        ):
            extra["default"] = _duration_text(float(self.default))
        return extra


class OneLineGroup(click.Group):
    """Usage errors as the one line the README promises (click prints usage, a hint and the error on
    three or four lines): `rnic-exporter: error: No such option: --nope (see rnic-exporter show --help)`."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        for command in self.commands.values():
            for param in command.params:
                if type(param) is click.Option:
                    param.__class__ = HelpOption
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)
        except click.exceptions.NoArgsIsHelpError as exc:  # a bare `rnic-exporter`: the help, as click prints it
            exc.show()
            raise SystemExit(exc.exit_code) from None
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "rnic-exporter"
            message = " ".join(exc.format_message().split()).rstrip(".")
            click.echo(f"rnic-exporter: error: {message} (see {where} --help)", err=True)
            raise SystemExit(Exit.USAGE) from None
        except click.ClickException as exc:
            exc.show()
            raise SystemExit(exc.exit_code) from None
        except click.exceptions.Abort as exc:
            if isinstance(exc.__cause__ or exc.__context__, KeyboardInterrupt):
                # 128 + SIGINT, as a shell reports it: a prologue must not read Ctrl-C as "problems" (1)
                click.echo("rnic-exporter: interrupted", err=True)
                raise SystemExit(INTERRUPTED) from None
            click.echo("Aborted!", err=True)
            raise SystemExit(1) from None
        raise SystemExit(rv if isinstance(rv, int) else 0)


@click.group(
    cls=OneLineGroup,
    context_settings={
        "auto_envvar_prefix": "RNIC_EXPORTER",
        "show_default": True,
        "help_option_names": ["-h", "--help"],
    },
)
@click.version_option(__version__, "--version", prog_name="rnic-exporter")
def main() -> None:
    """Watch RDMA NICs (RoCE and InfiniBand) and warn before they kill a training job.

    Every flag can also be set through an environment variable: RNIC_EXPORTER_<COMMAND>_<FLAG>,
    e.g. RNIC_EXPORTER_SHOW_PATH_SYSFS.
    """


def _snapshot(
    sysfs: str, device_include: str | None = None, device_exclude: str | None = None, rootfs: str = "/"
) -> Any:
    """One whole read. NCCL's pick honours NCCL's config files (under `rootfs`) below the
    environment, as `check` and `serve` do: `show` must name the index `check` judges."""
    from rnic_exporter.config.file import reader_settings
    from rnic_exporter.config.nccl_conf import read_nccl_conf, under
    from rnic_exporter.sources.reader import HostReader
    from rnic_exporter.sources.sysfs import SysfsRoot

    try:
        nccl_files = under(read_nccl_conf(rootfs=Path(rootfs)), {})
        settings = reader_settings(device_include, device_exclude, nccl_files=nccl_files)
        reader = HostReader(SysfsRoot(Path(sysfs)), settings)
    except ConfigError as exc:
        fail(str(exc))
    try:
        return reader.read(full_gid_tables=True)
    finally:
        reader.close()


def _refuse_empty_filter(snap: Any, sysfs: str, device_include: str | None, device_exclude: str | None) -> None:
    """A device filter that leaves out every RDMA device there is is a usage error (exit 2), not
    "no hardware": a Broadcom node under a `^mlx5_` config must not read as empty."""
    from rnic_exporter.config.file import reader_settings

    excluded = reader_settings(device_include, device_exclude).excludes_all(snap, sysfs)
    if excluded is not None:
        fail(excluded)


def _say_if_empty(snap: Any, sysfs: str) -> bool:
    """A host without RDMA devices is not an error: say so plainly (exit 0)."""
    if snap.devices:
        return False
    click.echo(f"No RDMA devices found under {sysfs}/class/infiniband.")
    return True


def _emit_json(data: object) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def proc_root_options(f: F) -> F:
    """Where the host's other trees are, node_exporter style (a container mounts them elsewhere)."""
    f = click.option(
        "--path.procfs",
        "procfs",
        default="/proc",
        metavar="DIR",
        help="procfs mount point (IPv6 keep_addr_on_down per netdev; the processes using each RNIC).",
    )(f)
    f = click.option(
        "--path.rootfs",
        "rootfs",
        default="/",
        metavar="DIR",
        help="Host root (NetworkManager's /run/NetworkManager/devices state; kubelet's /var/log/pods; "
        "the NCCL settings of /etc/nccl.conf).",
    )(f)
    return f


def consumers_flag(f: F) -> F:
    """Who holds each RNIC open: off by default, it must see the host's processes."""
    return click.option(
        "--collector.consumers/--no-collector.consumers",
        "consumers",
        default=False,
        help="Name the processes, Slurm jobs and pods holding each RNIC open (needs the host's PIDs: "
        "--path.procfs, and pod names from --path.rootfs/var/log/pods).",
    )(f)


def _consumer_scan(enabled: bool, sysfs: str, procfs: str, rootfs: str) -> Any:
    """One scan for `show` and `check`, or None (not asked, or it failed: said on stderr, exit unchanged)."""
    if not enabled:
        return None
    from rnic_exporter.daemon import consumer_watch

    try:
        return consumer_watch.scanner(Path(sysfs), Path(procfs), Path(rootfs))()
    except Exception as exc:  # the RNIC verdict must not depend on seeing the process table
        click.echo(f"note: consumers unknown, the process scan failed: {type(exc).__name__}: {exc}", err=True)
        return None


@main.command()
@sysfs_option
@device_filter_options
@proc_root_options
@consumers_flag
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the stable scripting interface).")
def show(
    sysfs: str,
    device_include: str | None,
    device_exclude: str | None,
    procfs: str,
    rootfs: str,
    consumers: bool,
    as_json: bool,
) -> None:
    """One row per RDMA port: state, rate, netdev, PCIe, IPv4, NCCL's GID index, unreadable files
    (and with --collector.consumers, USERS: the jobs, pods or commands holding the device open)."""
    from rnic_exporter.commands import tables as views

    snap = _snapshot(sysfs, device_include, device_exclude, rootfs)
    _refuse_empty_filter(snap, sysfs, device_include, device_exclude)
    users = _consumer_scan(consumers, sysfs, procfs, rootfs)
    if as_json:
        _emit_json(views.show_json(snap, sysfs, users))
        return
    if _say_if_empty(snap, sysfs):
        return
    click.echo(views.format_table(views.show_columns(users), views.show_rows(snap, users)))
    if snap.errors:
        click.echo(f"\n{len(snap.errors)} attribute(s) could not be read:", err=True)
        for e in snap.errors:
            click.echo(f"  {e.where()}: {e.reason}", err=True)
    if snap.unsupported:
        from rnic_exporter.sources.availability import summarize

        click.echo(f"\n{len(snap.unsupported)} attribute(s) not provided by the driver (not a fault):")
        for line in summarize(snap.unsupported):
            click.echo(f"  {line}")


@main.command()
@sysfs_option
@click.option("--device", "-d", "device", metavar="NAME", default=None, help="Only this RDMA device.")
@click.option(
    "--path.rootfs", "rootfs", default="/", metavar="DIR", help="Host root (the NCCL settings of /etc/nccl.conf)."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the stable scripting interface).")
def gids(sysfs: str, device: str | None, rootfs: str, as_json: bool) -> None:
    """The GID tables, like show_gids; the row NCCL would auto-select is marked.

    NCCL's choice honours NCCL_IB_ADDR_FAMILY, NCCL_IB_ADDR_RANGE and NCCL_IB_ROCE_VERSION_NUM
    from the environment, then NCCL's config files ($NCCL_CONF_FILE or ~/.nccl.conf, then
    /etc/nccl.conf under --path.rootfs), as NCCL itself does.
    """
    from rnic_exporter.commands import tables as views

    snap = _snapshot(sysfs, rootfs=rootfs)
    if device is not None and snap.device(device) is None:
        fail(
            f"no RDMA device {device!r} under {sysfs}/class/infiniband "
            f"(found: {', '.join(d.name for d in snap.devices) or 'none'})"
        )
    if as_json:
        _emit_json(views.gids_json(snap, device))
        return
    if _say_if_empty(snap, sysfs):
        return
    rows = views.gid_rows(snap, device)
    click.echo(views.format_table(views.GID_COLUMNS, rows))
    click.echo(f"n_gids_found={len(rows)}")
    for port in snap.ports:
        if port.gid_table_size == 0 and (device is None or port.device == device):
            click.echo(
                f"{port.device} port {port.number}: the GID table could not be read (gids/ missing or "
                "empty); NCCL's pick is unknown",
                err=True,
            )


def host_path_options(f: F) -> F:
    """--path.procfs, --path.rootfs and the daemon's state directory."""
    f = proc_root_options(f)
    from rnic_exporter.detect.state import DEFAULT_STATE_DIR

    return click.option(
        "--state.dir",
        "state_dir",
        default=str(DEFAULT_STATE_DIR),
        metavar="DIR",
        help="Where the device inventory, baselines and expected addresses persist (empty: keep them in memory only).",
    )(f)


def consumer_options(f: F) -> F:
    """serve's: the flag and the scan's interval."""
    from rnic_exporter.config.file import CONSUMER_INTERVAL as INTERVAL
    from rnic_exporter.config.file import DEFAULT_INTERVAL_S

    f = click.option(
        "--collector.consumers.interval",
        "consumers_interval",
        type=NumberParam(INTERVAL),
        default=DEFAULT_INTERVAL_S,
        help="Seconds between scans of the process table for verbs users (also right after any event).",
    )(f)
    return consumers_flag(f)


_C_INTEGER = re.compile(r"\s*[+-]?(?:0[xX][0-9a-fA-F]+|[0-9]+)\s*")


class NcclIndexParam(click.ParamType[Any]):
    """--nccl-gid-index: an integer read as NCCL reads NCCL_IB_GID_INDEX (010 is 8, 0x3 is 3, -2 is
    auto). Text that is no integer at all (`abc`, `3abc`) is a usage error: NCCL would read it as a
    pin (0, 3) that the environment's note explains but a flag typed by hand never means."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | None:
        from rnic_exporter.config.nccl_env import gid_index_from_env

        if isinstance(value, int):
            return value
        # NCCL would read "abc" as 0: a pin nobody meant. Empty is auto-selection, as in the environment.
        if value != "" and not _C_INTEGER.fullmatch(str(value)):
            self.fail(f"{value!r} is not an integer (decimal, 0x hex or 0 octal; -1 = auto-selection)", param, ctx)
        return gid_index_from_env({"NCCL_IB_GID_INDEX": str(value)})


def serve_options(f: F) -> F:
    from rnic_exporter.config.serve import serve_flags
    from rnic_exporter.daemon.logsetup import FORMATTERS, LEVELS

    log = (
        click.option("--log.level", "log_level", type=click.Choice(list(LEVELS)), default="info"),
        click.option("--log.format", "log_format", type=click.Choice(sorted(FORMATTERS)), default="logfmt"),
    )
    for option in reversed(serve_flags(log)):
        f = option(f)
    return f


def _explicit(ctx: click.Context) -> frozenset[str]:
    """Parameters the operator set (flag or environment): these beat the config file."""
    sources = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    return frozenset(name for name in ctx.params if ctx.get_parameter_source(name) in sources)


@main.command()
@sysfs_option
@device_filter_options
@counter_filter_options
@host_path_options
@serve_options
@consumer_options
@otlp_options
@click.pass_context
def serve(ctx: click.Context, /, log_level: str, log_format: str, **flags: Any) -> None:
    """Run the exporter daemon: poll sysfs, serve Prometheus metrics (and OTLP with --otlp.endpoint)."""
    from rnic_exporter.config.serve import serve_config
    from rnic_exporter.daemon import serve
    from rnic_exporter.daemon.logsetup import configure

    configure(log_level, log_format)
    try:
        raise SystemExit(serve.run(*serve_config(ctx.params, _explicit(ctx))))
    except ConfigError as exc:
        fail(str(exc))


@main.command()
@sysfs_option
@device_filter_options
@host_path_options
@click.option(
    "--config",
    "config_file",
    default=None,
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The daemon's config file: rated expectations, expected device count, NCCL settings.",
)
@click.option(
    "--nccl-gid-index",
    "nccl_gid_index",
    type=NcclIndexParam(),
    default=None,
    metavar="N",
    help="The NCCL_IB_GID_INDEX your jobs use, -1 = auto-selection. Default, first found: "
    "$NCCL_IB_GID_INDEX, the config file's [nccl] ib_gid_index, NCCL's own config files as NCCL reads "
    "them ($NCCL_CONF_FILE, else ~/.nccl.conf; then /etc/nccl.conf under --path.rootfs).",
)
@click.option(
    "--expected-devices",
    "expected_devices",
    type=NumberParam(DEVICES),
    default=None,
    metavar="N",
    help="RDMA devices this host must have (default: the config file's inventory.expected_devices).",
)
@click.option(
    "--no-netlink",
    "no_netlink",
    is_flag=True,
    help="Do not ask rtnetlink for addresses; judge them from the GID tables.",
)
@click.option(
    "--fail-on",
    "fail_on",
    type=click.Choice(["critical", "warning"]),
    default="warning",
    help="The least severe problem that makes the exit code 1: `critical` lets a job start on a node "
    "with warnings only. Notes (attributes a driver does not provide, no inventory) never count.",
)
@consumers_flag
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the stable scripting interface).")
def check(
    sysfs: str,
    device_include: str | None,
    device_exclude: str | None,
    procfs: str,
    rootfs: str,
    state_dir: str,
    config_file: Path | None,
    nccl_gid_index: int | None,
    expected_devices: int | None,
    no_netlink: bool,
    fail_on: str,
    consumers: bool,
    as_json: bool,
) -> None:
    """Find every RNIC problem on this host now; exit 0 healthy, 1 problems found (at --fail-on or worse),
    2 usage error.

    Checks links against their rating (IB port, netdev, PCIe), devices against the daemon's
    inventory (--state.dir) and --expected-devices, NCCL_IB_GID_INDEX against every RoCE port,
    expected addresses, address managers that drop addresses on a flap, and unreadable
    attributes. Each problem says what it means for a job and what to do. Use it in job prologues.
    """
    from rnic_exporter.commands.check import format_report, run_check
    from rnic_exporter.config.serve import check_config
    from rnic_exporter.sources.address_risks import HostPaths

    try:
        resolved = check_config(
            config_file,
            Path(rootfs),
            device_include=device_include,
            device_exclude=device_exclude,
            nccl_gid_index=nccl_gid_index,
            expected_devices=expected_devices,
        )
        report = run_check(
            Path(sysfs),
            Path(state_dir) if state_dir else None,
            resolved.detection,
            resolved.reader,
            HostPaths(procfs=Path(procfs), rootfs=Path(rootfs)),
            use_netlink=not no_netlink,
            users=_consumer_scan(consumers, sysfs, procfs, rootfs),
            state_dir_given=click.get_current_context().get_parameter_source("state_dir")
            is not click.core.ParameterSource.DEFAULT,
        )
    except ConfigError as exc:
        fail(str(exc))
    except Exception as exc:  # a bug is "could not judge" (2), never "problems found" (1): it must not drain
        import traceback

        traceback.print_exc()
        fail(f"check could not judge the node: {type(exc).__name__}: {exc}")
    if as_json:
        _emit_json(report.to_json(fail_on))
    else:
        click.echo(format_report(report, fail_on))
    raise SystemExit(Exit.PROBLEMS if report.failed(fail_on) else Exit.OK)


@main.command()
@click.option(
    "--devices",
    type=NumberParam(DEMO_DEVICES),
    default=8,
    show_default=True,
    help="Simulated RNICs, 6 to 24 (a quarter InfiniBand; the story needs 5 RoCE RNICs and one without PMA).",
)
@click.option(
    "--step.seconds",
    "step_seconds",
    type=NumberParam(DEMO_STEP),
    default=20.0,
    help="Time between the injected failures (20s, 1m, or seconds).",
)
@click.option("--web.listen-address", "listen", multiple=True, default=["127.0.0.1:19879"], metavar="[HOST]:PORT")
@click.option("--poll.interval", "poll_interval", type=NumberParam(POLL_INTERVAL), default=2.0)
@click.option("--log.format", "log_format", type=click.Choice(["logfmt", "json"]), default="logfmt")
def demo(devices: int, step_seconds: float, listen: tuple[str, ...], poll_interval: float, log_format: str) -> None:
    """Serve metrics of a simulated host and play the failures rnic-exporter exists for.

    No RDMA hardware needed: a simulated sysfs tree in a temporary directory gets a port flap
    with a GID index shift, a speed drop, a PCIe downtrain and a NIC that disappears and comes
    back, one step at a time. Watch http://127.0.0.1:19879/metrics move. Ctrl-C cleans up.
    """
    from rnic_exporter.commands.demo import run_demo
    from rnic_exporter.daemon.logsetup import configure

    configure("info", log_format)
    try:
        raise SystemExit(
            run_demo(
                devices=devices, step_seconds=step_seconds, listen=listen, poll_interval=poll_interval, echo=click.echo
            )
        )
    except ConfigError as exc:
        fail(str(exc))


@main.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--roce", type=click.IntRange(0, 24), default=2, help="Simulated RoCE RNICs (netdevs ens<N>f0np0).")
@click.option("--infiniband", type=click.IntRange(0, 24), default=0, help="Simulated InfiniBand RNICs.")
@click.option("--gid-table-size", "gid_table_size", type=click.IntRange(4, 1024), default=255)
@click.option(
    "--follow-netlink",
    "follow",
    is_flag=True,
    help="Rewrite the GID tables from the real netdevs' rtnetlink events until SIGTERM.",
)
@click.option(
    "--follow.delay",
    "delay",
    type=NumberParam(FOLLOW_DELAY),
    default=0.03,
    help="Time (30ms, or seconds) from an rtnetlink event to the GID table update (the kernel's work-queue hop).",
)
@click.option(
    "--hold-gids",
    "hold_gids",
    is_flag=True,
    help="A job holds each IPv4 address's RoCE v2 GID: a re-added address lands at a higher index.",
)
def simulate(
    directory: Path, roce: int, infiniband: int, gid_table_size: int, follow: bool, delay: float, hold_gids: bool
) -> None:
    """Test and demo tool: write a simulated sysfs tree at DIRECTORY, optionally following netlink.

    With --follow-netlink, run inside a network namespace whose veth interfaces are named like
    the simulated netdevs (ens1f0np0, ...): `ip addr del/add` and `ip link set down/up` there
    change the simulated GID tables and port states as the kernel would.
    """
    from rnic_exporter.daemon.logsetup import configure
    from rnic_exporter.sim.follow import run_simulator

    configure("info", "logfmt")
    try:
        raise SystemExit(
            run_simulator(
                directory,
                roce=roce,
                infiniband=infiniband,
                gid_table_size=gid_table_size,
                follow=follow,
                delay_s=delay,
                hold_gids=hold_gids,
                echo=click.echo,
            )
        )
    except ConfigError as exc:
        fail(str(exc))


@main.command()
@click.option(
    "--out",
    "out",
    required=True,
    metavar="DIR",
    type=click.Path(path_type=Path),
    help="Directory to write the files into (created if missing).",
)
@click.option("--force", is_flag=True, help="Overwrite files that exist with other content.")
def bundle(out: Path, force: bool) -> None:
    """Write the deployment files shipped with this version into DIR.

    Grafana dashboards (dashboards/), Prometheus alert rules (alerts/), and under their own
    directories: the systemd unit, Kubernetes manifests (DaemonSet, Service, ServiceMonitor,
    PrometheusRule, ConfigMap), an OpenTelemetry Collector pipeline, Grafana provisioning and an
    Alertmanager example. Files already there with the same content are left alone.
    """
    from rnic_exporter.commands import bundle as bundling

    try:
        written = bundling.write_bundle(out, force=force)
    except bundling.BundleError as exc:
        fail(str(exc))
    for line in bundling.iter_summary(written, out):
        click.echo(line)


def name_env_vars(command: click.Command, prefix: str = "RNIC_EXPORTER") -> None:
    """Each option's environment variable is named after its flag, dots and dashes as `_`
    (`serve --web.listen-address`: RNIC_EXPORTER_SERVE_WEB_LISTEN_ADDRESS), as the docs say. Click
    would name it after the Python parameter (`..._SERVE_LISTEN`), which no operator can guess; that
    name is not read, so each flag has exactly one variable."""
    for param in command.params:
        if not isinstance(param, click.Option) or param.name in ("help", "version") or param.envvar:
            continue
        flag = next((opt for opt in param.opts if opt.startswith("--")), None)
        if flag is not None:
            param.envvar = f"{prefix}_{re.sub(r'[.-]', '_', flag[2:]).upper()}"
            param.allow_from_autoenv = False
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            name_env_vars(sub, f"{prefix}_{name.upper().replace('-', '_')}")


name_env_vars(main)


def run() -> None:
    """Entry point that turns stray ConfigErrors into one-line messages (never a traceback)."""
    try:
        main(standalone_mode=True)
    except ConfigError as exc:
        fail(str(exc))


if __name__ == "__main__":  # pragma: no cover
    run()


__all__ = ["Exit", "main"]
