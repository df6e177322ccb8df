"""Privacy protocols for federated learning: differential privacy and secure aggregation.

This is securefed's base layer. It depends only on numpy, torch, cryptography and opacus and
never imports :mod:`securefed` or :mod:`attacks`.
"""

from protocols.errors import (
    ConfigError,
    DataError,
    IntegrityError,
    PrivacyBudgetError,
    ProtocolError,
    SecureFedError,
)
from protocols.seeding import derive_seed, numpy_generator, torch_generator

__all__ = [
    "ConfigError",
    "DataError",
    "IntegrityError",
    "PrivacyBudgetError",
    "ProtocolError",
    "SecureFedError",
    "derive_seed",
    "numpy_generator",
    "torch_generator",
]
