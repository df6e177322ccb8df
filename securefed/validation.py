"""Small shared checks for config dataclasses (one message style everywhere)."""

from __future__ import annotations

from securefed.errors import ConfigError


def positive_int(name: str, value: object) -> None:
    """Raise ConfigError unless ``value`` is an int >= 1 (bools are refused)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
