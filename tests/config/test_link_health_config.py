"""The config file's [link_health] section: every threshold of detect/link_health.py, validated like the rest."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rnic_exporter.catalog.link_health import LinkHealthThresholds
from rnic_exporter.config.bounds import LINK_HEALTH
from rnic_exporter.config.file import parse_file
from rnic_exporter.detect.settings import DetectionSettings
from rnic_exporter.errors import ConfigError


def test_every_threshold_has_a_key() -> None:
    assert set(LINK_HEALTH) == {f.name for f in dataclasses.fields(LinkHealthThresholds)}


def test_the_file_overrides_the_defaults(tmp_path: Path) -> None:
    text = b'[link_health]\nsymbol_error_ber = 1e-13\nmin_errors = 5\ncheck_window_seconds = "2s"\n'
    loaded = parse_file(tmp_path / "c.toml", text)
    got = loaded.detection(DetectionSettings()).link_health
    assert got == dataclasses.replace(
        LinkHealthThresholds(), symbol_error_ber=1e-13, min_errors=5, check_window_seconds=2.0
    )
    assert isinstance(got.min_errors, int)
    yaml_text = b"link_health:\n  retransmission_ratio: 0.001\n"
    from_yaml = parse_file(tmp_path / "c.yaml", yaml_text).detection(DetectionSettings()).link_health
    assert from_yaml.retransmission_ratio == 0.001 and from_yaml.symbol_error_ber == 1e-12


@pytest.mark.parametrize(
    "text, message",
    [
        (b"[link_health]\nsymbol_error_ber = 2\n", "link_health.symbol_error_ber"),
        (b"[link_health]\nretransmission_ratio = nan\n", "link_health.retransmission_ratio"),
        (b"[link_health]\ncheck_window_seconds = 600\n", "link_health.check_window_seconds"),
        (b"[link_health]\nsymbol_error = 3\n", "link_health.symbol_error: unknown key"),
    ],
)
def test_bad_values_are_named(tmp_path: Path, text: bytes, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        parse_file(tmp_path / "c.toml", text)
