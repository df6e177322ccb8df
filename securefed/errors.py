"""securefed's exception hierarchy (defined in :mod:`protocols.errors`, the base layer)."""

from protocols.errors import (
    ConfigError,
    DataError,
    IntegrityError,
    PrivacyBudgetError,
    ProtocolError,
    SecureFedError,
)

__all__ = [
    "ConfigError",
    "DataError",
    "IntegrityError",
    "PrivacyBudgetError",
    "ProtocolError",
    "SecureFedError",
]
