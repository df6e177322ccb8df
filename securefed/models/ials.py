"""iALS: a CENTRALIZED reference (the server sees every interaction).

Implicit ALS (Hu, Koren, Volinsky, ICDM 2008) with the Gramian trick and the tuning advice of
Rendle et al. ("Revisiting the performance of iALS on item recommendation benchmarks", RecSys
2022): one round is one full sweep, the exact user step then the exact item step
(:mod:`securefed.models.als_math`). It is the quality the federated fedals aims for; it has no
federated protocol, so securefed refuses it under ``--epsilon`` and ``--secagg`` and labels it
centralized in every output.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from securefed.costs import CostInputs, ModelCosts, ModelWork, RunShape
from securefed.data.types import Split
from securefed.errors import ConfigError
from securefed.federation.base import RoundStats
from securefed.models.als_math import frequency_reg, solve_side
from securefed.models.fedals import (
    ALS_SECONDS,
    FedALSConfig,
    als_work,
    resolve_dim,
    resolve_dim_for_data,
    resolve_for_costs,
    resolve_reg,
)
from securefed.models.registry import ModelSpec

__all__ = ["IALS", "SPEC"]


class IALS:
    """Centralized implicit ALS, one sweep per round (module docstring).

    Takes fedals's hyperparameters (``dim``, ``alpha``, ``reg``, ``reg_frequency``,
    ``init_std``) and its regularisation rule (:func:`~securefed.models.fedals.resolve_reg`),
    so the two are compared at the same settings.
    """

    name = "ials"

    def __init__(
        self,
        split: Split,
        config: FedALSConfig,
        *,
        generator: torch.Generator,
        device: str | torch.device = "cpu",
        dpsgd: Any = None,
        noise_seed: int = 0,
    ) -> None:
        config = resolve_dim(resolve_reg(config), split.n_items)
        self.split = split
        self.config = config
        d = config.factor_dim
        self.V = torch.randn(split.n_items, d, generator=generator) * config.init_std
        self.X = torch.zeros(split.n_users, d)
        self._users = torch.from_numpy(split.train_users())
        self._items = torch.from_numpy(np.asarray(split.train_items, dtype=np.int64))
        # Every row's L2 weight (one number without frequency scaling).
        self._reg_x: float | torch.Tensor = float(config.reg)
        self._reg_v: float | torch.Tensor = float(config.reg)
        if config.reg_frequency:
            kw = {"alpha": float(config.alpha), "reg": float(config.reg)}
            n_user = torch.bincount(self._users, minlength=split.n_users)
            n_item = torch.bincount(self._items, minlength=split.n_items)
            self._reg_x = frequency_reg(n_user, split.n_items, **kw).to(torch.float32)
            self._reg_v = frequency_reg(n_item, split.n_users, **kw).to(torch.float32)

    def fit_round(self, round_index: int, generator: torch.Generator | None) -> RoundStats:
        """One sweep: every user's exact solve, then every item's."""
        cfg = self.config
        alpha = float(cfg.alpha)
        self.X = solve_side(
            self.V, self._users, self._items, self.split.n_users, alpha=alpha, reg=self._reg_x
        )
        self.V = solve_side(
            self.X, self._items, self._users, self.split.n_items, alpha=alpha, reg=self._reg_v
        )
        s = (self.X[self._users] * self.V[self._items]).sum(1)
        g = self.V.T @ self.V
        loss = float(
            ((self.X @ g) * self.X).sum()
            + ((1.0 + cfg.alpha) * (1.0 - s) ** 2 - s * s).sum()
            + (self._reg_x * (self.X * self.X).sum(1)).sum()
            + (self._reg_v * (self.V * self.V).sum(1)).sum()
        ) / max(self.split.n_users, 1)
        return RoundStats(loss=loss, samples=int(self._items.shape[0]))

    def score(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        x = self.X[users.to(torch.long).cpu()]
        return (x.unsqueeze(1) * self.V[items.to(torch.long).cpu()]).sum(-1)

    def score_all(self, users: torch.Tensor) -> torch.Tensor:
        return self.X[users.to(torch.long).cpu()] @ self.V.T

    def state_dict(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "X": self.X.clone(), "V": self.V.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, want in (("X", self.X), ("V", self.V)):
            got = state.get(name)
            if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                raise ConfigError(f"state entry {name} does not match this data; wrong run?")
        self.X = state["X"].to(torch.float32).clone()
        self.V = state["V"].to(torch.float32).clone()


def _state_bytes(params: FedALSConfig, shape: RunShape, written_rows: int | None) -> dict[str, int]:
    d = resolve_dim(params, shape.items).factor_dim
    return {"X": shape.users * d * 4, "V": shape.items * d * 4}


def _work(inputs: CostInputs) -> ModelWork:
    """Two sides of a sweep over every interaction (no cohort)."""
    d = resolve_dim(inputs.config.params, inputs.shape.items).factor_dim
    shape = inputs.shape
    sweep = ALS_SECONDS * (
        2 * shape.train_interactions * d * d + (shape.users + shape.items) * d**3
    )
    return als_work(inputs, sweep_seconds=sweep)


SPEC = ModelSpec(
    name="ials",
    title="iALS (Hu et al. 2008; Rendle et al. 2022): CENTRALIZED reference, all data",
    params=FedALSConfig,
    build=IALS,
    role="centralized",
    # fedals's regularisation rule, so config.toml records what ran.
    resolve_params=lambda params, privacy: resolve_reg(params),
    # fedals's dimension rule, decided from the catalogue when the data is loaded.
    resolve_for_data=lambda config, split: (resolve_dim_for_data(config, split), None),
    # Ten sweeps: test HR@10 still rises 0.01 between sweeps 5 and 10 on MovieLens 100K.
    default_rounds=10,
    costs=ModelCosts(state=_state_bytes, work=_work, resolve=resolve_for_costs),
)
