"""The kernel lab's pytest side: one boot per session runs every selected scenario.

`pytest -m kernel tests/kernel` boots Debian's kernel once (tests/kernel/vm.py), runs the scenarios
of every collected kernel-marked test module (module attribute SCENARIOS, else the module name
test_<scenario>.py), and each test reads its scenario's result. A missing tool (qemu, kernel,
vng) fails the tests with the package to install; it never skips. RNIC_KERNEL_LAB_OUT=DIR keeps the
results there (default: a pytest temporary directory).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.kernel.vm import SECOND_KERNEL_SCENARIOS, LabSetupError, RunReport, all_scenarios, run_lab

OUT_ENV = "RNIC_KERNEL_LAB_OUT"
# Assert on the results a run kept (`scripts/kernel-lab --keep-out DIR`) instead of booting: DIR/<scenario>/.
KEPT_ENV = "RNIC_KERNEL_LAB_KEPT"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kernel: boots the real Linux RDMA stack (rdma_rxe) under QEMU (the kernel lab)")


def _module_scenarios(module: object) -> list[str]:
    wanted = getattr(module, "SCENARIOS", None)
    if wanted is None and module is not None:
        stem = Path(str(getattr(module, "__file__", ""))).stem.removeprefix("test_")
        wanted = [stem] if stem in set(all_scenarios()) else []
    return list(wanted or [])


def _scenarios_of(session: pytest.Session) -> list[str]:
    names: list[str] = []
    for item in session.items:
        if item.get_closest_marker("kernel") is None:
            continue
        for name in _module_scenarios(getattr(item, "module", None)):
            if name not in names:
                names.append(name)
    return names


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module whose scenarios all run on the second kernel too is tested on both (ids [first],
    [second]); the rest on the first only (vm.SECOND_KERNEL_SCENARIOS says why)."""
    if "kernel_lab" not in metafunc.fixturenames:
        return
    wanted = _module_scenarios(metafunc.module)
    both = bool(wanted) and set(wanted) <= set(SECOND_KERNEL_SCENARIOS)
    metafunc.parametrize("kernel_lab", ["first", "second"] if both else ["first"], indirect=True, scope="session")


@pytest.fixture(scope="session")
def kernel_lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> RunReport:
    """One boot per kernel this session: the first kernel runs every selected scenario, the second
    those of them in SECOND_KERNEL_SCENARIOS."""
    which = str(getattr(request, "param", "first"))
    reports = request.config.stash.setdefault(_REPORTS, {})
    if which in reports:
        return reports[which]
    names = _scenarios_of(request.session)
    if which == "second":
        names = [n for n in names if n in SECOND_KERNEL_SCENARIOS]
    if not names:
        pytest.fail("no kernel scenarios selected", pytrace=False)
    if os.environ.get(KEPT_ENV):
        reports[which] = RunReport(Path(os.environ[KEPT_ENV]), "kept", names, kernel=f"kept in {os.environ[KEPT_ENV]}")
        return reports[which]
    out = Path(os.environ[OUT_ENV]) / which if os.environ.get(OUT_ENV) else tmp_path_factory.mktemp(f"lab-{which}")
    try:
        report = run_lab(names, out, kernel=which)
    except LabSetupError as exc:
        pytest.fail(str(exc), pytrace=False)
    reports[which] = report
    return report


_REPORTS = pytest.StashKey[dict[str, RunReport]]()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The lab's figures at the end of every run, passed or failed, `-q` or not: which accelerator
    ran, boot and scenario times, and each real event's latency as the exporter saw it."""
    reports = config.stash.get(_REPORTS, {})
    if not reports:
        return
    terminalreporter.section("kernel lab")
    for report in reports.values():
        for line in report.summary().splitlines():
            terminalreporter.write_line(line)
        events = report.result("events")
        if isinstance(events, dict) and isinstance(events.get("figures"), dict):
            for what, figure in sorted(events["figures"].items()):
                terminalreporter.write_line(f"  event {what}: in a scrape after {figure.get('scrape_s')} s ({figure})")
        nldev = report.result("nldev")
        if isinstance(nldev, dict) and isinstance(nldev.get("figures"), dict):
            terminalreporter.write_line(f"  nldev: {nldev['figures']}")


def scenario_result(report: RunReport, name: str) -> Any:
    """The scenario's result, or a test failure that says why there is none (a VM error, a traceback)."""
    result = report.result(name)
    if result is None:
        pytest.fail(f"scenario {name}: no result ({report.failure or 'the driver never got to it'})", pytrace=False)
    if isinstance(result, dict) and "error" in result and len(result) == 1:
        pytest.fail(f"scenario {name} failed in the VM:\n{result['error']}", pytrace=False)
    return result
