"""Which clients take part in a round.

A DP run's cohorts come from OS randomness (:func:`round_cohort` with ``secure=True``):
amplification by sampling assumes the observer cannot tell who was sampled, and a cohort
derived from a seed written in the run directory would tell it. Replay runs and runs without
DP derive each round's cohort from the seed (``derive(seed, "cohort", round)``).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Literal

import torch

from protocols.seeding import torch_generator
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


def sample_cohort(
    spec: CohortSpec, n_users: int, generator: torch.Generator | None, *, secure: bool = False
) -> torch.Tensor:
    """Sorted int64 user indices of one round's cohort.

    Args:
        spec: How the cohort is drawn.
        n_users: The population.
        generator: The round's seeded generator; must be ``None`` when ``secure``.
        secure: Draw from the OS (``os.urandom``): Poisson membership by one 53-bit OS uniform
            per user (``protocols.dp.noise.below``), a fixed-size cohort by
            ``secrets.SystemRandom().sample``.
    """
    if secure and generator is not None:
        raise ConfigError("a secure cohort is drawn from the OS and refuses a generator")
    if not secure and generator is None:
        raise ConfigError("pass the round's seeded generator, or secure=True for OS randomness")
    if spec.kind == "all":
        return torch.arange(n_users, dtype=torch.long)
    if spec.kind == "poisson":
        if secure:
            from protocols.dp.noise import below

            keep = below(torch.full((n_users,), spec.fraction, dtype=torch.float64), None, True)
        else:
            keep = torch.rand(n_users, generator=generator, dtype=torch.float64) < spec.fraction
        return torch.nonzero(keep).squeeze(1)
    if spec.size > n_users:
        raise ConfigError(
            f"clients per round ({spec.size}) exceeds the number of users ({n_users}); "
            "lower --clients-per-round"
        )
    if secure:
        chosen = torch.tensor(
            secrets.SystemRandom().sample(range(n_users), spec.size), dtype=torch.long
        )
    else:
        chosen = torch.randperm(n_users, generator=generator)[: spec.size]
    return torch.sort(chosen).values


def round_cohort(
    spec: CohortSpec, n_users: int, *, seed: int, round_index: int, secure: bool
) -> torch.Tensor:
    """The cohort of round ``round_index``: from the OS when ``secure`` (every DP run unless
    it replays), else from ``derive(seed, "cohort", round_index)``."""
    if secure:
        return sample_cohort(spec, n_users, None, secure=True)
    return sample_cohort(spec, n_users, torch_generator(seed, "cohort", round_index))
