"""Which clients take part in a round."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from securefed.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class CohortSpec:
    """How a round's participants are drawn.

    ``"all"``: every client every round. ``"poisson"``: each client joins independently with
    probability ``fraction`` (what DP amplification by sampling assumes). ``"fixed"``: ``size``
    clients uniformly without replacement (accounted without amplification).
    """

    kind: Literal["all", "poisson", "fixed"]
    fraction: float = 1.0
    size: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("all", "poisson", "fixed"):
            raise ConfigError(f"cohort kind must be all, poisson or fixed, got {self.kind!r}")
        if self.kind == "poisson" and not 0 < self.fraction <= 1:
            raise ConfigError(f"client fraction must be in (0, 1], got {self.fraction!r}")
        if self.kind == "fixed" and self.size < 1:
            raise ConfigError(f"clients per round must be a positive integer, got {self.size!r}")

    def sample_rate(self, n_users: int) -> float:
        """The per-client sampling probability a DP accountant may use (1 without Poisson)."""
        return self.fraction if self.kind == "poisson" else 1.0

    def expected_size(self, n_users: int) -> float:
        if self.kind == "all":
            return float(n_users)
        if self.kind == "poisson":
            return self.fraction * n_users
        return float(min(self.size, n_users))


def sample_cohort(spec: CohortSpec, n_users: int, generator: torch.Generator) -> torch.Tensor:
    """Sorted int64 user indices of one round's cohort."""
    if spec.kind == "all":
        return torch.arange(n_users, dtype=torch.long)
    if spec.kind == "poisson":
        keep = torch.rand(n_users, generator=generator, dtype=torch.float64) < spec.fraction
        return torch.nonzero(keep).squeeze(1)
    if spec.size > n_users:
        raise ConfigError(
            f"clients per round ({spec.size}) exceeds the number of users ({n_users}); "
            "lower --clients-per-round"
        )
    chosen = torch.randperm(n_users, generator=generator)[: spec.size]
    return torch.sort(chosen).values
