"""A privately released popularity prior that any federated model's scores can lean on.

Issue 14: under user-level DP the models that privatise every coordinate of a large update
(FedRAP, FedRecGEL) fall far below a private popularity count (DP-MostPop). The private
prior mode gives a model that count as well, at a share of the same budget:

1. **One release, before any model release.** Every user contributes a vector over the items
   of L2 norm at most ``sqrt(k)``, formed on the device (``--prior-weighting``): ``capped``
   (the default), each of its ``n_u`` training items weighted
   ``sqrt(k) min(1 / sqrt(n_u), sqrt(K) / n_u)`` (``K`` = :data:`CAPPED_ITEMS`), so every item
   of the user counts and a user with more than ``K`` items weighs, in total, as one with
   ``K``; ``sqrt``, every item at ``sqrt(k / n_u)``, so the norm is exactly ``sqrt(k)``
   whatever ``n_u`` is; ``sample``,
   the indicator of at most ``k`` items sampled uniformly (DP-MostPop's contribution bound).
   Either way the L2 sensitivity is ``sqrt(k)``; the server sums (plainly, or through secure
   aggregation) and adds ``N(0, (sigma_p sqrt(k))^2)`` per item. The release is accounted in
   the run's ledger (round 0, sample rate 1) and written to disk before the noisy sum exists,
   like every model round (:meth:`securefed.privacy.PrivateAggregator.release_prior`).
2. **The budget split, a rule fixed in advance.** ``share`` is the prior's part of the
   budget in Gaussian precision: ``sigma_p = sigma_1 / sqrt(share)``, where ``sigma_1`` is
   the noise multiplier of a single release spending all of ``epsilon``
   (:func:`prior_noise_multiplier`). For unsampled Gaussian releases precisions add
   (``1/sigma^2``; Dong, Roth, Su, "Gaussian Differential Privacy", 2022), so ``share`` of 1
   would be DP-MostPop itself. The model's own sigma is then calibrated for its rounds with
   the prior's event in the composition (:func:`calibrate_remaining`), so the ledger's epsilon
   after the last round is at most the target.
3. **Scores.** :class:`PriorScored` wraps the model: ``score = model score + weight * p_i``
   with ``p_i = log(1 + max(c_i, 0)) / max_j log(1 + max(c_j, 0))`` in ``[0, 1]`` from the
   released counts ``c``, or, for a model whose ``ModelSpec.prior_scale`` says so,
   ``max(c_i, 0)`` over the top count (``"linear"``) or over the release's noise std per
   count (``"noise"``: FedRAP and FedRecGEL). The model itself trains and scores exactly
   as without the prior.

A model opts in with ``ModelSpec.prior_weight`` (its default weight); nothing else in the
model changes. The released counts are part of the wrapper's ``state_dict`` (checkpoints,
the best model) and of their own file in the run directory (:data:`PRIOR_FILE`), so a resumed
run loads them and never releases them twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from protocols.dp import calibrate_noise_multiplier
from protocols.dp.accounting import gaussian_epsilon
from protocols.seeding import torch_generator
from securefed.errors import ConfigError
from securefed.federation.base import ClientUpdates
from securefed.models.mostpop import MostPopUpdates, bounded_pairs

if TYPE_CHECKING:
    from securefed.config import TrainConfig
    from securefed.data.types import Split
    from securefed.federation.base import Recommender, UpdateLayout

__all__ = [
    "PRIOR_FILE",
    "PopularityPrior",
    "PriorScored",
    "calibrate_remaining",
    "ensure_released",
    "prior_noise_multiplier",
    "prior_updates",
    "with_prior",
]

#: The released prior in a run directory, written as soon as it is released.
PRIOR_FILE = "popularity_prior.pt"
#: Calibration stops within this much epsilon below the target (as protocols.dp does).
_TOLERANCE = 0.01


def prior_noise_multiplier(
    *, epsilon: float, delta: float, share: float, accountant: str = "prv"
) -> float:
    """``sigma_p = sigma_1 / sqrt(share)``: the prior's noise multiplier (module docstring).

    Unit of privacy: one user; sensitivity: one user's bounded indicator (``sqrt(k)``), so
    the noise std on each count is ``sigma_p * sqrt(k)``.
    """
    if not 0 < share < 1:
        raise ConfigError(f"prior share must be in (0, 1), got {share!r}")
    sigma_one = calibrate_noise_multiplier(
        epsilon=epsilon,
        delta=delta,
        sample_rate=1.0,
        steps=1,
        accountant=accountant,  # type: ignore[arg-type]
    )
    return float(sigma_one / math.sqrt(share))


def calibrate_remaining(
    *,
    epsilon: float,
    delta: float,
    fixed: Sequence[tuple[float, float, int]],
    sample_rate: float,
    steps: int,
    accountant: str = "prv",
) -> float:
    """The smallest noise multiplier (within the calibration tolerance) for ``steps`` rounds
    at ``sample_rate`` such that, composed with the ``fixed`` releases ``(sigma, q, count)``,
    the accountant's epsilon stays ``<= epsilon``. Never overshoots (bisection keeps the
    upper end private enough), like :func:`protocols.dp.calibrate_noise_multiplier`.

    Raises:
        ConfigError: the fixed releases alone spend the budget, or no sigma below 1e6 fits.
    """
    fixed = [(float(z), float(q), int(n)) for z, q, n in fixed]
    if fixed and gaussian_epsilon(fixed, delta=delta, accountant=accountant) >= epsilon:
        raise ConfigError(
            f"the popularity prior alone spends epsilon {epsilon!r}; lower --private-prior"
        )

    def spent(sigma: float) -> float:
        return gaussian_epsilon(
            [*fixed, (sigma, sample_rate, steps)],
            delta=delta,
            accountant=accountant,
        )

    low, high = 0.0, 10.0
    eps_high = spent(high)
    while eps_high > epsilon:
        low, high = high, 2.0 * high
        if high > 1e6:
            raise ConfigError(
                f"cannot fit {steps} rounds into epsilon {epsilon!r} next to the popularity "
                "prior: the noise multiplier would exceed 1e6; lower --private-prior or --rounds"
            )
        eps_high = spent(high)
    while epsilon - eps_high > _TOLERANCE and high - low > 1e-9 * high:
        mid = 0.5 * (low + high)
        eps_mid = spent(mid)
        if eps_mid > epsilon:
            low = mid
        else:
            high, eps_high = mid, eps_mid
    return high


#: ``capped`` weighting: a user with more items than this counts, in total weight, as much as
#: a user with this many (docs/privacy.md, "The prior's weighting").
CAPPED_ITEMS = 80

#: The weightings of the prior's upload (``--prior-weighting``).
WEIGHTINGS = ("sqrt", "capped", "sample")


def sqrt_weights(pair_client: torch.Tensor, n_clients: int, max_items: int) -> torch.Tensor:
    """Each pair's weight ``sqrt(k / n_u)``, ``n_u`` its client's number of pairs: a client's
    weighted indicator has L2 norm exactly ``sqrt(k)`` (``n_u * k / n_u = k``), whatever
    ``n_u`` is (docs/privacy.md, "The prior's weighting"). Computed from the client's own
    pairs only: the bound holds on the device."""
    n = torch.bincount(pair_client, minlength=n_clients).to(torch.float64)
    return torch.sqrt(float(max_items) / n.clamp_min(1.0))[pair_client]


def capped_weights(
    pair_client: torch.Tensor, n_clients: int, max_items: int, cap: int = CAPPED_ITEMS
) -> torch.Tensor:
    """Each pair's weight ``sqrt(k) * min(1 / sqrt(n_u), sqrt(K) / n_u)`` (``K`` the cap):
    ``sqrt(k / n_u)`` as :func:`sqrt_weights` up to ``K`` items, beyond that a total weight of
    ``sqrt(k K)`` shared by the user's items. The squared norm is ``k min(1, K / n_u) <= k``,
    so the L2 bound ``sqrt(k)`` holds on the device as for ``sqrt``."""
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ConfigError(f"the cap must be a positive integer, got {cap!r}")
    n = torch.bincount(pair_client, minlength=n_clients).to(torch.float64).clamp_min(1.0)
    per_item = torch.minimum(n.rsqrt(), math.sqrt(cap) / n)
    return (math.sqrt(float(max_items)) * per_item)[pair_client]


def prior_updates(
    split: Split, *, max_items: int, seed: int, weighting: str = "capped", secure: bool = True
) -> ClientUpdates:
    """Every user's upload for the prior, L2 norm at most ``sqrt(max_items)``, formed on the
    device: ``sqrt`` weights each of the user's ``n_u`` training items ``sqrt(k / n_u)``,
    ``capped`` the same up to :data:`CAPPED_ITEMS` items (:func:`capped_weights`);
    ``sample`` is the indicator of at most ``k`` of them, sampled uniformly from OS
    randomness when ``secure`` (every DP run without replay), else from a generator derived
    from ``seed``: with one known stream for all users the sample of each depends on the
    users before it, and the count's sensitivity is not ``sqrt(k)``
    (:func:`securefed.models.mostpop.bounded_pairs`)."""
    from securefed.federation.base import UpdateLayout

    if weighting not in WEIGHTINGS:
        raise ConfigError(
            f"prior weighting must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}"
        )
    users = torch.arange(split.n_users, dtype=torch.long)
    local, items = split.train_pairs(users.numpy())
    local_t, items_t = torch.from_numpy(local), torch.from_numpy(items)
    layout: UpdateLayout = UpdateLayout(names=("counts",), shapes=((split.n_items,),))
    if weighting in ("sqrt", "capped"):
        weights = sqrt_weights if weighting == "sqrt" else capped_weights
        return MostPopUpdates(
            clients=users,
            layout=layout,
            pair_client=local_t,
            pair_item=items_t,
            weight=weights(local_t, split.n_users, max_items),
        )
    source = None if secure else torch_generator(seed, "prior-sample")
    local_t, items_t = bounded_pairs(local_t, items_t, split.n_users, max_items, source)
    return MostPopUpdates(clients=users, layout=layout, pair_client=local_t, pair_item=items_t)


class PopularityPrior:
    """The released counts and the weight the scores give them (module docstring)."""

    def __init__(self, n_items: int, *, weight: float, max_items: int, scale: str = "log") -> None:
        if scale not in ("log", "linear", "noise"):
            raise ConfigError(f"prior scale must be log, linear or noise, got {scale!r}")
        self.n_items = int(n_items)
        self.weight = float(weight)
        self.max_items = int(max_items)
        self.scale = scale
        #: Std of the release's noise on one count (``scale="noise"`` divides by it).
        self.noise_std = 1.0
        self.counts = torch.zeros(self.n_items, dtype=torch.float32)
        self.released = False

    def install(self, counts: torch.Tensor) -> None:
        """Keep ``counts``, the released (noisy) item counts."""
        if tuple(counts.shape) != (self.n_items,):
            raise ConfigError(
                f"prior counts must have shape ({self.n_items},), got {tuple(counts.shape)}"
            )
        self.counts = counts.detach().to(torch.float32).cpu().clone()
        self.released = True

    def scores(self) -> torch.Tensor:
        """The counts as scores (zeros before the release): ``log(1 + max(c, 0))`` over its
        maximum (``scale="log"``, in ``[0, 1]``), ``max(c, 0)`` over its maximum
        (``"linear"``), or ``max(c, 0)`` over the release's noise std per count
        (``"noise"``, :attr:`noise_std`, public: sigma_p sqrt(k)).

        Why ``noise`` (FedRAP's): the release's noise has one std in count units everywhere,
        so with ``weight`` w a model whose scores span about 1 overturns count differences
        up to about ``1 / w`` noise stds: where counts are noise (the tail, a small budget)
        the model decides, where they are reliable (the head, a large budget) the count
        does. On the log scale the reach widens with the count (at weight 10, items of half
        the top count), so the model reordered the most popular items, where full-ranking
        HR@10 is decided; on the linear scale it is a fixed share of the top count, so the
        model reordered the whole tail, where sampled HR@10 is (docs/privacy.md, "The
        prior's scale").
        """
        c = self.counts.clamp_min(0.0)
        if self.scale == "noise":
            return c / self.noise_std
        values = torch.log1p(c) if self.scale == "log" else c
        top = float(values.max()) if values.numel() else 0.0
        return values / top if top > 0 else values

    def state_dict(self) -> dict[str, Any]:
        return {
            "counts": self.counts.clone(),
            "released": self.released,
            "max_items": self.max_items,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        counts = state["counts"]
        if not isinstance(counts, torch.Tensor) or tuple(counts.shape) != (self.n_items,):
            raise ConfigError("the saved popularity prior does not match this catalogue")
        self.counts = counts.to(torch.float32).clone()
        self.released = bool(state["released"])


class PriorScored:
    """A recommender whose scores add ``weight * prior``; everything else is the model's.

    Training, uploads, the server step and the shared parameters are the wrapped model's,
    untouched (attribute access falls through to it); only :meth:`score`, :meth:`score_all`
    and the state (which carries the released prior) differ.
    """

    def __init__(self, model: Any, prior: PopularityPrior) -> None:
        self.inner = model
        self.prior = prior

    def __getattr__(self, name: str) -> Any:
        # inner/prior: not set yet (e.g. during unpickling); score_block: never the bare
        # model's (it would score without the prior), see the property below.
        if name in ("inner", "prior", "score_block"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def score_block(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The model's block scorer plus the prior, where the model has one (evaluation then
        ranks in item blocks, :mod:`securefed.evaluation`); an AttributeError otherwise."""
        inner = self.inner.score_block  # AttributeError: evaluation takes the dense path

        @torch.no_grad()
        def scored(users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
            out = inner(users, items)
            p = self.prior.scores().to(out.device, out.dtype)
            return out + self.prior.weight * p[items.to(out.device, torch.long)].unsqueeze(0)

        return scored

    @torch.no_grad()
    def score(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """The model's scores of ``items`` plus ``weight`` times their prior scores."""
        out = self.inner.score(users, items)
        p = self.prior.scores().to(out.device, out.dtype)
        return out + self.prior.weight * p[items.to(out.device, torch.long)]

    @torch.no_grad()
    def score_all(self, users: torch.Tensor) -> torch.Tensor:
        """The model's scores of every item plus ``weight`` times the prior scores."""
        out = self.inner.score_all(users)
        p = self.prior.scores().to(out.device, out.dtype)
        return out + self.prior.weight * p.unsqueeze(0)

    def state_dict(self) -> dict[str, Any]:
        """The model's state and the released counts (``model``, ``popularity_prior``)."""
        return {"model": self.inner.state_dict(), "popularity_prior": self.prior.state_dict()}

    def checkpoint_state(self) -> dict[str, Any]:
        """The checkpoint's form: the model's own compact state where it has one (FedRAP's
        sparse ``D``), with the prior (without this, attribute fall-through would hand the
        trainer the bare model's state and the checkpoint would lose the prior)."""
        compact = getattr(self.inner, "checkpoint_state", None)
        inner = compact() if compact is not None else self.inner.state_dict()
        return {"model": dict(inner), "popularity_prior": self.prior.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load :meth:`state_dict`'s (or :meth:`checkpoint_state`'s) form; KeyError for a
        state written without the prior."""
        if "popularity_prior" not in state or "model" not in state:
            raise KeyError("the state holds no popularity prior (written without one?)")
        self.inner.load_state_dict(state["model"])
        self.prior.load_state_dict(state["popularity_prior"])


def with_prior(config: TrainConfig, split: Split, model: Recommender) -> Recommender:
    """``model`` wrapped in :class:`PriorScored` when the run asks for the private prior
    (``PrivacyConfig.prior_share``), else ``model`` itself."""
    p = config.privacy
    if p.prior_share is None:
        return model
    weight = p.prior_weight if p.prior_weight is not None else config.spec.prior_weight
    if weight is None:
        raise ConfigError(f"{config.model} has no popularity-prior mode; drop --private-prior")
    prior = PopularityPrior(
        split.n_items,
        weight=float(weight),
        max_items=p.prior_items,
        scale=config.spec.prior_scale,
    )
    prior.noise_std = prior_noise_multiplier(
        epsilon=float(p.epsilon),  # type: ignore[arg-type]
        delta=p.delta,
        share=float(p.prior_share),
        accountant=p.user_accountant,  # the aggregator's (RDP for distributed noise)
    ) * math.sqrt(p.prior_items)
    return cast("Recommender", PriorScored(model, prior))


def ensure_released(
    model: Any, aggregator: Any, split: Split, config: TrainConfig, run_dir: Any
) -> None:
    """Release the prior of a :class:`PriorScored` model once per run, before any round.

    A model whose prior is already in its loaded state (a resumed checkpoint) or in the run
    directory's :data:`PRIOR_FILE` (a run that stopped before its first checkpoint) keeps it:
    the prior is never released twice. Otherwise the release is accounted and then written
    to :data:`PRIOR_FILE` at once. Anything else: nothing to do.

    Raises:
        PrivacyBudgetError: the release would overspend (nothing is released).
    """
    from pathlib import Path

    from securefed import runs

    if not isinstance(model, PriorScored) or model.prior.released:
        return
    path = Path(run_dir) / PRIOR_FILE
    saved = runs.load_state(path)
    if saved is not None:
        model.prior.load_state_dict(saved)
        if model.prior.released:
            return
    updates = prior_updates(
        split,
        max_items=config.privacy.prior_items,
        seed=config.seed,
        weighting=config.privacy.prior_weighting,
        secure=config.privacy.os_randomness,
    )
    model.prior.install(aggregator.release_prior(updates, 0))
    runs.save_state(path, model.prior.state_dict())
