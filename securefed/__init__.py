"""securefed: privacy-hardened federated recommendation.

The public API: :func:`train` (and :class:`TrainConfig`, :class:`PrivacyConfig`,
:func:`with_private_mode`), :func:`run_report` (and :class:`ReportConfig`), the data layer in
:mod:`securefed.data`, the models in :mod:`securefed.models` and evaluation in
:mod:`securefed.evaluation`; the audit is :func:`attacks.audit.audit` (the ``attacks``
package builds on this one, not the other way round). The CLI (``securefed ...``) is a thin
layer over these.

Everything but the errors is imported on first use (PEP 562), so ``import securefed`` and
``securefed --help`` do not wait for torch.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from securefed.errors import (
    ConfigError,
    DataError,
    IntegrityError,
    PrivacyBudgetError,
    ProtocolError,
    SecureFedError,
)

if TYPE_CHECKING:
    from securefed.config import PrivacyConfig, TrainConfig, with_private_mode
    from securefed.models.fedrap import FedRAPConfig
    from securefed.models.fedrecgel import FedRecGELConfig
    from securefed.models.registry import get_spec, model_names
    from securefed.released import ReleasedModel, load_released
    from securefed.report import ReportConfig, run_report
    from securefed.training import TrainResult, train

__version__ = "0.1.0"

#: Public name -> the module that defines it (imported when the name is first used).
_LAZY = {
    "FedRAPConfig": "securefed.models.fedrap",
    "FedRecGELConfig": "securefed.models.fedrecgel",
    "PrivacyConfig": "securefed.config",
    "ReleasedModel": "securefed.released",
    "ReportConfig": "securefed.report",
    "TrainConfig": "securefed.config",
    "TrainResult": "securefed.training",
    "get_spec": "securefed.models.registry",
    "load_released": "securefed.released",
    "model_names": "securefed.models.registry",
    "run_report": "securefed.report",
    "train": "securefed.training",
    "with_private_mode": "securefed.config",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        # A submodule (``securefed.runs``, ``securefed.evaluation``): reachable after a plain
        # ``import securefed``, as when this file imported them all.
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'securefed' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ConfigError",
    "DataError",
    "FedRAPConfig",
    "FedRecGELConfig",
    "IntegrityError",
    "PrivacyBudgetError",
    "PrivacyConfig",
    "ProtocolError",
    "ReleasedModel",
    "ReportConfig",
    "SecureFedError",
    "TrainConfig",
    "TrainResult",
    "get_spec",
    "load_released",
    "model_names",
    "run_report",
    "train",
    "with_private_mode",
]
