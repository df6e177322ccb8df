"""The one exception hierarchy of securefed.

It lives in the base layer so that :mod:`protocols` can raise it without importing
:mod:`securefed`; :mod:`securefed.errors` re-exports it. Messages say what was wrong, the
offending value and what to do; they never contain keys, seeds or client updates.
"""

from __future__ import annotations


class SecureFedError(Exception):
    """Base class of every error securefed raises on purpose (user mistakes, bad data, attacks)."""


class ConfigError(SecureFedError, ValueError):
    """A configuration value, flag or argument is invalid."""


class DataError(SecureFedError):
    """A dataset is missing, malformed or unusable."""


class ProtocolError(SecureFedError):
    """A privacy protocol cannot proceed (e.g. too few survivors, out-of-order stage)."""


class IntegrityError(ProtocolError):
    """A protocol message failed validation.

    Raised for every tampered, truncated, replayed, mis-addressed or malformed message with
    one fixed message, so that an attacker learns nothing from which check failed.
    """

    def __init__(self, message: str = "protocol message failed integrity validation") -> None:
        super().__init__(message)


class PrivacyBudgetError(SecureFedError):
    """Continuing would spend more privacy budget than the configured target."""
