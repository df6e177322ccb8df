"""EASE: a CENTRALIZED reference (the server sees every interaction).

Embarrassingly Shallow Autoencoder (Steck, WWW 2019): an item-item weight matrix ``B`` with a
zero diagonal minimising ``||X - X B||^2 + lambda ||B||^2`` over the training matrix ``X``, in
closed form::

    P = (X^T X + lambda I)^{-1},   B = I - P diag(1 / diag(P))

A user is scored by ``X_u B``. It is here as a yardstick of what the data allows without
privacy; it has no federated protocol, so securefed refuses it under ``--epsilon`` and
``--secagg`` and labels it centralized in every output. Memory: ``n_items^2`` floats
(2.6 GB at 26k items), checked before the fit.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from securefed.costs import DOT_EVAL_S, CostInputs, ModelCosts, ModelWork
from securefed.data.types import Split
from securefed.errors import ConfigError
from securefed.federation.base import RoundStats
from securefed.models.registry import ModelSpec
from securefed.validation import check_field_types

__all__ = ["EASE", "EASEConfig", "SPEC"]

#: Largest item-item matrix EASE builds (floats); a bigger catalogue is refused up front.
MAX_ITEM_MATRIX = 1 << 30


@dataclass(frozen=True, kw_only=True)
class EASEConfig:
    """EASE settings: ``lam`` is the L2 weight (500 suits MovieLens 100K)."""

    lam: float = 500.0

    def __post_init__(self) -> None:
        check_field_types(self)  # the checks below assume the types
        if not (isinstance(self.lam, int | float) and math.isfinite(self.lam) and self.lam > 0):
            raise ConfigError(f"lam must be a finite number > 0, got {self.lam!r}")


class EASE:
    """Closed-form EASE fitted in round 1 (module docstring)."""

    name = "ease"

    def __init__(
        self,
        split: Split,
        config: EASEConfig,
        *,
        generator: torch.Generator | None = None,
        device: str | torch.device = "cpu",
        dpsgd: Any = None,
        noise_seed: int = 0,
    ) -> None:
        n = split.n_items
        if n * n > MAX_ITEM_MATRIX:
            raise ConfigError(
                f"EASE needs an {n} x {n} item matrix ({4 * n * n / 2**30:.1f} GiB); above the "
                f"{4 * MAX_ITEM_MATRIX / 2**30:.0f} GiB limit: use --model ials for this catalogue"
            )
        self.split = split
        self.config = config
        self.B = torch.zeros(n, n, dtype=torch.float32)
        self._x = _train_matrix(split)

    def fit_round(self, round_index: int, generator: torch.Generator | None) -> RoundStats:
        """The closed-form fit (the same in every round; one round is all it needs)."""
        x = self._x.to(torch.float64)
        gram = x.T @ x
        gram.diagonal().add_(float(self.config.lam))
        p = torch.linalg.inv(gram)
        b = -p / p.diagonal().unsqueeze(0)
        b.diagonal().zero_()
        self.B = b.to(torch.float32)
        residual = x - x @ b
        loss = float((residual * residual).sum() / max(self.split.n_users, 1))
        return RoundStats(loss=loss, samples=int(self.split.n_train))

    def score(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        u = users.to(torch.long).cpu()
        return torch.gather(self._x[u] @ self.B, 1, items.to(torch.long).cpu())

    def score_all(self, users: torch.Tensor) -> torch.Tensor:
        return self._x[users.to(torch.long).cpu()] @ self.B

    def state_dict(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "B": self.B.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        b = state.get("B")
        if not isinstance(b, torch.Tensor) or tuple(b.shape) != tuple(self.B.shape):
            raise ConfigError("state entry B does not match this catalogue; wrong run?")
        self.B = b.to(torch.float32).clone()


def _train_matrix(split: Split) -> torch.Tensor:
    """The dense binary user x item training matrix (float32)."""
    users = split.train_users()
    x = torch.zeros(split.n_users, split.n_items, dtype=torch.float32)
    x[torch.from_numpy(users), torch.from_numpy(np.asarray(split.train_items, dtype=np.int64))] = 1
    return x


def _work(inputs: CostInputs) -> ModelWork:
    """The Gram matrix, its inverse and the scores (float32 ``items x items`` each), solved
    once; full ranking multiplies the users' rows by ``B``."""
    u, i = inputs.shape.users, inputs.shape.items
    full = DOT_EVAL_S * u * i * i / 32
    return ModelWork(
        round_bytes=3 * i * i * 4 + u * i * 4,
        round_seconds=2.0e-10 * i**3,
        full_eval_seconds=full,
        eval_seconds=full / 10,
    )


SPEC = ModelSpec(
    name="ease",
    title="EASE (Steck, WWW 2019): CENTRALIZED reference, the server sees all data",
    params=EASEConfig,
    build=EASE,
    role="centralized",
    default_rounds=1,
    costs=ModelCosts(state=lambda params, shape, rows: {"B": shape.items**2 * 4}, work=_work),
)
