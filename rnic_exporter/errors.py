"""Errors that reach a user: each says what was wrong, where, and what to do."""


class ConfigError(Exception):
    """A flag, config file or path the operator gave us is unusable (exit code 2)."""


class NotReadyError(Exception):
    """There is nothing true to serve yet (before the first poll): the request gets 503 and this message."""
