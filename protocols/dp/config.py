"""The user-facing DP configuration and the privacy summary written into every report."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Literal

from protocols.dp.accounting import (
    ACCOUNTANTS,
    calibrate_noise_multiplier,
    check_delta,
    check_epsilon,
    check_noise_multiplier,
)
from protocols.dp.clipping import _check_clip
from protocols.dp.ledger import PrivacyLedger
from protocols.errors import ConfigError

PRIVACY_UNITS: tuple[str, ...] = ("user", "interaction")
PLACEMENTS: tuple[str, ...] = ("central", "distributed")


@dataclass(frozen=True, kw_only=True)
class DPConfig:
    """Differential-privacy settings of a training run.

    Give ``epsilon`` to calibrate the noise multiplier for the whole run; give
    ``noise_multiplier`` to fix it (and, if ``epsilon`` is also given, treat epsilon as a
    budget cap that stops training with PrivacyBudgetError).

    Attributes:
        epsilon: Target epsilon, or None when ``noise_multiplier`` is fixed.
        delta: Target delta in (0, 1); must also be below 1/n_users (checked once the
            population is known, see :meth:`check_population`).
        noise_multiplier: Fixed sigma, or None to calibrate from ``epsilon``.
        clip: L2 clip C of each participant's update.
        accountant: ``"prv"`` (default) or ``"rdp"``.
        placement: ``"central"`` (trusted server adds noise) or ``"distributed"`` (clients
            add discrete Gaussian shares inside secure aggregation; needs ``"rdp"``).
        privacy_unit: ``"user"`` (DP-FedAvg, default) or ``"interaction"`` (DP-SGD on the
            client's interactions).
        secure: Draw noise from OS randomness with floating-point hardening.
    """

    epsilon: float | None = None
    delta: float = 1e-5
    noise_multiplier: float | None = None
    clip: float
    accountant: Literal["prv", "rdp"] = "prv"
    placement: Literal["central", "distributed"] = "central"
    privacy_unit: Literal["user", "interaction"] = "user"
    secure: bool = False

    def __post_init__(self) -> None:
        if self.epsilon is None and self.noise_multiplier is None:
            raise ConfigError(
                "give epsilon (to calibrate the noise) or noise_multiplier (to fix it), got neither"
            )
        if self.epsilon is not None:
            check_epsilon(self.epsilon)
        check_delta(self.delta)
        if self.noise_multiplier is not None:
            check_noise_multiplier(self.noise_multiplier)
        _check_clip(self.clip)
        if self.accountant not in ACCOUNTANTS:
            raise ConfigError(f"accountant must be one of {ACCOUNTANTS}, got {self.accountant!r}")
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.privacy_unit not in PRIVACY_UNITS:
            raise ConfigError(
                f"privacy_unit must be one of {PRIVACY_UNITS}, got {self.privacy_unit!r}"
            )
        if not isinstance(self.secure, bool):
            raise ConfigError(f"secure must be True or False, got {self.secure!r}")
        if self.placement == "distributed" and self.accountant == "prv":
            raise ConfigError(
                "placement='distributed' adds discrete Gaussian noise whose guarantee is an RDP "
                "bound (Kairouz et al. 2021), which the PRV accountant cannot take; set "
                "accountant='rdp'"
            )

    def check_population(self, n_users: int | None) -> None:
        """Refuse ``delta >= 1 / n_users`` with a ConfigError (``None``: population unknown)."""
        check_delta(self.delta, n_users=n_users)

    def resolve_noise_multiplier(
        self, *, sample_rate: float, steps: int, n_users: int | None
    ) -> float:
        """The central-placement sigma: fixed, or calibrated from epsilon without overshoot.

        For ``placement="distributed"`` calibrate with
        :func:`protocols.dp.calibrate_distributed_noise_multiplier`, which needs the ring's
        scale and dimension.
        """
        self.check_population(n_users)
        if self.noise_multiplier is not None:
            return float(self.noise_multiplier)
        if self.placement == "distributed":
            raise ConfigError(
                "placement='distributed' is calibrated with "
                "calibrate_distributed_noise_multiplier (it needs the fixed-point scale and dim)"
            )
        return calibrate_noise_multiplier(
            epsilon=float(self.epsilon),  # type: ignore[arg-type]
            delta=self.delta,
            sample_rate=sample_rate,
            steps=steps,
            accountant=self.accountant,
            n_users=n_users,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible dict of the resolved config."""
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "clip": self.clip,
            "accountant": self.accountant,
            "placement": self.placement,
            "privacy_unit": self.privacy_unit,
            "secure": self.secure,
        }


def privacy_summary(config: DPConfig, ledger: PrivacyLedger) -> dict[str, Any]:
    """The privacy statement of a run, as a JSON-compatible dict (pure; nothing is mutated).

    Keys: ``epsilon`` (spent, by ``config.accountant`` at ``config.delta``), ``delta``,
    ``noise_multiplier`` (the nominal sigma of the recorded events, or the configured one
    before any round), ``clip``, ``accountant``, ``privacy_unit``, plus ``placement``,
    ``rounds`` (the distinct rounds of the recorded events: a round released again after a
    resume, or one of several DP-SGD steps, counts once), ``target_epsilon`` and
    ``sample_rate``.
    """
    events = ledger.events
    sigmas = sorted({e.noise_multiplier for e in events})
    rates = sorted({e.sample_rate for e in events})
    if not sigmas:
        sigma: float | list[float] | None = config.noise_multiplier
    else:
        sigma = sigmas[0] if len(sigmas) == 1 else sigmas
    eps = ledger.epsilon(config.delta, config.accountant)
    return {
        "epsilon": float(eps) if math.isfinite(eps) else None,
        "delta": config.delta,
        "noise_multiplier": sigma,
        "clip": config.clip,
        "accountant": config.accountant,
        "privacy_unit": config.privacy_unit,
        "placement": config.placement,
        "rounds": len({e.round for e in events}),
        "target_epsilon": config.epsilon,
        "sample_rate": (rates[0] if len(rates) == 1 else rates) if rates else None,
    }


def interaction_sample_rate(*, batch_size: int, n_interactions: int) -> float:
    """Poisson sample rate of one interaction in client-side DP-SGD: ``batch / n``.

    For ``privacy_unit="interaction"`` the unit is one (user, item) interaction; with
    Poisson batches of expected size ``batch_size`` out of ``n_interactions`` rows the
    per-step sample rate is ``batch_size / n_interactions`` (Abadi et al. 2016, Sec. 3.1)
    and ``steps = epochs * n_interactions / batch_size``.
    """
    for name, v in (("batch_size", batch_size), ("n_interactions", n_interactions)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
    if batch_size > n_interactions:
        raise ConfigError(
            f"batch_size {batch_size} exceeds the number of interactions {n_interactions}"
        )
    return batch_size / n_interactions
