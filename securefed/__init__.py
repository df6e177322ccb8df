"""securefed: privacy-hardened federated recommendation.

The public API: :func:`train` (and :class:`TrainConfig`, :class:`PrivacyConfig`), the data
layer in :mod:`securefed.data`, the models in :mod:`securefed.models` and evaluation in
:mod:`securefed.evaluation`. The CLI (``securefed ...``) is a thin layer over these.
"""

from securefed.config import PrivacyConfig, TrainConfig
from securefed.errors import (
    ConfigError,
    DataError,
    IntegrityError,
    PrivacyBudgetError,
    ProtocolError,
    SecureFedError,
)
from securefed.models.fedrap import FedRAPConfig
from securefed.models.fedrecgel import FedRecGELConfig
from securefed.models.registry import get_spec, model_names
from securefed.training import TrainResult, train

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DataError",
    "FedRAPConfig",
    "FedRecGELConfig",
    "IntegrityError",
    "PrivacyBudgetError",
    "PrivacyConfig",
    "ProtocolError",
    "SecureFedError",
    "TrainConfig",
    "TrainResult",
    "get_spec",
    "model_names",
    "train",
]
