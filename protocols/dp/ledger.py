"""The privacy ledger: one immutable event per noisy release, replayed into an accountant.

Modelled on Google dp_accounting's ``DpEvent``: a mechanism is an immutable record and the
accountant consumes records. Events are validated in full before the ledger changes.
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

import numpy as np

from protocols.dp.accounting import (
    check_accountant,
    check_delta,
    check_epsilon,
    check_noise_multiplier,
    check_sample_rate,
    ddg_rdp,
    gaussian_epsilon,
    gaussian_rdp,
    poisson_subsampled_rdp,
    rdp_orders,
    rdp_to_epsilon,
)
from protocols.errors import ConfigError, PrivacyBudgetError

GAUSSIAN = "gaussian"
DISTRIBUTED_GAUSSIAN = "distributed_gaussian"
DISTRIBUTED_DISCRETE_GAUSSIAN = "distributed_discrete_gaussian"
MECHANISMS: tuple[str, ...] = (GAUSSIAN, DISTRIBUTED_GAUSSIAN, DISTRIBUTED_DISCRETE_GAUSSIAN)
Placement = Literal["central", "distributed", "local"]
PRIVACY_UNITS: tuple[str, ...] = ("user", "interaction")


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _is_real(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real)


@dataclass(frozen=True, kw_only=True)
class PrivacyEvent:
    """One noisy release of a sum of clipped participant updates.

    Attributes:
        round: Training round index (>= 0).
        mechanism: ``"gaussian"`` (central continuous noise), ``"distributed_gaussian"``
            (continuous shares, one per client) or ``"distributed_discrete_gaussian"``
            (integer shares in the secure-aggregation ring).
        noise_multiplier: The calibrated (nominal) sigma: noise std / clip at the assumed
            minimum number of survivors.
        sample_rate: Poisson sampling probability of a participant; 1 for fixed cohorts.
        clip: The L2 clip C of each participant's update (float units).
        noise_contributors: Number of parties whose noise is in the released sum and unknown
            to the adversary accounted against (1 for central noise; for distributed noise
            the surviving clients, less those that may collude with the server where the
            caller's threat model has them: securefed counts ``ceil(g m)`` of ``m``).
        min_survivors: The fewest survivors the round may unmask (1 for central noise); the
            caller sizes the shares so that their honest ones carry the calibrated noise.
        placement: ``"central"``, ``"distributed"`` or ``"local"`` (the data owner adds the
            noise itself: one step of a client's DP-SGD, interaction unit).
        share_sigma: Discrete only: each share's scale, integer units.
        l2_sensitivity: Discrete only: L2 bound of a rounded update, integer units.
        l1_sensitivity: Discrete only: L1 bound of a rounded update, integer units.
        dim: Discrete only: number of coordinates.
        privacy_unit: ``"user"`` (one participant's update is the clipped row) or
            ``"interaction"`` (one example of a client's local DP-SGD). One ledger holds
            one unit.
    """

    round: int
    mechanism: str
    noise_multiplier: float
    sample_rate: float
    clip: float
    noise_contributors: int
    min_survivors: int
    placement: Placement
    share_sigma: float | None = None
    l2_sensitivity: float | None = None
    l1_sensitivity: float | None = None
    dim: int | None = None
    privacy_unit: Literal["user", "interaction"] = "user"

    def __post_init__(self) -> None:
        self._validate()
        # Normalise numpy scalars to Python types so that to_dict() is JSON-serialisable.
        for name in ("round", "noise_contributors", "min_survivors", "dim"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, int(v))
        for name in (
            "noise_multiplier",
            "sample_rate",
            "clip",
            "share_sigma",
            "l2_sensitivity",
            "l1_sensitivity",
        ):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, float(v))

    def _validate(self) -> None:
        r = self.round
        if isinstance(r, bool) or not isinstance(r, int | np.integer) or r < 0:
            raise ConfigError(f"round must be an integer >= 0, got {r!r}")
        if self.mechanism not in MECHANISMS:
            raise ConfigError(f"mechanism must be one of {MECHANISMS}, got {self.mechanism!r}")
        if self.placement not in ("central", "distributed", "local"):
            raise ConfigError(
                f"placement must be 'central', 'distributed' or 'local', got {self.placement!r}"
            )
        if self.privacy_unit not in PRIVACY_UNITS:
            raise ConfigError(
                f"privacy_unit must be one of {PRIVACY_UNITS}, got {self.privacy_unit!r}"
            )
        if (self.placement == "local") != (self.privacy_unit == "interaction"):
            raise ConfigError(
                "local placement (client-side DP-SGD) goes with privacy_unit='interaction' and "
                f"only with it; got placement {self.placement!r}, unit {self.privacy_unit!r}"
            )
        check_noise_multiplier(self.noise_multiplier)
        check_sample_rate(self.sample_rate)
        if not (_is_real(self.clip) and math.isfinite(self.clip) and self.clip > 0):
            raise ConfigError(f"clip must be a finite number > 0, got {self.clip!r}")
        _positive_int(self.noise_contributors, "noise_contributors")
        _positive_int(self.min_survivors, "min_survivors")
        central = self.mechanism == GAUSSIAN
        if central != (self.placement in ("central", "local")):
            raise ConfigError(
                f"mechanism {self.mechanism!r} does not match placement {self.placement!r}"
            )
        if central and (self.noise_contributors != 1 or self.min_survivors != 1):
            raise ConfigError(
                "central or local noise has exactly one contributor; got "
                f"noise_contributors={self.noise_contributors!r}, "
                f"min_survivors={self.min_survivors!r}"
            )
        discrete = self.mechanism == DISTRIBUTED_DISCRETE_GAUSSIAN
        extras = (self.share_sigma, self.l2_sensitivity, self.l1_sensitivity, self.dim)
        if not discrete and any(v is not None for v in extras):
            raise ConfigError(
                "share_sigma, l2_sensitivity, l1_sensitivity and dim belong to discrete events"
            )
        if discrete:
            if any(v is None for v in extras):
                raise ConfigError(
                    "a distributed_discrete_gaussian event needs share_sigma, l2_sensitivity, "
                    "l1_sensitivity and dim"
                )
            for name in ("share_sigma", "l2_sensitivity", "l1_sensitivity"):
                v = getattr(self, name)
                if not (_is_real(v) and math.isfinite(v) and v > 0):
                    raise ConfigError(f"{name} must be a finite number > 0, got {v!r}")
            if self.share_sigma < 0.5:  # type: ignore[operator]
                raise ConfigError(
                    f"share_sigma must be >= 0.5 integer units, got {self.share_sigma!r}"
                )
            _positive_int(self.dim, "dim")

    @property
    def effective_noise_multiplier(self) -> float:
        """Noise std / sensitivity actually present in the released sum (continuous only).

        Central: sigma. Distributed continuous shares of variance ``sigma^2 C^2 / t`` from
        ``n`` survivors: ``sigma * sqrt(n / t)`` (below sigma when fewer than t survived).
        """
        if self.mechanism == GAUSSIAN:
            return float(self.noise_multiplier)
        if self.mechanism == DISTRIBUTED_GAUSSIAN:
            return float(self.noise_multiplier) * math.sqrt(
                self.noise_contributors / self.min_survivors
            )
        raise ConfigError(
            "a distributed discrete Gaussian event has no exact Gaussian noise multiplier; "
            "it is accounted through its RDP bound"
        )

    def rdp(self, orders: Iterable[float]) -> np.ndarray:
        """This event's RDP at ``orders`` (amplified by Poisson subsampling if q < 1; a
        subsampled discrete event needs integer orders)."""
        orders = list(orders)
        if self.mechanism != DISTRIBUTED_DISCRETE_GAUSSIAN:
            return gaussian_rdp(
                orders,
                noise_multiplier=self.effective_noise_multiplier,
                sample_rate=self.sample_rate,
            )

        def base(alpha: np.ndarray) -> np.ndarray:
            return ddg_rdp(
                alpha,
                share_sigma=float(self.share_sigma),  # type: ignore[arg-type]
                l2_sensitivity=float(self.l2_sensitivity),  # type: ignore[arg-type]
                l1_sensitivity=float(self.l1_sensitivity),  # type: ignore[arg-type]
                dim=int(self.dim),  # type: ignore[arg-type]
                n_contributors=self.noise_contributors,
            )

        return poisson_subsampled_rdp(base, orders, self.sample_rate)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible dict of every field."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyEvent:
        """Rebuild (and re-validate) an event from :meth:`to_dict` output."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown privacy event fields {unknown!r}")
        try:
            return cls(**dict(data))
        except TypeError as err:
            raise ConfigError(f"malformed privacy event: {err}") from err

    def _key(self) -> tuple[Any, ...]:
        return tuple(v for k, v in asdict(self).items() if k != "round")


class PrivacyLedger:
    """An append-only list of :class:`PrivacyEvent` that accounts for their composition.

    Args:
        events: Events to start from (e.g. from a resumed run), validated as by
            :meth:`record`.
    """

    def __init__(self, events: Iterable[PrivacyEvent] = ()) -> None:
        self._events: tuple[PrivacyEvent, ...] = ()
        for e in events:
            self.record(e)

    @property
    def events(self) -> tuple[PrivacyEvent, ...]:
        """The recorded events, oldest first (an immutable tuple)."""
        return self._events

    def __len__(self) -> int:
        return len(self._events)

    def record(self, event: PrivacyEvent) -> None:
        """Append ``event``; rounds must not decrease."""
        if not isinstance(event, PrivacyEvent):
            raise ConfigError(f"expected a PrivacyEvent, got {type(event).__name__}")
        if self._events and event.privacy_unit != self._events[0].privacy_unit:
            raise ConfigError(
                f"a {event.privacy_unit}-level event cannot join a ledger of "
                f"{self._events[0].privacy_unit}-level events; keep one ledger per unit"
            )
        if self._events and event.round < self._events[-1].round:
            raise ConfigError(
                f"privacy event round {event.round} is before the last recorded round "
                f"{self._events[-1].round}; events must be recorded in round order"
            )
        self._events = (*self._events, event)

    def epsilon(self, delta: float, accountant: str = "prv") -> float:
        """Epsilon of all recorded events at ``delta``.

        Continuous events go to Opacus's PRV or RDP accountant with their effective noise
        multiplier. Discrete events are RDP-only: with ``accountant="rdp"`` every event's RDP
        is summed over the order grid (integer orders when a subsampled discrete event is
        present, see :func:`~protocols.dp.accounting.rdp_orders`) and converted; with
        ``accountant="prv"`` a ledger holding a discrete event raises ConfigError rather
        than claim a PRV bound.
        """
        return _epsilon_of(self._events, delta=delta, accountant=accountant)

    def would_exceed(
        self,
        event: PrivacyEvent,
        target_epsilon: float,
        delta: float,
        accountant: str = "prv",
    ) -> bool:
        """Whether recording ``event`` would take epsilon above ``target_epsilon``."""
        target = check_epsilon(target_epsilon, "target epsilon")
        return _epsilon_of((*self._events, event), delta=delta, accountant=accountant) > target

    def spend(
        self,
        event: PrivacyEvent,
        *,
        target_epsilon: float,
        delta: float,
        accountant: str = "prv",
    ) -> float:
        """Record ``event`` if the budget allows it, else raise PrivacyBudgetError.

        Returns:
            The epsilon after recording.
        """
        target = check_epsilon(target_epsilon, "target epsilon")
        eps = _epsilon_of((*self._events, event), delta=delta, accountant=accountant)
        if eps > target:
            raise PrivacyBudgetError(
                f"round index {event.round} would raise epsilon to {eps:.4g} above the target "
                f"{target:.4g} (delta={delta!r}); stop training or raise the budget"
            )
        self.record(event)
        return eps

    def to_dicts(self) -> list[dict[str, Any]]:
        """The events as JSON-compatible dicts."""
        return [e.to_dict() for e in self._events]

    @classmethod
    def from_dicts(cls, data: Iterable[Mapping[str, Any]]) -> PrivacyLedger:
        """Rebuild a ledger from :meth:`to_dicts` output (every event re-validated)."""
        return cls(PrivacyEvent.from_dict(d) for d in data)


def _epsilon_of(events: tuple[PrivacyEvent, ...], *, delta: float, accountant: str) -> float:
    d = check_delta(delta)
    acc = check_accountant(accountant)
    if not events:
        return 0.0
    groups = Counter(e._key() for e in events)
    representatives = {e._key(): e for e in events}
    discrete = any(e.mechanism == DISTRIBUTED_DISCRETE_GAUSSIAN for e in events)
    if not discrete:
        hist: Counter[tuple[float, float]] = Counter()
        for key, count in groups.items():
            e = representatives[key]
            hist[(e.effective_noise_multiplier, e.sample_rate)] += count
        return gaussian_epsilon([(z, q, n) for (z, q), n in hist.items()], delta=d, accountant=acc)
    if acc == "prv":
        raise ConfigError(
            "the ledger holds distributed discrete Gaussian events, whose guarantee is an RDP "
            "bound (Kairouz et al. 2021); account it with accountant='rdp'"
        )
    integer_only = any(
        e.mechanism == DISTRIBUTED_DISCRETE_GAUSSIAN and e.sample_rate < 1.0 for e in events
    )
    orders = rdp_orders(integer_only=integer_only)
    total = np.zeros(len(orders))
    for key, count in groups.items():
        total += count * representatives[key].rdp(orders)
    return rdp_to_epsilon(orders, total, d)
