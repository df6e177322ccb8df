"""Privacy protocols for federated learning: differential privacy and secure aggregation.

This is securefed's base layer. It depends only on numpy, torch, cryptography and opacus and
never imports :mod:`securefed` or :mod:`attacks`. The seeding helpers are imported on first
use (PEP 562), so importing the errors does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from protocols.errors import (
    ConfigError,
    DataError,
    IntegrityError,
    PrivacyBudgetError,
    ProtocolError,
    SecureFedError,
)

if TYPE_CHECKING:
    from protocols.seeding import derive_seed, numpy_generator, torch_generator

_LAZY = ("derive_seed", "numpy_generator", "torch_generator")


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'protocols' has no attribute {name!r}")
    from protocols import seeding

    return getattr(seeding, name)


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
