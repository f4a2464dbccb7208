"""Errors that reach a user: each says what was wrong, where, and what to do."""


def extra_hint(extra: str) -> str:
    """How to install an optional extra. rnic-exporter is on no package index: from the checkout or
    the wheel that was installed, never by its name."""
    return (
        f"reinstall with it from the checkout (pip install '.[{extra}]') or the wheel "
        f"(pip install 'dist/rnic_exporter-<version>-py3-none-any.whl[{extra}]')"
    )


class ConfigError(Exception):
    """A flag, config file or path the operator gave us is unusable (exit code 2)."""


class NotReadyError(Exception):
    """There is nothing true to serve yet (before the first poll): the request gets 503 and this message."""
