"""fedals: federated implicit-feedback matrix factorisation (iALS on devices).

The model is implicit ALS (Hu, Koren, Volinsky, ICDM 2008; tuning after Rendle et al.,
"Revisiting the performance of iALS on item recommendation benchmarks", RecSys 2022) in the
federated form of Ammad-ud-din et al. ("Federated collaborative filtering for privacy-
preserving personalized recommendation system", 2019): user factors never leave the device;
the server owns the item factors ``V`` and updates them from what the clients send.

One round (docs/models.md, "fedals"):

1. **On the device, exact.** Client ``u`` receives ``V`` and solves its own factor in closed
   form (:mod:`securefed.models.als_math`, Gramian trick)::

       x_u = (V^T V + alpha sum_{i in I_u} v_i v_i^T + reg I)^{-1} (1 + alpha) sum_{i in I_u} v_i

2. **Upload** (one flat vector, layout ``item_grad | gram | count``): the data part of the
   gradient of the iALS loss with respect to the item rows it touched,
   ``r_ui = (alpha * x_u . v_i - (1 + alpha)) x_u`` for ``i in I_u`` (0 elsewhere); its
   Gramian ``x_u x_u^T``; and its item indicator ``1[i in I_u]``.
3. **Server, one Newton step on V.** From the sums ``R``, ``G = sum x_u x_u^T`` and counts
   ``n_i`` (scaled to the population when a cohort is sampled), the full gradient of the
   item half of the loss is ``g_i = G v_i + R_i + reg v_i`` and its Hessian per item is
   ``H_i = G + reg I + alpha sum_{u in U_i} x_u x_u^T``. The server does not see the per-item
   second moments, so it uses ``alpha n_i G / N`` for the last term (each item's users are
   assumed to have the population's second moment) and steps ``v_i -= step * H_i^{-1} g_i``.
   All ``H_i`` share ``G``'s eigenvectors, so the step costs one ``d x d`` eigendecomposition.

With all clients every round this is an ALS sweep whose item half is an approximate Newton
step; measured on MovieLens 100K it tracks exact ALS within noise from round 4 (docs/models.md).
The upload is ``n_items * d + d^2 + n_items`` floats, about FedRAP's, and stays structured
(per-pair coefficients and factors) until a protocol needs dense rows.

Evaluation scores a user with the factor it would solve on its device from the current ``V``
(a client can always do so locally), so users outside the last cohort are scored fairly.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from securefed.costs import (
    DOT_EVAL_S,
    EVAL_BLOCK,
    CostInputs,
    ModelCosts,
    ModelWork,
    RunShape,
    plural,
)
from securefed.data.types import Split
from securefed.errors import ConfigError
from securefed.federation.base import (
    Aggregate,
    ClientUpdates,
    RoundStats,
    UpdateLayout,
    block_buffer,
    pairs_by_item,
    write_item_rows,
)
from securefed.models.als_math import frequency_reg, normal_equations, solve_rows
from securefed.models.registry import ModelSpec, ObserverHooks
from securefed.validation import check_field_types, positive_int

__all__ = [
    "LARGE_CATALOGUE",
    "FedALS",
    "FedALSConfig",
    "FedALSUpdates",
    "SPEC",
    "resolve_dim",
    "resolve_dim_for_data",
    "resolve_reg",
]


@dataclass(frozen=True, kw_only=True)
class FedALSConfig:
    """fedals hyperparameters.

    Defaults: the centralized iALS setting of issue 13 (``d`` 32, ``alpha`` 3, ``reg`` 10),
    with frequency-scaled regularisation without DP and ``d`` 64 on catalogues of
    :data:`LARGE_CATALOGUE` items or more (docs/models.md, "fedals").

    Attributes:
        dim: Factor size ``d`` (without DP; ``private_dim`` with it). None: 32, or 64 from
            :data:`LARGE_CATALOGUE` items, decided when the data is loaded
            (:func:`resolve_dim`; ``config.toml`` records the choice).
        alpha: Confidence of an observed pair minus one (``c_ui = 1 + alpha``).
        reg: L2 regularisation of user and item factors (of a factor without observations
            when ``reg_frequency`` is on).
        reg_frequency: Frequency-scaled L2 (Rendle et al. 2022, ``nu = 1``): a user or item
            row with ``n_r`` observations is regularised by ``reg * (1 + alpha * n_r /
            n_other)``, in proportion to its total confidence in the loss
            (:func:`~securefed.models.als_math.frequency_reg`). None: on without DP, off in
            the private mode (:func:`resolve_reg`; ``config.toml`` records the choice).
        init_std: Standard deviation of the initial item factors.
        step: Server step size on the approximate Newton direction (1: the full step).
        eval_block: Users whose factors are solved at once for evaluation.
        private: The private mode (docs/privacy.md, "Private fedals"); when not given, on for
            runs with user-level DP and off otherwise (``config.toml`` records the choice).
        private_dim: Factor size in the private mode.
        count_rounds: Private mode: rounds at the start in which clients only count (None:
            from ``population``: 1 small; :data:`LARGE_COUNT_ROUNDS` large with
            co-occurrence rounds, 1 in its ALS mode).
        population: Private mode: ``"small"`` (one count round, then two co-occurrence
            rounds over the ``gram_items`` most counted items, a popularity prior in the
            scores) or ``"large"`` (two count rounds and two co-occurrence rounds, no prior,
            items without a factor ranked below every item with one by their count; with
            ``gram_items`` 0 the ALS mode: factors for items whose count
            clears ``head_z`` noise stds, an ALS round and two Newton rounds). None: chosen
            from the data when the run starts, by :func:`resolve_population` (``"large"``
            when ``N / sigma`` of a 4-round run is at least ``large_above``); ``config.toml``
            records the choice. Either reports its last round unless ``select_on`` is
            given. It sets ``head_z``,
            ``prior_weight``, ``tail_last``, ``combine_counts``, ``tail_counts``,
            ``gram_items``, ``gram_head_z`` and ``sparse_head_below`` where they are not given
            (docs/privacy.md, "The population rule").
        large_above: Private mode: the users per unit of noise from which the population
            rule chooses ``"large"``.
        head_z: Private mode: items whose released count exceeds ``head_z`` times its noise
            std get factors; the rest are ranked by the count alone (None: from
            ``population``: 0 small, 3 large).
        tail_last: Private mode: items without a factor rank below every item with one, in
            the order of their released counts (None: from ``population``).
        combine_counts: Private mode: fold the count part of every round's release into the
            count (inverse-variance); false keeps the count rounds' releases alone (the
            later rounds' counts come from clipped uploads, biased low for the users the clip
            scales; None: from ``population``: true small, false large).
        tail_counts: Private mode, co-occurrence rounds: each client also sends the count of
            each of its items without a factor, with the count round's weight ``w = 1 /
            sqrt(max(n, min_weight_items))`` (``n`` all its items), and its pairs take the
            rest of its unit norm (scaled by ``sqrt(1 - n_tail w^2)``); the server folds those
            counts into the tail's count (inverse-variance), which ranks the items without a
            factor (None: from ``population``; off with ``count_items``, whose count round
            weighs items differently).
        min_weight_items: Private mode: a client's contribution to each of its items is
            ``1 / sqrt(max(items, min_weight_items))`` (its upload has L2 norm <= 1).
        count_items: Private mode: in count rounds each client counts at most this many of
            its items, sampled uniformly, ``1 / sqrt(k)`` each (None: all, weighted as above).
        shares: Private mode: shares of the unit squared-norm budget of an ALS-round upload
            given to its item rows, counts and Gramian.
        item_reg: Private mode: ridge of the server's item solve.
        prior_weight: Private mode: weight of ``log(1 + count)`` added to every score (None:
            from ``population``: 0.1 small, 0 large).
        count_only_below: Private mode: when the run's users per unit of noise,
            ``N sqrt(R) / sigma`` (``sigma`` the noise multiplier of each of its ``R`` releases
            over the unit upload bound: ``sigma / sqrt(R)`` is the noise of one release with
            the whole run's precision), is below this, every round is a count round and the
            model is the count at the whole budget (docs/privacy.md, "A count-only rule");
            0: never. Decided by :func:`resolve_population` before any data is read.
        count_only: Private mode: every round is a count round (None: from
            ``count_only_below`` when the run starts; unresolved models count only when set).
        gram_items: Private mode: after the count rounds, the clients release the
            co-occurrence of the ``gram_items`` items with the largest released counts (each
            client's pairs weighted to L2 norm 1), and the server sets those items' factors
            from its leading eigenvectors (the other items keep none); 0: the ALS round instead
            (None: 400 in the small population; in the large one from the noise level when the
            run starts, :func:`large_gram_items`, else 400). docs/privacy.md, "The
            co-occurrence rounds".
        gram_head_z: Private mode: of the ``gram_items`` items with the largest released
            counts, only those whose count exceeds ``gram_head_z`` times its noise std enter
            the co-occurrence rounds and get factors (the rest of the catalogue is ranked by
            the count; None: from ``population``; 0: all ``gram_items``).
        sparse_head_below: Private mode, co-occurrence rounds: when, after the count
            rounds, fewer than this share of the ``gram_items`` items with the largest
            released counts clear ``sparse_head_z`` noise stds, only those that do enter the
            co-occurrence rounds and get factors, and every other item is counted again in
            them (as ``gram_head_z = sparse_head_z`` with ``tail_counts``): most of the set
            would be chosen by noise, and a count with the whole run's precision ranks the
            rest better (docs/privacy.md, "A noise-limited head"). Decided once from the
            released count (post-processing: no privacy cost); the clients read the decision
            off the released head (the set is then shorter than ``gram_items``). Off where
            ``gram_head_z`` > 0, ``tail_counts`` is true or ``count_items`` is set. 0: never
            (None: from ``population``: 0.5 small, 0 large).
        sparse_head_z: Private mode: how many of the released count's noise stds an item's
            count must exceed to count as cleared by ``sparse_head_below``'s rule.
        gram_scale: Private mode: the co-occurrence round's factors are ``gram_scale``
            times the eigenvectors, each scaled by the square root of its eigenvalue over the
            largest (the scale sets how strongly the users' ``reg`` shrinks their solves).
        gram_shrink: Private mode: shrink those eigenvalues to what they say without the noise
            (:func:`spectral_shrink`: zero inside the noise's bulk) before scaling. Off: on
            MovieLens 100K and FilmTrust validation it lost up to 0.013 full-ranking HR@10
            (docs/privacy.md, "Denoising the co-occurrence's spectrum").
        gram_audit_items: Private mode, audits only: the last this many items of the
            catalogue (an audit's canary items, ``attacks/canaries.py``) join the
            co-occurrence set beside the ``gram_items`` most counted others, so the canary test
            reads the co-occurrence releases; 0 in training (set by ``securefed audit``,
            docs/attacks.md).
        os_sampling: Draw ``count_items``'s sample from OS randomness. Set by the run under
            user-level DP without replay, whatever was given
            (:func:`securefed.models.mostpop.bounded_pairs` says why).
    """

    dim: int | None = None
    alpha: float = 3.0
    reg: float = 10.0
    reg_frequency: bool | None = None
    init_std: float = 0.1
    step: float = 1.0
    eval_block: int = 4096
    private: bool | None = None
    private_dim: int = 16
    count_rounds: int | None = None
    population: str | None = None
    large_above: float = 3000.0
    head_z: float | None = None
    tail_last: bool | None = None
    combine_counts: bool | None = None
    tail_counts: bool | None = None
    min_weight_items: int = 1
    count_items: int | None = None
    shares: tuple[float, float, float] = (0.6, 0.3, 0.1)
    item_reg: float = 10.0
    prior_weight: float | None = None
    count_only_below: float = 220.0
    count_only: bool | None = None
    gram_items: int | None = None
    gram_head_z: float | None = None
    sparse_head_below: float | None = None
    sparse_head_z: float = 3.0
    gram_scale: float = 10.0
    gram_shrink: bool = False
    gram_audit_items: int = 0
    os_sampling: bool = False

    @property
    def factor_dim(self) -> int:
        """The factor size in use (``private_dim`` in the private mode)."""
        if self.private:
            return self.private_dim
        if self.dim is None:
            raise ValueError("dim is unset: resolve it from the catalogue first (resolve_dim)")
        return self.dim

    def __post_init__(self) -> None:
        check_field_types(self)  # the checks below assume the types
        if self.dim is not None:
            positive_int("dim", self.dim)
        positive_int("private_dim", self.private_dim)
        positive_int("eval_block", self.eval_block)
        positive_int("min_weight_items", self.min_weight_items)
        if self.count_items is not None:
            positive_int("count_items", self.count_items)
        if self.count_rounds is not None and (
            isinstance(self.count_rounds, bool)
            or not isinstance(self.count_rounds, int)
            or (self.count_rounds < 0)
        ):
            raise ConfigError(f"count_rounds must be an integer >= 0, got {self.count_rounds!r}")
        shares = tuple(float(x) for x in self.shares)
        if (
            len(shares) != 3
            or any(not (x >= 0) for x in shares)
            or not (abs(sum(shares) - 1.0) < 1e-9)
        ):
            raise ConfigError(
                f"shares must be three numbers >= 0 summing to 1 (item rows, counts, Gramian), "
                f"got {self.shares!r}"
            )
        object.__setattr__(self, "shares", shares)
        if self.population not in (None, "small", "large"):
            raise ConfigError(f"population must be small, large or unset, got {self.population!r}")
        if self.tail_counts and self.count_items is not None:
            raise ConfigError(
                "tail_counts folds co-occurrence rounds' counts (weight 1/sqrt(n)) into the "
                "count round's, which count_items weighs 1/sqrt(k): unset one of them"
            )
        if self.gram_items is not None and (
            isinstance(self.gram_items, bool)
            or not isinstance(self.gram_items, int)
            or self.gram_items < 0
        ):
            raise ConfigError(f"gram_items must be an integer >= 0, got {self.gram_items!r}")
        if (
            isinstance(self.gram_audit_items, bool)
            or not isinstance(self.gram_audit_items, int)
            or self.gram_audit_items < 0
        ):
            raise ConfigError(
                f"gram_audit_items must be an integer >= 0, got {self.gram_audit_items!r}"
            )
        if not (
            isinstance(self.gram_scale, int | float)
            and math.isfinite(self.gram_scale)
            and self.gram_scale > 0
        ):
            raise ConfigError(f"gram_scale must be a finite number > 0, got {self.gram_scale!r}")
        for name in ("tail_last", "combine_counts", "tail_counts", "count_only"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ConfigError(f"{name} must be true, false or unset, got {value!r}")
        if not isinstance(self.gram_shrink, bool):
            raise ConfigError(f"gram_shrink must be true or false, got {self.gram_shrink!r}")
        for name in ("head_z", "prior_weight", "gram_head_z"):
            if getattr(self, name) is None:
                continue
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
        below = self.sparse_head_below
        if below is not None and not (
            isinstance(below, int | float) and not isinstance(below, bool) and 0 <= below <= 1
        ):
            raise ConfigError(f"sparse_head_below must be a share in [0, 1], got {below!r}")
        z = self.sparse_head_z
        if not (
            isinstance(z, int | float) and not isinstance(z, bool) and math.isfinite(z) and z > 0
        ):
            raise ConfigError(f"sparse_head_z must be a finite number > 0, got {z!r}")
        for name in ("item_reg", "count_only_below", "large_above"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("alpha", "reg", "init_std"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.reg <= 0:
            raise ConfigError(f"reg must be > 0 (the solves need it), got {self.reg!r}")
        if self.reg_frequency is not None and not isinstance(self.reg_frequency, bool):
            raise ConfigError(
                f"reg_frequency must be true, false or unset, got {self.reg_frequency!r}"
            )
        if not (isinstance(self.step, int | float) and 0 < self.step <= 2):
            raise ConfigError(f"step must be in (0, 2], got {self.step!r}")


def resolve_reg(params: FedALSConfig) -> FedALSConfig:
    """The regularisation rule: frequency-scaled without DP, one ``reg`` for every row in the
    private mode (whose settings were tuned with it); a value the user set is kept.

    Chosen on the validation HR@10 of MovieLens 100K and FilmTrust (docs/models.md, "fedals"):
    one ``reg`` 10 for every row is below a popularity count on FilmTrust, whose most popular
    films have 70 % of the users; scaled, they are regularised up to three times more.
    """
    if params.reg_frequency is not None:
        if params.private and params.reg_frequency:
            raise ConfigError(
                "reg_frequency applies without DP; the private mode regularises every row by "
                "reg (drop --param reg_frequency)"
            )
        return params
    return dataclasses.replace(params, reg_frequency=not params.private)


#: Catalogues of at least this many items get ``dim`` 64 when it is not given, smaller ones 32.
#: Measured on validation (docs/models.md, "fedals", *Dimension*): 64 is worse in sampled
#: HR@10 on MovieLens 100K (1,682 items), even on FilmTrust (2,071), and on Gowalla (40,981)
#: full-ranking HR@10 goes from 0.0814 to 0.0967 (centralized iALS); any threshold between
#: 2,071 and 40,981 items fits the three, 10,000 is a round number near their geometric mean.
LARGE_CATALOGUE = 10_000


def resolve_dim(params: FedALSConfig, n_items: int) -> FedALSConfig:
    """``dim`` from the catalogue's size when it is not given (:data:`LARGE_CATALOGUE`)."""
    if params.dim is not None:
        return params
    return dataclasses.replace(params, dim=64 if n_items >= LARGE_CATALOGUE else 32)


def resolve_dim_for_data(config: Any, split: Split) -> Any:
    """A run's config with :func:`resolve_dim` applied for its data (what ``config.toml``
    records; fedals's population rule and the centralized iALS both start with it)."""
    return dataclasses.replace(config, params=resolve_dim(config.params, split.n_items))


#: The private mode's settings per population (fields the user did not set).
POPULATION_SETTINGS: dict[str, dict[str, Any]] = {
    "small": {
        "head_z": 0.0,
        "prior_weight": 0.1,
        "tail_last": False,
        "combine_counts": True,
        "tail_counts": False,
        "gram_items": 400,
        "gram_head_z": 0.0,
        "sparse_head_below": 0.5,
    },
    "large": {
        "head_z": 3.0,
        "prior_weight": 0.0,
        "tail_last": True,
        "combine_counts": False,
        "tail_counts": False,
        "gram_items": 400,
        "gram_head_z": 0.0,
        "sparse_head_below": 0.0,
    },
}
#: How far below the items with factors ``tail_last`` puts the rest (factor scores are
#: orders of magnitude smaller; float32 still orders log counts 0.001 apart at this offset).
TAIL_OFFSET = 1.0e4
#: Rounds of the large-population mode when ``--rounds`` is left at the private default:
#: two count rounds and two co-occurrence rounds (with ``gram_items`` 0: the count round,
#: the ALS round and two Newton rounds).
LARGE_ROUNDS = 4
#: Count rounds of the large mode with co-occurrence rounds (of its :data:`LARGE_ROUNDS`): the
#: count ranks every item without a factor, so it gets half the run's precision. On Gowalla's
#: validation (seed 0) two count rounds instead of one raised sampled HR@10 by 0.002-0.025 at
#: epsilon 1-8 and lowered full-ranking HR@10 by 0.001-0.003 (docs/privacy.md).
LARGE_COUNT_ROUNDS = 2

#: The large mode's co-occurrence items when ``gram_items`` is not given: one item per
#: ``LARGE_GRAM_RATIO`` users per unit of noise (``N sqrt(R) / sigma``, the count-only rule's
#: ratio), rounded to 100 and kept within ``LARGE_GRAM_RANGE``. The more precise the releases,
#: the more items' pairs rise above the noise: on Gowalla's validation (seed 0) the best of
#: 400 / 1,000 / 2,000 / 4,000 items was 1,000 at epsilon 2 (ratio 14,842), 2,000 at 4
#: (27,545) and 2,000-4,000 at 8 (49,664) (docs/privacy.md, "Co-occurrence items from the
#: noise level"). Fitted on one population: another large one may want another constant.
LARGE_GRAM_RATIO = 15.0
LARGE_GRAM_RANGE = (400, 4000)


def large_gram_items(ratio: float) -> int:
    """The large mode's ``gram_items`` at ``ratio`` users per unit of noise
    (:data:`LARGE_GRAM_RATIO`)."""
    lo, hi = LARGE_GRAM_RANGE
    if not math.isfinite(ratio):
        return hi
    return int(min(max(round(ratio / LARGE_GRAM_RATIO / 100.0) * 100, lo), hi))


def with_population(params: FedALSConfig, population: str | None = None) -> FedALSConfig:
    """``params`` with ``population`` (default: its own, else ``"small"``) and the settings it
    implies wherever they are unset; a value the user set is kept."""
    population = population or params.population or "small"
    changes: dict[str, Any] = {"population": population}
    for name, value in POPULATION_SETTINGS[population].items():
        if getattr(params, name) is None:
            changes[name] = value
    if params.count_rounds is None:
        # The large mode's count ranks every item without a factor: it gets two of the four
        # releases (docs/privacy.md, "Two count rounds in the large mode").
        gram = changes.get("gram_items", params.gram_items)
        changes["count_rounds"] = LARGE_COUNT_ROUNDS if population == "large" and gram else 1
    return dataclasses.replace(params, **changes)


def _noise_multiplier(config: Any, n_users: int, rounds: int) -> float:
    """The noise multiplier of each release of a run of this config with ``rounds`` releases:
    given, or calibrated for its epsilon, delta, accountant and cohort as a central Gaussian."""
    p = config.privacy
    if p.noise_multiplier is not None:
        return float(p.noise_multiplier)
    from securefed.privacy import account

    # The sample rate the run's accountant uses (amplification only for Poisson cohorts).
    fraction = config.cohort(n_users).sample_rate(n_users)
    return float(
        account(
            epsilon=p.epsilon,
            delta=p.delta,
            rounds=rounds,
            client_fraction=fraction,
            users=n_users,
            accountant=p.accountant or "prv",
        )["noise_multiplier"]
    )


def population_ratio(config: Any, n_users: int) -> float:
    """Users per unit of noise, ``N / sigma``, of a run of this config with
    :data:`LARGE_ROUNDS` releases: ``sigma`` is the noise multiplier over the unit upload
    bound (given, or calibrated for the config's epsilon, delta, accountant and cohort as a
    central Gaussian). A function of public quantities only (the population size is treated
    as public, as everywhere in securefed's accounting)."""
    sigma = _noise_multiplier(config, n_users, LARGE_ROUNDS)
    return math.inf if sigma <= 0 else n_users / sigma


def count_only_ratio(config: Any, n_users: int) -> float:
    """The count-only rule's users per unit of noise, ``N sqrt(R) / sigma``, for the config's
    ``R`` rounds at noise multiplier ``sigma`` each: ``sigma / sqrt(R)`` is the noise of one
    release with the run's whole precision (Gaussian releases compose in precision), so the
    ratio does not depend on how many rounds the budget is spread over. Public quantities
    only."""
    rounds = max(int(config.rounds), 1)
    sigma = _noise_multiplier(config, n_users, rounds)
    return math.inf if sigma <= 0 else n_users * math.sqrt(rounds) / sigma


def resolve_population(config: Any, split: Split) -> tuple[Any, str | None]:
    """The population rule, applied when a new run's data is loaded (``config.toml`` records
    its result): a private run whose ``population`` is unset is ``"large"`` when
    :func:`population_ratio` is at least ``large_above``, else ``"small"``; a large run (chosen
    or given) left at the private default of rounds runs :data:`LARGE_ROUNDS`. Either
    reports its last round unless ``select_on`` is given (``select_on = "last"``): its rounds
    add releases to one model, the last holds them all, and a choice among them on noisy
    validation metrics only picks an earlier one by chance (docs/privacy.md, "The last round,
    not the best on validation").

    Why: with few users per unit of noise (MovieLens 100K and FilmTrust, ``N / sigma`` <=
    1,020 at epsilon <= 8) the small mode beats the large one at every epsilon; on Gowalla
    (>= 3,940) the large mode doubles DP-MostPop's full-ranking HR@10 where the small one ties
    it (docs/privacy.md, "The population rule").

    Returns:
        The resolved config and a line saying what was chosen (None without the private mode).
    """
    dim_note = None
    if config.params.dim is None:
        config = resolve_dim_for_data(config, split)
        if config.params.dim != 32:
            dim_note = (
                f"dim {config.params.dim}: {split.n_items:,} items >= LARGE_CATALOGUE "
                f"{LARGE_CATALOGUE:,}"
            )
    params = config.params
    if not params.private:
        return config, dim_note
    population = params.population
    if population is None:
        try:
            ratio = population_ratio(config, split.n_users)
        except ConfigError:
            # The reference run's rounds are not this run's (found in review: a 1-round run
            # was told it could not reach its epsilon "with 4 rounds"): the run's own
            # calibration speaks first, naming its rounds, where it fails too.
            _noise_multiplier(config, split.n_users, max(int(config.rounds), 1))
            p = config.privacy
            raise ConfigError(
                f"fedals's population rule (its private mode chosen from the data) calibrates "
                f"a reference run of {LARGE_ROUNDS} rounds, which cannot reach "
                f"epsilon={p.epsilon!r} at delta={p.delta!r} for {split.n_users} users (the "
                "noise multiplier would exceed 1e6); raise epsilon, or choose the mode "
                'yourself: --param population=small (FedALSConfig(population="small"))'
            ) from None
        population = "large" if ratio >= params.large_above else "small"
        why = (
            f"{split.n_users:,} users / noise multiplier of a {LARGE_ROUNDS}-round run = "
            f"{ratio:,.0f} {'>=' if population == 'large' else '<'} large_above "
            f"{params.large_above:,.0f}"
        )
    else:
        why = "set by --param population"
    changes: dict[str, Any] = {}
    if population == "large" and config.rounds == SPEC.rounds_for(config.privacy):
        changes["rounds"] = LARGE_ROUNDS
    # Users per unit of noise of the run's releases (one accountant calibration, read by the
    # co-occurrence items' rule and the count-only rule).
    gram_rule = population == "large" and params.gram_items is None and not params.count_only
    ratio1 = math.nan
    if gram_rule or params.count_only is None:
        ratio1 = count_only_ratio(dataclasses.replace(config, **changes), split.n_users)
    gram_why = ""
    if gram_rule:
        params = dataclasses.replace(params, gram_items=large_gram_items(ratio1))
        gram_why = (
            f"; {params.gram_items:,} co-occurrence items: {ratio1:,.0f} users per unit of "
            f"noise / LARGE_GRAM_RATIO {LARGE_GRAM_RATIO:g}, within "
            f"{LARGE_GRAM_RANGE[0]:,}-{LARGE_GRAM_RANGE[1]:,}"
        )
    changes["params"] = with_population(params, population)
    if config.select_on is None:
        # Every round adds a release to one model and the last holds them all: no choice on
        # validation, which would only pick an earlier round by its noise (docs/privacy.md,
        # "The last round, not the best on validation"; the large mode selected on full
        # ranking before, and chose its last round in all twelve Gowalla runs measured).
        changes["select_on"] = "last"
    resolved = dataclasses.replace(config, **changes)
    rp = resolved.params
    count_why = ""
    if rp.count_only is None:
        rp = dataclasses.replace(rp, count_only=bool(ratio1 < rp.count_only_below))
        resolved = dataclasses.replace(resolved, params=rp)
        count_why = (
            f"; {split.n_users:,} users x sqrt({resolved.rounds} rounds) / noise multiplier = "
            f"{ratio1:,.0f} {'<' if rp.count_only else '>='} count_only_below "
            f"{rp.count_only_below:,.0f}"
        )
    if rp.count_only:
        what = "every round a count release, the model is the count (the count-only rule)"
    else:
        if rp.gram_items:
            counts = "a count round" if rp.count_rounds == 1 else f"{rp.count_rounds} count rounds"
            what = (
                f"{counts}, then co-occurrence rounds on the "
                f"{min(rp.gram_items, split.n_items)} items with the largest counts"
            )
            if rp.gram_head_z:
                what += f" that clear {rp.gram_head_z:g} noise stds"
            if rp.tail_counts:
                what += ", the others counted again in them"
            if sparse_head_rule(rp) and ratio1 != math.inf:  # inf: no noise, no rule
                what += (
                    f" (where fewer than {rp.sparse_head_below:.0%} of them clear "
                    f"{rp.sparse_head_z:g} noise stds, only those, the others counted again in "
                    "them: decided from the count)"
                )
        elif population == "small":
            what = "a count round, then ALS on the items with a positive count"
        else:
            what = (
                "a count round, then ALS and Newton rounds on the items whose count clears "
                f"{rp.head_z:g} noise stds"
            )
        what += (
            ", a popularity prior" if population == "small" else ", the rest ranked last by count"
        )
    what += (
        "; the last round reported"
        if resolved.select_on == "last"
        else f"; round selected on {resolved.select_on or 'sampled'} validation HR@10"
    )
    rounds_why = (
        f", the large mode's (--rounds {config.rounds}, the private default, was raised; "
        "any other number of rounds is kept)"
        if "rounds" in changes
        else ""
    )
    designed = LARGE_ROUNDS if population == "large" else SPEC.rounds_for(config.privacy)
    counting = rp.count_rounds or 0
    if not rp.count_only and rp.gram_items and resolved.rounds != designed:
        # A --rounds of the user's: the mode runs it, and says what it changes.
        if resolved.rounds <= counting:
            rounds_why += ": no co-occurrence round, the model is the count"
        else:
            rounds_why += (
                f": the mode was built and measured at {designed}, where the count rounds "
                f"hold {counting}/{designed} of the run's precision; here {counting}/"
                f"{resolved.rounds}, the co-occurrence rounds the rest"
            )
    note = (
        f"private fedals: {population} population ({why}{count_why}{gram_why}): {what}; "
        f'{plural(resolved.rounds, "round")}{rounds_why} (docs/privacy.md, "The population rule")'
    )
    return resolved, note


def sparse_head_rule(params: FedALSConfig) -> bool:
    """Whether a private run of ``params`` (population settled) applies the noise-limited
    head rule (``sparse_head_below``) after its count rounds."""
    return bool(
        params.private
        and not params.count_only
        and (params.sparse_head_below or 0) > 0
        and (params.gram_items or 0) > 0
        and (params.count_rounds or 0) > 0
        and not params.gram_head_z
        and not params.tail_counts
        and params.count_items is None
    )


def gram_size(params: FedALSConfig, n_items: int) -> int:
    """How many items the private mode's co-occurrence rounds cover (0: none; a pair needs
    two)."""
    if not params.private or params.count_only:
        return 0
    gram_items = int(with_population(params).gram_items or 0)
    if gram_items == 0:
        return 0
    audit = min(params.gram_audit_items, n_items)
    m = min(gram_items, n_items - audit) + audit
    return m if m >= 2 else 0


def fedals_layout(n_items: int, dim: int, gram: int = 0) -> UpdateLayout:
    """``item_grad [n_items, d] | gram [d, d] | count [n_items]`` (item rows first), and with
    ``gram`` co-occurrence items ``| cooc [gram (gram - 1) / 2]`` (the upper triangle, row
    by row)."""
    names: tuple[str, ...] = ("item_grad", "gram", "count")
    shapes: tuple[tuple[int, ...], ...] = ((n_items, dim), (dim, dim), (n_items,))
    if gram >= 2:
        names += ("cooc",)
        shapes += ((gram * (gram - 1) // 2,),)
    return UpdateLayout(names=names, shapes=shapes)


def pair_index(a: torch.Tensor, b: torch.Tensor, big: int) -> torch.Tensor:
    """Where the pair of positions ``a < b`` of ``big`` stands in the upper triangle packed row
    by row (the order of ``torch.triu_indices(big, big, 1)``): the ``cooc`` part's layout."""
    return a * big - a * (a + 1) // 2 + (b - a - 1)


class FedALSUpdates(ClientUpdates):
    """fedals uploads in structured form: each client's factor and per-pair multipliers.

    Client ``c`` uploads ``coef_p * x_c`` on the row of each of its items ``p``,
    ``gram_scale_c * x_c x_c^T`` and ``count_p`` on the count of each of its items; in the
    private mode's co-occurrence rounds ``cooc_value_q`` at position ``cooc_index_q`` of the
    ``cooc`` part for each of its pairs ``q`` (client ``cooc_client_q``). Norms and weighted
    sums are computed from these without the dense ``[m, d]`` matrix.
    """

    def __init__(
        self,
        *,
        clients: torch.Tensor,
        layout: UpdateLayout,
        x: torch.Tensor,
        pair_client: torch.Tensor,
        pair_item: torch.Tensor,
        coef: torch.Tensor,
        count: torch.Tensor | None = None,
        gram_scale: torch.Tensor | None = None,
        cooc_client: torch.Tensor | None = None,
        cooc_index: torch.Tensor | None = None,
        cooc_value: torch.Tensor | None = None,
    ) -> None:
        self.clients = clients
        self.layout = layout
        self.x = x
        self.pair_client = pair_client
        self.pair_item = pair_item
        self.coef = coef
        self.count = torch.ones_like(coef) if count is None else count
        self.gram_scale = (
            torch.ones(x.shape[0], dtype=x.dtype) if gram_scale is None else gram_scale
        )
        self.n_items = int(layout.shapes[0][0])
        self.dim = int(layout.shapes[0][1])
        empty = torch.zeros(0, dtype=torch.long)
        self.cooc_client = empty if cooc_client is None else cooc_client
        self.cooc_index = empty if cooc_index is None else cooc_index
        self.cooc_value = torch.zeros(0, dtype=x.dtype) if cooc_value is None else cooc_value
        if self.cooc_client.numel() and "cooc" not in layout.names:
            raise ConfigError("co-occurrence pairs need a layout with a cooc part")
        self._cooc_offset = self.n_items * self.dim + self.dim * self.dim + self.n_items
        self._by_item: tuple[torch.Tensor, torch.Tensor] | None = None

    def dense(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        if rows is None:
            rows = torch.arange(len(self), dtype=torch.long)
        n, d = self.n_items, self.dim
        out = torch.zeros(rows.shape[0], self.layout.size, dtype=torch.float32)
        position = torch.full((len(self),), -1, dtype=torch.long)
        position[rows] = torch.arange(rows.shape[0], dtype=torch.long)
        keep = position[self.pair_client] >= 0
        row = position[self.pair_client[keep]]
        item = self.pair_item[keep]
        x = self.x.to(torch.float32)
        grad = out[:, : n * d].view(rows.shape[0], n, d)
        grad[row, item] = self.coef[keep].to(torch.float32).unsqueeze(1) * x[self.pair_client[keep]]
        xr = x[rows] * self.gram_scale[rows].to(torch.float32).sqrt().unsqueeze(1)
        out[:, n * d : n * d + d * d] = (xr.unsqueeze(2) * xr.unsqueeze(1)).reshape(-1, d * d)
        out[:, n * d + d * d : n * d + d * d + n][row, item] = self.count[keep].to(torch.float32)
        if self.cooc_client.numel():
            keep = position[self.cooc_client] >= 0
            cooc = out[:, self._cooc_offset :]
            cooc[position[self.cooc_client[keep]], self.cooc_index[keep]] = self.cooc_value[
                keep
            ].to(torch.float32)
        return out

    def dense_block(self, lo: int, hi: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Coordinates ``lo .. hi - 1`` of every upload, the same values as :meth:`dense`, in
        work proportional to the block (a streamed secure round asks for one block at a
        time): the item rows, Gram entries, counts and co-occurrence pairs that reach into it."""
        m, n, d = len(self), self.n_items, self.dim
        out = block_buffer(out, m, hi - lo, zero=True)
        if self._by_item is None:  # once per round's uploads (a race only repeats it)
            self._by_item = pairs_by_item(self.pair_item, n)
        x = self.x.to(torch.float32)
        coef = self.coef.to(torch.float32)
        by_item = self._by_item
        write_item_rows(
            out,
            lo,
            hi,
            offset=0,
            width=d,
            n_items=n,
            client=self.pair_client,
            item=self.pair_item,
            rows=lambda sel: coef[sel].unsqueeze(1) * x[self.pair_client[sel]],
            by_item=by_item,
        )
        g0, g1 = max(lo, n * d), min(hi, n * d + d * d)
        if g1 > g0:
            xr = x * self.gram_scale.to(torch.float32).sqrt().unsqueeze(1)
            k = torch.arange(g0 - n * d, g1 - n * d)
            i, j = k // d, k % d
            out[:, g0 - lo : g1 - lo] = xr[:, i] * xr[:, j]
        count = self.count.to(torch.float32)
        write_item_rows(
            out,
            lo,
            hi,
            offset=n * d + d * d,
            width=1,
            n_items=n,
            client=self.pair_client,
            item=self.pair_item,
            rows=lambda sel: count[sel].unsqueeze(1),
            by_item=by_item,
        )
        if self.cooc_client.numel() and hi > self._cooc_offset:
            pos = self.cooc_index + self._cooc_offset
            keep = (pos >= lo) & (pos < hi)
            out[self.cooc_client[keep], pos[keep] - lo] = self.cooc_value[keep].to(torch.float32)
        return out

    def norms(self) -> torch.Tensor:
        x = self.x.double()
        xsq = (x * x).sum(1)
        m = len(self)
        grad_sq = (
            torch.zeros(m, dtype=torch.float64).index_add_(
                0, self.pair_client, self.coef.double() ** 2
            )
            * xsq
        )
        count_sq = torch.zeros(m, dtype=torch.float64).index_add_(
            0, self.pair_client, self.count.double() ** 2
        )
        gram_sq = (self.gram_scale.double() * xsq) ** 2
        cooc_sq = torch.zeros(m, dtype=torch.float64).index_add_(
            0, self.cooc_client, self.cooc_value.double() ** 2
        )
        return (grad_sq + gram_sq + count_sq + cooc_sq).sqrt()

    def weighted_sum(self, weights: torch.Tensor) -> torch.Tensor:
        w = weights.to(torch.float64)
        x = self.x.double()
        n, d = self.n_items, self.dim
        pw = w[self.pair_client] * self.coef.double()
        grad = torch.zeros(n, d, dtype=torch.float64).index_add_(
            0, self.pair_item, pw.unsqueeze(1) * x[self.pair_client]
        )
        gram = (x * (w * self.gram_scale.double()).unsqueeze(1)).T @ x
        count = torch.zeros(n, dtype=torch.float64).index_add_(
            0, self.pair_item, w[self.pair_client] * self.count.double()
        )
        parts = [grad.reshape(-1), gram.reshape(-1), count]
        if "cooc" in self.layout.names:
            size = self.layout.size - self._cooc_offset
            parts.append(
                torch.zeros(size, dtype=torch.float64).index_add_(
                    0, self.cooc_index, w[self.cooc_client] * self.cooc_value.double()
                )
            )
        return torch.cat(parts).to(torch.float32)


@dataclass(frozen=True)
class FedALSPlan:
    """A round's plan: the cohort in upload row order and, in a private count round that
    samples, the (client position, item) pairs each client counts."""

    participants: torch.Tensor
    pair_client: torch.Tensor | None = None
    pair_item: torch.Tensor | None = None


class FedALS:
    """Federated implicit ALS with every participant's solve batched (module docstring)."""

    name = "fedals"

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
        if dpsgd is not None:
            raise ConfigError("fedals has no interaction-level DP-SGD; use --privacy-unit user")
        config = resolve_dim(resolve_reg(config), split.n_items)
        if config.private:
            config = with_population(config)  # unset: the small mode's settings
        elif config.count_rounds is None:
            config = dataclasses.replace(config, count_rounds=1)  # read by no round
        self.split = split
        self.config = config
        self.device = torch.device(device)
        d = config.factor_dim
        self.gram = gram_size(config, split.n_items)
        no_count = config.private and not config.count_only and config.count_rounds == 0
        if config.private and config.count_rounds == 0 and (config.gram_head_z or 0) > 0:
            raise ConfigError(
                "gram_head_z keeps the co-occurrence items whose released count clears the "
                "noise, and count_rounds = 0 releases no count; give count_rounds >= 1 (or "
                "gram_head_z = 0)"
            )
        if (
            config.private
            and config.gram_items == 0
            and (config.tail_counts or (config.gram_head_z or 0) > 0)
        ):
            raise ConfigError(
                "tail_counts and gram_head_z shape the co-occurrence rounds, and gram_items = 0 "
                "has none; drop them (or give gram_items > 0)"
            )
        if no_count and 0 < self.gram < split.n_items:
            raise ConfigError(
                f"the co-occurrence rounds choose their {self.gram} items from a released "
                "count, and count_rounds = 0 releases none; give count_rounds >= 1 (or "
                "gram_items = 0)"
            )
        self.layout = fedals_layout(split.n_items, d, self.gram)
        self.V = torch.randn(split.n_items, d, generator=generator) * config.init_std
        self._eval_x: torch.Tensor | None = None
        # Private mode: the released counts (inverse-variance combined over rounds), the
        # items with factors, and how many rounds the server has applied.
        self.prior = torch.zeros(split.n_items)
        self._prior_precision = 0.0
        self.head = torch.ones(split.n_items, dtype=torch.bool)
        self.rounds_applied = 0
        # Private mode: whether the count-only rule made every round a count round.
        self.count_only = bool(config.private and config.count_only)
        if self.count_only:
            self.V = torch.zeros_like(self.V)  # no factors: scores are the count alone
        # Private mode, co-occurrence rounds: the sum of their releases and how many.
        self._cooc_sum: torch.Tensor | None = None
        self._cooc_releases = 0
        # The sum of the co-occurrence releases' noise variances (None: unknown, a state saved
        # before it was kept).
        self._cooc_noise_var: float | None = 0.0
        # Private mode: the share of the co-occurrence items whose count cleared the
        # noise-limited head rule's z when this server decided it (None: not decided here; a
        # diagnostic, not state: whether the rule fired is read off the head, sparse_head).
        self.head_share: float | None = None

    # ------------------------------------------------------------------ clients
    def _pairs(self, users: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(position in ``users``, item) of every training positive of ``users``."""
        local, items = self.split.train_pairs(users.numpy())
        return torch.from_numpy(local), torch.from_numpy(items)

    def _row_reg(self, counts: torch.Tensor, n_other: int) -> float | torch.Tensor:
        """The L2 weight of rows with ``counts`` observations: ``reg``, or one weight per row
        with ``reg_frequency``."""
        cfg = self.config
        if not cfg.reg_frequency:
            return float(cfg.reg)
        return frequency_reg(counts, n_other, alpha=float(cfg.alpha), reg=float(cfg.reg))

    def _user_reg(self, local: torch.Tensor, n: int) -> float | torch.Tensor:
        """Each of ``n`` users' weight, from its number of training pairs in ``local``."""
        reg = self._row_reg(torch.bincount(local, minlength=n), self.split.n_items)
        return reg.to(self.V.dtype) if isinstance(reg, torch.Tensor) else reg

    def solve_users(self, users: torch.Tensor, v: torch.Tensor | None = None) -> torch.Tensor:
        """Each user's closed-form factor against ``v`` (default: the current V), ``[B, d]``."""
        v = self.V if v is None else v
        users = users.to(torch.long).cpu()
        local, items = self._pairs(users)
        cfg = self.config
        reg = self._user_reg(local, users.shape[0])
        a, b = normal_equations(v, local, items, users.shape[0], alpha=float(cfg.alpha), reg=reg)
        return solve_rows(a, b)

    def plan_round(
        self, participants: torch.Tensor, generator: torch.Generator | None
    ) -> FedALSPlan:
        """The cohort, and in a private count round with ``count_items`` the items each
        client counts (a uniform sample drawn on the device: from OS randomness under
        ``os_sampling`` or without a ``generator``)."""
        users = participants.to(torch.long).cpu()
        cfg = self.config
        if not (cfg.private and self._counting() and cfg.count_items is not None):
            return FedALSPlan(participants=users)
        from securefed.models.mostpop import bounded_pairs

        local, items = self._pairs(users)
        source = None if cfg.os_sampling else generator
        local, items = bounded_pairs(local, items, users.shape[0], cfg.count_items, source)
        return FedALSPlan(participants=users, pair_client=local, pair_item=items)

    def client_round(
        self, participants: torch.Tensor, round_index: int, generator: torch.Generator | None
    ) -> tuple[FedALSUpdates, RoundStats]:
        """Every participant solves its factor and forms its upload (batched). Without a
        ``generator`` a ``count_items`` sample comes from OS randomness (never skipped: each
        count then weighs ``1/sqrt(count_items)`` and only the clip would bound the upload)."""
        return self._train_plan(self.plan_round(participants, generator))

    def train_subset(
        self, plan: FedALSPlan, keep: torch.Tensor, round_index: int
    ) -> tuple[FedALSUpdates, RoundStats]:
        """The participants at positions ``keep`` of a cohort's plan (a Flower node's own)."""
        if plan.pair_client is None or plan.pair_item is None:
            return self._train_plan(FedALSPlan(participants=plan.participants[keep]))
        m = plan.participants.shape[0]
        remap = torch.full((m,), -1, dtype=torch.long)
        remap[keep] = torch.arange(keep.shape[0])
        sel = remap[plan.pair_client] >= 0
        sub = FedALSPlan(
            participants=plan.participants[keep],
            pair_client=remap[plan.pair_client[sel]],
            pair_item=plan.pair_item[sel],
        )
        return self._train_plan(sub)

    def _train_plan(self, plan: FedALSPlan) -> tuple[FedALSUpdates, RoundStats]:
        users = plan.participants
        cfg = self.config
        x = self.solve_users(users)
        local, items = self._pairs(users)
        s = (x[local] * self.V[items]).sum(1)
        # iALS loss of each participant at its solution (Gramian trick), for the metrics line.
        g = self.V.T @ self.V
        per_user = ((x @ g) * x).sum(1) + self._user_reg(local, users.shape[0]) * (x * x).sum(1)
        per_user.index_add_(0, local, (1.0 + cfg.alpha) * (1.0 - s) ** 2 - s * s)
        loss = float(per_user.mean()) if users.numel() else float("nan")
        if cfg.private:
            if plan.pair_client is not None and plan.pair_item is not None:
                local, items = plan.pair_client, plan.pair_item
            updates = self._private_upload(users, x, local, items)
        else:
            updates = FedALSUpdates(
                clients=users,
                layout=self.layout,
                x=x,
                pair_client=local,
                pair_item=items,
                coef=cfg.alpha * s - (1.0 + cfg.alpha),
            )
        return updates, RoundStats(loss=loss, samples=int(items.shape[0]))

    @property
    def _count_rounds(self) -> int:
        """The run's count rounds (``config.count_rounds``, resolved in ``__init__``)."""
        return self.config.count_rounds or 0

    def _counting(self) -> bool:
        return self.count_only or self.rounds_applied < self._count_rounds

    def _gram_round(self) -> bool:
        """Private mode: a co-occurrence round (after the count rounds, with ``gram_items``)."""
        return self.gram > 0 and not self._counting()

    @property
    def sparse_head(self) -> bool:
        """Whether the noise-limited head rule (``sparse_head_below``) fired: the rule applies
        and the head holds fewer of the catalogue's items than the set has room for, which
        only the rule leaves it (the top ``limit`` otherwise; every item before the count
        rounds end). A function of the released head, so a node receiving the model and a
        resumed server agree without state of their own."""
        if self.gram == 0 or not sparse_head_rule(self.config):
            return False
        kept, room = self._set_fill()
        return kept < room

    def _set_fill(self) -> tuple[int, int]:
        """The co-occurrence set's catalogue items in the head, and its room for them (an
        audit's canary items, the catalogue's last, stand in it beside them)."""
        n = self.split.n_items
        audit = min(self.config.gram_audit_items, n)
        return int(self.head[: n - audit].sum()), self.gram - audit

    def run_notes(self) -> list[str]:
        """What the private mode decided from its releases (``summary.json``'s
        ``model_notes``): the noise-limited head rule's outcome, where it applied (the share
        that cleared only in the run that decided it: a resumed server keeps the head, not
        the share)."""
        if self.gram == 0 or not sparse_head_rule(self.config) or self._counting():
            return []  # no rule, or the count rounds never ended: nothing was decided
        kept, room = self._set_fill()
        cfg = self.config
        rule = (
            f"noise-limited head rule (fewer than {float(cfg.sparse_head_below or 0):.0%} of the "
            f"{room:,} most counted items clearing {cfg.sparse_head_z:g} noise stds)"
        )
        share = "" if self.head_share is None else f" ({self.head_share:.0%} cleared them)"
        if self.sparse_head:
            return [
                f"private fedals: {rule} fired{share}: factors for the {kept:,} items that "
                "clear them, every other item counted again in the co-occurrence rounds"
            ]
        return [f"private fedals: {rule} did not fire{share}: factors for all {room:,}"]

    def _tail_counts(self) -> bool:
        """Co-occurrence rounds also count the items without a factor (``tail_counts``, or
        the noise-limited head rule having fired)."""
        return bool(self.config.tail_counts or self.sparse_head)

    def _gram_items(self) -> torch.Tensor:
        """The co-occurrence rounds' items (the head, ascending), a public function of the
        released counts (every client derives it from the ``head`` it receives)."""
        return torch.nonzero(self.head).reshape(-1)

    def _gram_upload(
        self, users: torch.Tensor, x: torch.Tensor, local: torch.Tensor, items: torch.Tensor
    ) -> FedALSUpdates:
        """A co-occurrence round's upload: a client with ``k >= 2`` of the round's ``M`` items
        sends ``sqrt(2 / (k (k - 1)))`` at each of its ``k (k - 1) / 2`` pairs ``a < b``
        (positions in the ``cooc`` part's upper triangle), L2 norm exactly 1; fewer items,
        nothing. With ``tail_counts`` it also counts each of its ``t`` items without a factor
        ``w = 1 / sqrt(max(n, min_weight_items))`` (as the count round does) and scales its
        pairs by ``sqrt(1 - t w^2)``: L2 norm <= 1. Nothing else is sent (no factor or
        Gramian)."""
        m, big = users.shape[0], self.gram
        tail_local = torch.zeros(0, dtype=torch.long)
        tail_items = torch.zeros(0, dtype=torch.long)
        tail_count = torch.zeros(0, dtype=x.dtype)
        pair_scale = torch.ones(m, dtype=x.dtype)
        if self._tail_counts():
            w = self._item_weight(local, m, x.dtype)
            tail = ~self.head[items]
            tail_local, tail_items = local[tail], items[tail]
            tail_count = w[tail_local]
            t = torch.bincount(tail_local, minlength=m).to(x.dtype)
            pair_scale = torch.sqrt((1.0 - t * w * w).clamp_min(0.0))
        position = torch.full((self.split.n_items,), -1, dtype=torch.long)
        gram_items = self._gram_items()
        position[gram_items] = torch.arange(gram_items.shape[0])
        pos = position[items]
        keep = pos >= 0
        client, pos = local[keep], pos[keep]
        order = torch.argsort(client * big + pos)
        client, pos = client[order], pos[order]
        k = torch.bincount(client, minlength=m)
        start = torch.cumsum(k, 0) - k
        rank = torch.arange(client.shape[0]) - start[client]
        after = k[client] - rank - 1  # partners after each entry within its client
        first = torch.repeat_interleave(torch.arange(client.shape[0]), after)
        j = torch.arange(first.shape[0]) - (torch.cumsum(after, 0) - after)[first]
        a, b = pos[first], pos[first + 1 + j]
        index = pair_index(a, b, big)
        kf = k.to(x.dtype)
        weight = torch.where(
            k >= 2, torch.sqrt(2.0 / (kf * (kf - 1.0)).clamp_min(1.0)), torch.zeros_like(kf)
        )
        weight = weight * pair_scale
        return self._factorless_upload(
            users,
            x,
            tail_local,
            tail_items,
            tail_count,
            cooc_client=client[first],
            cooc_index=index,
            cooc_value=weight[client[first]],
        )

    def _factorless_upload(
        self,
        users: torch.Tensor,
        x: torch.Tensor,
        local: torch.Tensor,
        items: torch.Tensor,
        count: torch.Tensor,
        **cooc: torch.Tensor,
    ) -> FedALSUpdates:
        """An upload without factor, gradient rows or Gramian: a count round's counts
        (``count`` at each ``(local, items)`` pair) or a co-occurrence round's pairs."""
        return FedALSUpdates(
            clients=users,
            layout=self.layout,
            x=torch.zeros_like(x),
            pair_client=local,
            pair_item=items,
            coef=torch.zeros(local.shape[0], dtype=x.dtype),
            count=count,
            gram_scale=torch.zeros(users.shape[0], dtype=x.dtype),
            **cooc,
        )

    def _newton_round(self) -> bool:
        """Private mode: ALS rounds after the first take a Newton step on V (the first, from
        the random initialisation, solves for V directly)."""
        return self.rounds_applied > self._count_rounds

    def _item_weight(self, local: torch.Tensor, m: int, dtype: torch.dtype) -> torch.Tensor:
        """Each of ``m`` clients' weight per item, ``1 / sqrt(max(n, min_weight_items))`` for
        its ``n`` pairs in ``local`` (its items' norm at most 1)."""
        n = torch.bincount(local, minlength=m).to(dtype)
        return 1.0 / torch.sqrt(n.clamp_min(float(self.config.min_weight_items)))

    def _private_upload(
        self, users: torch.Tensor, x: torch.Tensor, local: torch.Tensor, items: torch.Tensor
    ) -> FedALSUpdates:
        """The private mode's upload, L2 norm <= 1 by construction (docs/privacy.md).

        Count rounds: each of the client's items counts ``w = 1 / sqrt(max(n, k0))`` (with
        ``count_items = k``: ``k`` sampled items, ``1 / sqrt(k)`` each). ALS
        rounds: only the client's head items enter, with ``w`` over their number; the factor is
        normalised to unit length; item rows, counts and Gramian are scaled by the square roots
        of their ``shares`` of the unit budget.
        """
        cfg = self.config
        if self._gram_round():
            return self._gram_upload(users, x, local, items)
        m = users.shape[0]
        if not self._counting():
            keep = self.head[items]
            local, items = local[keep], items[keep]
        w = self._item_weight(local, m, x.dtype)
        if self._counting() and cfg.count_items is not None:
            w = torch.full_like(w, 1.0 / math.sqrt(cfg.count_items))
        if self._counting():
            return self._factorless_upload(users, x, local, items, w[local])
        s_rows, s_count, s_gram = (math.sqrt(f) for f in cfg.shares)
        unit = x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)
        coef = w[local]
        if self._newton_round():
            # Later ALS rounds send the data part of the item gradient, each row
            # w (alpha s - (1 + alpha)) x_hat with s = x_hat . v_i clamped to [-1, 1] and scaled
            # by 1 / (2 alpha + 1), so a row's norm stays <= w and the upload's <= 1.
            s = (unit[local] * self.V[items]).sum(1).clamp(-1.0, 1.0)
            coef = coef * (cfg.alpha * s - (1.0 + cfg.alpha)) / (2.0 * cfg.alpha + 1.0)
        return FedALSUpdates(
            clients=users,
            layout=self.layout,
            x=unit,
            pair_client=local,
            pair_item=items,
            coef=s_rows * coef,
            count=s_count * w[local],
            gram_scale=torch.full((m,), s_gram, dtype=x.dtype),
        )

    # ------------------------------------------------------------------ server
    def apply_aggregate(self, aggregate: Aggregate, round_index: int) -> None:
        """One approximate Newton step on V from the (possibly noised) sums; in the private
        mode a count update or the approximate ALS item solve (docs/privacy.md)."""
        total = aggregate.total.to(torch.float64)
        if total.shape != (self.layout.size,):
            raise ConfigError(
                f"aggregate must be a flat vector of {self.layout.size} floats, "
                f"got shape {tuple(total.shape)}"
            )
        parts = self.layout.split(total)
        n_users = self.split.n_users
        # Sums over the cohort, scaled to population totals (1 with every client).
        scale = n_users / max(float(aggregate.denominator), 1e-12)
        gram = scale * 0.5 * (parts["gram"] + parts["gram"].T)
        evals, evecs = torch.linalg.eigh(gram)
        evals = evals.clamp_min(0.0)  # a noised Gramian may not be PSD
        if self.config.private:
            self._private_step(parts, scale, evals, evecs, aggregate.noise_std * scale)
        else:
            grad_data = scale * parts["item_grad"]
            counts = (scale * parts["count"]).clamp_min(0.0)
            reg = self._row_reg(counts, n_users)
            if isinstance(reg, torch.Tensor):
                reg = reg.unsqueeze(1)  # one weight per item row
            v = self.V.to(torch.float64)
            grad = v @ (evecs * evals) @ evecs.T + grad_data + reg * v
            # Per-item Hessian eigenvalues: lambda_j (1 + alpha n_i / N) + reg.
            h = evals.unsqueeze(0) * (1.0 + self.config.alpha * counts / n_users).unsqueeze(1) + reg
            step = ((grad @ evecs) / h) @ evecs.T
            self.V = (v - self.config.step * step).to(torch.float32)
        self.rounds_applied += 1
        self._eval_x = None

    def _private_step(
        self,
        parts: dict[str, torch.Tensor],
        scale: float,
        evals: torch.Tensor,
        evecs: torch.Tensor,
        noise_std: float,
    ) -> None:
        cfg = self.config
        counting = self._counting()
        s_count = 1.0 if counting else math.sqrt(cfg.shares[1])
        # A co-occurrence round's count part (tail_counts) is folded into the tail below.
        if s_count > 0 and (counting or (cfg.combine_counts and not self._gram_round())):
            # Inverse-variance combination of every round's count release (noise std
            # noise_std / s_count on the unscaled counts).
            estimate = scale * parts["count"] / s_count
            precision = s_count**2
            total = self._prior_precision + precision
            self.prior = (
                (self.prior.double() * self._prior_precision + estimate * precision) / total
            ).to(torch.float32)
            self._prior_precision = total
        if self._gram_round() and self._tail_counts():
            # The tail's counts, weighted as the count round's (precision 1 each release): the
            # count rounds' precision and one for each co-occurrence release before this one.
            tail = ~self.head
            estimate = scale * parts["count"][tail]
            before = self._prior_precision + self._cooc_releases
            self.prior[tail] = (
                (self.prior[tail].double() * before + estimate) / (before + 1.0)
            ).to(torch.float32)
        if counting:
            if self.rounds_applied + 1 == self._count_rounds or self._count_rounds == 0:
                self._choose_head(noise_std)
            return
        if self.rounds_applied == 0:  # no count round: every item keeps a factor
            self._choose_head(noise_std)
        if self.gram:
            self._gram_step(scale * parts["cooc"].double(), noise_std)
            return
        s_rows = math.sqrt(cfg.shares[0])
        if s_rows == 0:
            return
        rows = scale * parts["item_grad"] / s_rows
        counts = self.prior.double().clamp_min(0.0)
        n_users = self.split.n_users
        if self._newton_round():
            # fedals's Newton step (docs/models.md) on the weighted objective, from the
            # gradient rows (undo the 1 / (2 alpha + 1) scaling) and the unscaled Gramian.
            s_gram = math.sqrt(cfg.shares[2])
            g_evals = evals / s_gram if s_gram > 0 else evals
            v = self.V.to(torch.float64)
            data = rows * (2.0 * cfg.alpha + 1.0)
            grad = v @ (evecs * g_evals) @ evecs.T + data + cfg.item_reg * v
            h = (
                g_evals.unsqueeze(0) * (1.0 + cfg.alpha * counts / n_users).unsqueeze(1)
                + cfg.item_reg
            )
            v = v - ((grad @ evecs) / h) @ evecs.T
        else:
            # First ALS round, approximate ALS item solve from b_i = sum_u w_u x_hat_u:
            # (G' + item_reg + alpha n_i G' / N)^-1 (1 + alpha) b_i, where G' is the Gramian
            # as released (its share's square root included: that weight was tuned with it).
            h = evals.unsqueeze(0) * (1.0 + cfg.alpha * counts / n_users).unsqueeze(1)
            h = h + cfg.item_reg
            v = (((1.0 + cfg.alpha) * rows @ evecs) / h) @ evecs.T
        v[~self.head] = 0.0
        self.V = v.to(torch.float32)

    def _gram_step(self, cooc: torch.Tensor, noise_std: float) -> None:
        """A co-occurrence release: average it with the earlier ones (equal noise), and set
        the head items' factors to ``gram_scale * u_j sqrt(lambda_j / lambda_1)`` for the
        ``d`` leading eigenpairs of the symmetric matrix (zero diagonal) it fills: the item
        factors of the unweighted ALS fixed point (PureSVD) of the released co-occurrence.
        The other items keep none."""
        self._cooc_sum = cooc if self._cooc_sum is None else self._cooc_sum + cooc
        self._cooc_releases += 1
        if self._cooc_noise_var is not None:
            self._cooc_noise_var += noise_std**2
        self._set_gram_factors()

    def _cooc_matrix(self) -> torch.Tensor | None:
        """The averaged co-occurrence releases as the symmetric matrix (zero diagonal) over the
        head's positions; None before a co-occurrence round or with fewer than two items."""
        used = int(self.head.sum())
        if self._cooc_sum is None or used < 2:
            return None
        big = self.gram
        rows, cols = torch.triu_indices(big, big, offset=1)
        c = torch.zeros(big, big, dtype=torch.float64)
        c[rows, cols] = self._cooc_sum / self._cooc_releases
        # The head's positions only (gram_head_z may leave the last ones unused: noise alone).
        c = c[:used, :used]
        return c + c.T

    def cooc_noise_std(self) -> float:
        """The noise std of each entry of the averaged co-occurrence releases, as the
        aggregates' ``noise_std`` gave it (a lower bound with noise shares inside secure
        aggregation, sized for the fewest survivors); 0 without noise or before a
        co-occurrence round, NaN for a model restored from a state saved before it was kept."""
        if self._cooc_releases == 0:
            return 0.0
        if self._cooc_noise_var is None:
            return math.nan
        return math.sqrt(self._cooc_noise_var) / self._cooc_releases

    def cooc_spectrum(self) -> tuple[torch.Tensor, float] | None:
        """The eigenvalues (descending) of the averaged co-occurrence releases and the edge
        of the noise's bulk, ``2 s sqrt(m)`` (``s`` :meth:`cooc_noise_std`, ``m`` the
        matrix's size): an eigenvalue below the edge is indistinguishable from noise alone
        (:func:`spectral_shrink`). None before a co-occurrence round or with fewer than two
        items in the head."""
        c = self._cooc_matrix()
        if c is None:
            return None
        evals = torch.linalg.eigvalsh(c).flip(0)
        return evals, 2.0 * self.cooc_noise_std() * math.sqrt(c.shape[0])

    def _set_gram_factors(self) -> None:
        c = self._cooc_matrix()
        if c is None:  # no pair: no factor
            self.V = torch.zeros_like(self.V)
            return
        used = c.shape[0]
        evals, evecs = torch.linalg.eigh(c)
        d = min(self.config.factor_dim, used)
        top = torch.argsort(evals, descending=True, stable=True)[:d]
        lam = evals[top].clamp_min(0.0)
        noise = self.cooc_noise_std()
        if self.config.gram_shrink and noise > 0:
            lam = spectral_shrink(lam, noise, used)
        lead = float(lam[0]) if d else 0.0
        v = torch.zeros(self.split.n_items, self.config.factor_dim, dtype=torch.float64)
        if lead > 0:
            factors = evecs[:, top] * torch.sqrt(lam / lead)
            v[self._gram_items(), :d] = self.config.gram_scale * factors
        self.V = v.to(torch.float32)

    def _choose_head(self, noise_std: float) -> None:
        """Items whose released count clears ``head_z`` noise stds (all counted items without
        noise); the others get no factor and are ranked by the count alone. With
        co-occurrence rounds: the ``gram_items`` items with the largest released counts (those
        of them that clear ``gram_head_z`` noise stds; with ``sparse_head_below``, those that
        clear ``sparse_head_z`` where fewer than that share of them do)."""
        # The released count's noise std (0 without noise: nothing to clear).
        std = noise_std / math.sqrt(max(self._prior_precision, 1e-12)) if noise_std > 0 else 0.0
        if self.gram:
            n = self.split.n_items
            audit = min(self.config.gram_audit_items, n)  # an audit's canary items: the last
            top = torch.argsort(self.prior[: n - audit], descending=True, stable=True)
            limit = self.gram - audit
            ranked = self.prior[top[:limit]]  # the counts of the set's candidates, descending
            z = float(self.config.gram_head_z or 0.0)
            if z > 0 and std > 0:
                limit = int((ranked > z * std).sum())
            elif sparse_head_rule(self.config) and std > 0 and limit > 0:
                clear = int((ranked > self.config.sparse_head_z * std).sum())
                self.head_share = clear / limit
                if clear < float(self.config.sparse_head_below or 0.0) * limit:
                    limit = clear  # the set falls short of its room: what sparse_head reads
            self.head = torch.zeros(n, dtype=torch.bool)
            self.head[top[:limit]] = True
            self.head[n - audit :] = True
            self.V = torch.zeros_like(self.V)
            return
        threshold = float(self.config.head_z or 0.0) * std  # settled by with_population
        self.head = self.prior > max(threshold, 0.0)
        v = self.V.clone()
        v[~self.head] = 0.0
        self.V = v

    def end_round(self, round_index: int) -> None:
        """Nothing to do: fedals has no schedules."""

    # ------------------------------------------------------------------ scoring
    def _user_factors(self) -> torch.Tensor:
        if self._eval_x is None:
            n = self.split.n_users
            block = self.config.eval_block
            parts = [
                self.solve_users(torch.arange(lo, min(n, lo + block))) for lo in range(0, n, block)
            ]
            self._eval_x = torch.cat(parts) if parts else torch.zeros(0, self.config.factor_dim)
        return self._eval_x

    def user_factors(self) -> torch.Tensor:
        """Every user's factor as its device would solve it from the current V, ``[N, d]``."""
        return self._user_factors().clone()

    def _prior_scores(self) -> torch.Tensor | None:
        """What the private mode adds to ``x_u . v_i``: the weighted log count, and with
        ``tail_last`` the tail (items without a factor) moved below every item with one,
        in the order of its released count."""
        if not self.config.private:
            return None
        log_count = torch.log1p(self.prior.clamp_min(0.0))
        # Count-only: the count is the whole model (any positive weight ranks the same).
        weight = 1.0 if self.count_only else self.config.prior_weight
        out = weight * log_count if weight else None
        tail = ~self.head
        if self.config.tail_last and not self.count_only and bool(tail.any()):
            out = out.clone() if out is not None else torch.zeros_like(log_count)
            out[tail] = log_count[tail] - TAIL_OFFSET
        return out

    @torch.no_grad()
    def score(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        items = items.to(torch.long).cpu()
        x = self._user_factors()[users.to(torch.long).cpu()]
        out = (x.unsqueeze(1) * self.V[items]).sum(-1)
        prior = self._prior_scores()
        return out if prior is None else out + prior[items]

    @torch.no_grad()
    def score_all(self, users: torch.Tensor) -> torch.Tensor:
        out = self._user_factors()[users.to(torch.long).cpu()] @ self.V.T
        prior = self._prior_scores()
        return out if prior is None else out + prior.unsqueeze(0)

    # ------------------------------------------------------------------ state
    def global_parameters(self) -> dict[str, torch.Tensor]:
        """What every participant receives: the item factors V and, public because released,
        the private mode's counts, its head items (whose size tells the noise-limited head
        rule's decision), the server's round counter and the count-only rule's decision."""
        return {
            "V": self.V,
            "prior": self.prior,
            "head": self.head.to(torch.float32),
            "rounds_applied": torch.tensor([float(self.rounds_applied)]),
            "count_only": torch.tensor([float(self.count_only)]),
        }

    def set_global_parameters(self, tensors: dict[str, torch.Tensor]) -> None:
        self.V = tensors["V"].to(torch.float32).clone()
        if "prior" in tensors:
            self.prior = tensors["prior"].to(torch.float32).clone()
            self.head = tensors["head"] > 0.5
            self.rounds_applied = int(tensors["rounds_applied"].reshape(-1)[0])
            if "count_only" in tensors:
                self.count_only = bool(tensors["count_only"].reshape(-1)[0] > 0.5)
        self._eval_x = None

    def state_dict(self) -> dict[str, Any]:
        """The server's state (clients keep none between rounds: they re-solve ``x_u``)."""
        return {
            "config": asdict(self.config),
            "V": self.V.clone(),
            "prior": self.prior.clone(),
            "prior_precision": self._prior_precision,
            "head": self.head.clone(),
            "rounds_applied": self.rounds_applied,
            "count_only": self.count_only,
            "cooc_sum": None if self._cooc_sum is None else self._cooc_sum.clone(),
            "cooc_releases": self._cooc_releases,
            # Only once something is released and while known: a fresh model's state then has
            # no such key, so a Flower server's checkpoint from before it was kept (which
            # lacks it) still restores (load_server_state asks for every key of that state).
            **(
                {"cooc_noise_var": self._cooc_noise_var}
                if self._cooc_releases and self._cooc_noise_var is not None
                else {}
            ),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        v = state.get("V")
        if not isinstance(v, torch.Tensor) or tuple(v.shape) != tuple(self.V.shape):
            raise ConfigError(
                f"state entry V must have shape {tuple(self.V.shape)}; was it saved from a "
                "fedals model with the same data and config?"
            )
        prior = state.get("prior", self.prior)
        head = state.get("head", self.head)
        if tuple(prior.shape) != tuple(self.prior.shape) or tuple(head.shape) != tuple(
            self.head.shape
        ):
            raise ConfigError("state entries prior/head do not match this catalogue")
        self.V = v.to(torch.float32).clone()
        self.prior = prior.to(torch.float32).clone()
        self.head = head.to(torch.bool).clone()
        self._prior_precision = float(state.get("prior_precision", 0.0))
        self.rounds_applied = int(state.get("rounds_applied", 0))
        self.count_only = bool(state.get("count_only", False))
        cooc = state.get("cooc_sum")
        if cooc is not None and (
            not isinstance(cooc, torch.Tensor) or cooc.shape != (self.gram * (self.gram - 1) // 2,)
        ):
            raise ConfigError("state entry cooc_sum does not match this model's gram_items")
        self._cooc_sum = None if cooc is None else cooc.to(torch.float64).clone()
        self._cooc_releases = int(state.get("cooc_releases", 0))
        noise_var = state.get("cooc_noise_var")
        if noise_var is None and self._cooc_releases == 0:
            noise_var = 0.0  # nothing released yet: nothing unknown
        self._cooc_noise_var = None if noise_var is None else float(noise_var)
        self._eval_x = None


def spectral_shrink(evals: torch.Tensor, noise_std: float, size: int) -> torch.Tensor:
    """The leading eigenvalues of a symmetric ``size x size`` matrix observed through
    independent Gaussian noise of std ``noise_std`` on each off-diagonal entry, shrunk to
    what they say about the matrix without noise.

    A clean eigenvalue ``theta`` above ``noise_std sqrt(size)`` shows as ``lambda = theta +
    noise_std^2 size / theta`` and its eigenvector keeps a squared overlap ``1 - (noise_std^2
    size / theta^2)`` with the clean one; an eigenvalue at or below the noise bulk's edge ``2
    noise_std sqrt(size)`` carries no information about its direction (Benaych-Georges and
    Nadakuditi, "The eigenvalues and eigenvectors of finite, low rank perturbations of large
    random matrices", Adv. Math. 2011). Each is replaced by ``theta`` times that overlap (the
    eigenvalue that minimises the squared error of the rank-one term ``lambda u u^T``; Donoho,
    Gavish and Johnstone, "Optimal shrinkage of eigenvalues in the spiked covariance model",
    Ann. Stat. 2018, for the covariance case), and by 0 inside the bulk.
    """
    scale = noise_std * math.sqrt(size)
    if scale <= 0:
        return evals
    # lambda / scale = t + 1 / t with t = theta / scale >= 1; at the edge (and inside the bulk,
    # clamped to it) t = 1 and the overlap 1 - 1 / t^2 is 0.
    ratio = (evals / scale).to(torch.float64).clamp_min(2.0)
    t = (ratio + (ratio**2 - 4.0).sqrt()) / 2.0
    return (scale * t * (1.0 - 1.0 / t**2)).to(evals.dtype)


# ---------------------------------------------------------------------- registry entry
def _item_rows(
    flat: torch.Tensor, global_before: dict[str, torch.Tensor], n_items: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per item: its ``item_grad`` row with its ``count`` entry appended (``[c, n, d + 1]``:
    the private mode's count rounds upload only the counts, so a row test on the gradient
    rows alone would see nothing), and the ``item_grad`` rows, each ``coef * x_u`` (collinear
    with x_u; all zero in a count round)."""
    d = int(global_before["V"].shape[1])
    c = flat.shape[0]
    grad = flat[:, : n_items * d].view(c, n_items, d)
    count = flat[:, n_items * d + d * d : n_items * d + d * d + n_items].view(c, n_items, 1)
    return torch.cat([grad, count], dim=2), grad


def _prepare_audit(config: Any, canary_items: int) -> Any:
    """An audit's canary items (the catalogue's last ``canary_items``) join the co-occurrence
    set, so that the canary test reads the co-occurrence releases: the set is a public
    function of earlier releases, and a release's guarantee holds for whichever set it is
    given (docs/attacks.md). Without co-occurrence rounds it changes nothing."""
    params = dataclasses.replace(config.params, gram_audit_items=canary_items)
    return dataclasses.replace(config, params=params)


def _canary_cooc(
    flat: torch.Tensor, global_before: dict[str, torch.Tensor], items: torch.Tensor
) -> torch.Tensor:
    """``[c, G]``: row ``r``'s co-occurrence coordinates of item ``items[r]`` with each of the
    ``G`` co-occurrence items (zero at itself, and everywhere for an item outside the set);
    ``[c, 0]`` when the upload has no co-occurrence part this round. The part's size comes
    from the upload (``gram_head_z`` may leave fewer items in the set than it has room for:
    they take its first positions)."""
    head = global_before["head"] > 0.5
    n = int(head.shape[0])
    d = int(global_before["V"].shape[1])
    members = torch.nonzero(head).reshape(-1)
    g = int(members.shape[0])
    length = int(flat.shape[1]) - (n * d + d * d + n)
    big = int(round((1.0 + math.sqrt(1.0 + 8.0 * max(length, 0))) / 2.0))
    if length <= 0 or big * (big - 1) // 2 != length or g < 2 or g > big:
        return flat.new_zeros(flat.shape[0], 0)
    cooc = fedals_layout(n, d, big).split(flat)["cooc"]
    position = torch.full((n,), -1, dtype=torch.long)
    position[members] = torch.arange(g)
    p = position[items.to(torch.long)].unsqueeze(1)
    q = torch.arange(g).unsqueeze(0)
    a, b = torch.minimum(p, q), torch.maximum(p, q)
    index = pair_index(a, b, big)
    valid = (p >= 0) & (q != p)
    out = cooc.gather(1, index.clamp(0, length - 1).expand(flat.shape[0], g))
    return out * valid


def _resolve(params: FedALSConfig, privacy: Any) -> FedALSConfig:
    """User-level DP runs use the private mode unless it was set explicitly; then the
    regularisation rule (:func:`resolve_reg`)."""
    if params.private is None:
        dp = bool(getattr(privacy, "dp", False)) and not getattr(privacy, "interaction_dp", False)
        params = dataclasses.replace(params, private=dp)
    os_sampling = bool(getattr(privacy, "os_randomness", False))
    return resolve_reg(dataclasses.replace(params, os_sampling=os_sampling))


def _rounds(privacy: Any) -> int:
    """20 rounds without DP; under user-level DP three releases: the count round and two
    co-occurrence rounds, so the count has a third of the run's precision (chosen on
    MovieLens 100K validation at epsilon 2, docs/privacy.md, "The co-occurrence rounds"; the
    large mode runs :data:`LARGE_ROUNDS`)."""
    return 3 if privacy is not None and getattr(privacy, "dp", False) else 20


# ---------------------------------------------------------------------------- costs

#: Seconds per (interaction x dim^2 + user x dim^3) of an ALS sweep on the development
#: machine (securefed.costs scales it to the machine at hand).
ALS_SECONDS = 2.0e-9
#: Private mode, co-occurrence rounds: resident bytes per uploaded pair at the round's peak
#: (the upload's client, index and value, and the int64 index arithmetic that forms them;
#: the clip's norms and the sum's float64 copies). Measured 2026-12-07: private fedals at
#: epsilon 2 peaked at 1.42-1.45 GB on the built-in synthetic data (7.43 M pairs a round) and
#: 0.97-0.98 GB on MovieLens 100K (4.32 M), 0.45 GB (process and data) apart from the pairs.
PAIR_BYTES = 120
#: Seconds per uploaded pair on the development machine: forming it on the device, the
#: clip's norm and the server's sum (measured 2026-12-07, 110-230 ns on MovieLens 100K and
#: the synthetic data).
PAIR_SECONDS = 1.7e-7
#: Seconds per user x item of a full ranking beyond the dot products (the candidate mask,
#: the popularity prior added to every score, the ranks of the validation and the test item),
#: which do not shrink with the private mode's dimension 16 (measured 2026-12-07: 55-140 ns).
RANK_SECONDS = 5.0e-8
#: Seconds per (co-occurrence items)^3: the eigendecomposition of the released matrix.
EIGH_SECONDS = 1.0e-9


def _state_bytes(params: FedALSConfig, shape: RunShape, written_rows: int | None) -> dict[str, int]:
    """The bytes of :meth:`FedALS.state_dict`'s tensors at the dimension the run resolves, at
    the end of its rounds: in the private mode with co-occurrence rounds, the float64 sum of
    their releases (``cooc_sum``, ``G (G - 1) / 2`` entries, held from the first of them on:
    5.7x the rest on MovieLens 100K)."""
    d = resolve_dim(params, shape.items).factor_dim
    out = {"V": shape.items * d * 4, "prior": shape.items * 4, "head": shape.items}
    gram = gram_size(params, shape.items)
    if gram >= 2:
        out["cooc_sum"] = gram * (gram - 1) // 2 * 8
    return out


def als_work(inputs: CostInputs, *, sweep_seconds: float) -> ModelWork:
    """An ALS round's memory (the cohort's interactions with their factor rows, the users'
    normal equations) and its evaluation by dot products, with ``sweep_seconds`` for the
    round (on the development machine)."""
    params = resolve_dim(inputs.config.params, inputs.shape.items)
    u, i, d = inputs.shape.users, inputs.shape.items, params.factor_dim
    n_train = inputs.shape.train_interactions
    return ModelWork(
        round_seconds=sweep_seconds,
        round_bytes=int(
            inputs.fraction * n_train * (d + 4) * 8 * 3 + inputs.participants * d * d * 8
        ),
        full_eval_seconds=DOT_EVAL_S * u * i * d,
        eval_seconds=DOT_EVAL_S * u * 200 * d,
        eval_bytes=EVAL_BLOCK * i * 4 * 3 + u * d * 8,
    )


def cooc_pairs(params: FedALSConfig, shape: RunShape, fraction: float) -> float:
    """Pairs a co-occurrence round's cohort uploads: the pairs of the ``G`` co-occurrence items
    its users hold (:meth:`RunShape.pairs_in_head`, the most counted items standing for the
    released counts' choice; an audit's canary items apart); without the data, each user's
    mean history capped at ``G``."""
    gram = gram_size(params, shape.items)
    if gram < 2:
        return 0.0
    # An audit's canary items (the catalogue's last) join the set beside the most counted
    # items; each canary holds a pair of them, nothing like the most counted items' pairs.
    head = gram - min(params.gram_audit_items, shape.items)
    counted = shape.pairs_in_head(head)
    if counted is not None:
        return fraction * counted
    k = min(shape.train_interactions / max(shape.users, 1), head)
    return fraction * shape.users * k * max(k - 1.0, 0.0) / 2


def _work(inputs: CostInputs) -> ModelWork:
    params = resolve_dim(inputs.config.params, inputs.shape.items)
    u, i, d = inputs.shape.users, inputs.shape.items, params.factor_dim
    m, n_train = inputs.participants, inputs.shape.train_interactions
    sweep = ALS_SECONDS * (inputs.fraction * n_train * d * d + m * d**3 + i * d**3)
    work = als_work(inputs, sweep_seconds=sweep)
    # The user factors an evaluation solves (every user's, the cohort's sweep's terms): in
    # both modes (the non-private estimate left it out: 0.08 s for ~0.7 s measured under load).
    solve = ALS_SECONDS * (n_train * d * d + u * d**3)
    if not params.private:
        return dataclasses.replace(
            work,
            eval_seconds=solve + work.eval_seconds,
            full_eval_seconds=solve + work.full_eval_seconds,
        )
    params = with_population(params)  # a population left unset runs the small one
    # Every round still solves the cohort's factors (the sweep); the co-occurrence rounds
    # upload their pairs (PAIR_BYTES, PAIR_SECONDS each) and the server decomposes the
    # G x G matrix. The releases' dense sum, its noise and their float64 copies are about
    # six vectors of the layout, the co-occurrence part included. Measured 2026-12-07 on
    # MovieLens 100K at epsilon 2 (4.32 M pairs a round): 0.98 GB peak RSS, 621 MB estimated
    # before the pairs were counted from the data at PAIR_BYTES (docs/benchmarks.md).
    gram = gram_size(params, i)  # the run's, once resolved for the data (else 400)
    rounds = max(int(inputs.config.rounds), 1)
    counting = rounds if params.count_only else min(int(params.count_rounds or 0), rounds)
    gram_rounds = rounds - counting if gram >= 2 else 0
    pairs = cooc_pairs(params, inputs.shape, inputs.fraction)
    layout = fedals_layout(i, d, gram).size
    pair_bytes = int(PAIR_BYTES * pairs) if gram_rounds else 0
    round_bytes = max(work.round_bytes, pair_bytes) + 6 * layout * 8
    per_gram_round = PAIR_SECONDS * pairs + EIGH_SECONDS * gram**3
    # The user factors (above), the sampled protocol's 2 x 200 candidates and the full
    # ranking's work per user x item.
    sampled = DOT_EVAL_S * u * 2 * 201 * d
    return dataclasses.replace(
        work,
        round_bytes=round_bytes,
        round_seconds=sweep + per_gram_round * gram_rounds / rounds,
        eval_seconds=solve + sampled,
        full_eval_seconds=solve + sampled + (DOT_EVAL_S * d + RANK_SECONDS) * u * i,
    )


def resolve_for_costs(params: FedALSConfig, shape: RunShape) -> FedALSConfig:
    """:func:`resolve_dim` for a cost estimate's shape."""
    return resolve_dim(params, shape.items)


SPEC = ModelSpec(
    name="fedals",
    title="fedals: federated implicit ALS (Hu et al. 2008; Ammad-ud-din et al. 2019)",
    params=FedALSConfig,
    build=FedALS,
    default_rounds=_rounds,
    full_eval_every=1,
    # The private mode's upload has L2 norm <= 1 by construction: the clip never binds.
    dp_clip=1.0,
    streams_uploads=True,
    resolve_params=_resolve,
    resolve_for_data=resolve_population,
    layout_size=lambda p, split: (
        fedals_layout(
            split.n_items, resolve_dim(p, split.n_items).factor_dim, gram_size(p, split.n_items)
        ).size
    ),
    observer=ObserverHooks(
        item_rows=_item_rows,
        private_vectors=lambda model: model.user_factors(),
        # A positive's row is (alpha s - (1 + alpha)) x_u with s = x_u . v_i < 1 + 1/alpha
        # for all but the most over-fitted pairs: along -x_u.
        truth_direction=lambda private, gb: -private,
        recovered_embedding=lambda direction, gb: -direction,
        ratio_width=lambda gb: int(gb["V"].shape[1]),
        positives_minority=False,
        # The canary test reads the item's gradient row and count (a count round releases only
        # the count) along the canary's own contribution: the private mode's first ALS round
        # pushes a positive's row along +x_u, later rounds (and runs without DP) along -x_u.
        canary_rows=lambda flat, gb, n_items: _item_rows(flat, gb, n_items)[0],
        canary_own_direction=True,
        # Co-occurrence rounds release item pairs: each canary owns a pair of fresh items, the
        # audit adds them to the co-occurrence set, and the test reads the canary item's row
        # of the released co-occurrence beside its gradient row and count.
        canary_items=2,
        prepare_audit=_prepare_audit,
        canary_extra=_canary_cooc,
    ),
    unsupported_attacks={
        "imia": "fedals samples no negatives: every non-zero item row of an upload is a "
        "training positive, which the row-change attack already reads exactly",
        "optimization": "where a fedals upload carries the user factor (x_u x_u^T without DP "
        "and in the private mode's ALS rounds) it is read off up to its sign, no gradient "
        "matching needed (the gradient-ratio attack scores it); the private mode's count and "
        "co-occurrence rounds upload no factor at all",
        "released": "not implemented for fedals yet",
    },
    # model.pt: the shared parameters, not the co-occurrence releases' sum (cooc_sum).
    costs=ModelCosts(
        state=_state_bytes,
        work=_work,
        released=("V", "prior", "head"),
        resolve=resolve_for_costs,
    ),
)
