"""A synthetic implicit-feedback dataset with planted structure, shaped like MovieLens 100K.

Generative model (all draws from generators derived from ``seed`` per purpose):

* user factors ``P[u] ~ N(0, I/dim)`` and item factors ``Q[i] ~ N(0, I/dim)``;
* item popularity is Zipf-like: item ``i`` gets a random popularity rank ``r_i`` and the
  log-weight ``-zipf_exponent * log(r_i)``;
* user ``u`` picks ``n_u`` distinct items from the softmax of
  ``affinity_scale * sqrt(dim) * <P[u], Q[i]> - zipf_exponent * log(r_i)``, sampled without
  replacement with the Gumbel-top-k trick (one sort of a ``[n_users, n_items]`` matrix);
* history lengths ``n_u = min_history + LogNormal(mu, sigma)`` (clipped to half the
  catalogue), which at the default size gives a minimum of 20 and a mean near 106 with a
  heavy tail, like MovieLens 100K;
* timestamps: each user starts at a random time in a 7-month window and interacts with their
  items in random order with exponential gaps, so the held-out (latest) item is not biased
  towards the user's favourite or least favourite items;
* ``attributes["gender"]`` (0/1, about 29 % ones as in MovieLens 100K) thresholds a noisy
  linear function of the user factors, so attribute-inference attacks have real signal
  whose strength is set by ``attribute_strength``.
"""

from __future__ import annotations

import math

import numpy as np

from protocols.seeding import numpy_generator
from securefed.data.types import Interactions, LoadReport
from securefed.errors import ConfigError

__all__ = ["make_synthetic"]

_START = 874_724_710.0  # first MovieLens 100K timestamp (1997-09-20)
_WINDOW = 215 * 86_400.0  # about the MovieLens 100K collection period


def make_synthetic(
    *,
    n_users: int = 943,
    n_items: int = 1682,
    seed: int = 0,
    dim: int = 8,
    min_history: int = 20,
    mean_history: float = 106.0,
    zipf_exponent: float = 1.0,
    affinity_scale: float = 2.0,
    attribute_strength: float = 2.0,
    attribute_rate: float = 0.29,
) -> Interactions:
    """Generate a deterministic synthetic dataset (see the module docstring for the model).

    Args:
        n_users: Number of users.
        n_items: Number of items (some unpopular items may get no interaction).
        seed: Root seed; the same arguments always give the same data.
        dim: Dimension of the planted latent factors.
        min_history: Minimum interactions per user (clipped to half the catalogue).
        mean_history: Target mean history length before clipping to half the catalogue.
        zipf_exponent: Exponent of the Zipf-like popularity prior (0 = no popularity bias).
        affinity_scale: Weight of the latent affinity against popularity (0 = popularity
            only, nothing personal to learn).
        attribute_strength: How strongly ``"gender"`` follows the user factors (0 =
            independent, no signal for an attribute-inference attack).
        attribute_rate: Fraction of users with ``gender == 1``.

    Returns:
        Interactions with timestamps, ``attributes["gender"]`` and
        ``report.synthetic == True``.
    """
    if n_users < 1 or n_items < 4:
        raise ConfigError(
            f"synthetic data needs n_users >= 1 and n_items >= 4, got {n_users!r}, {n_items!r}"
        )
    if dim < 1:
        raise ConfigError(f"dim must be at least 1, got {dim!r}")
    if not 0.0 < attribute_rate < 1.0:
        raise ConfigError(f"attribute_rate must be in (0, 1), got {attribute_rate!r}")
    if min_history < 3 or mean_history <= min_history:
        raise ConfigError(
            f"need 3 <= min_history < mean_history, got {min_history!r}, {mean_history!r}"
        )

    # Factors and popularity.
    rng = numpy_generator(seed, "synthetic", "factors")
    user_f = rng.standard_normal((n_users, dim)) / math.sqrt(dim)
    item_f = rng.standard_normal((n_items, dim)) / math.sqrt(dim)
    pop_rank = rng.permutation(n_items) + 1
    log_pop = -zipf_exponent * np.log(pop_rank)

    # History lengths: min + lognormal excess with median = 0.55 * (mean - min).
    rng = numpy_generator(seed, "synthetic", "lengths")
    cap = max(3, n_items // 2)
    low = min(min_history, cap)
    excess_mean = mean_history - min_history
    sigma = math.sqrt(2.0 * math.log(1.0 / 0.55))
    mu = math.log(0.55 * excess_mean)
    lengths = low + np.floor(rng.lognormal(mu, sigma, size=n_users)).astype(np.int64)
    lengths = np.minimum(lengths, cap)

    # Gumbel-top-k: the first n_u items of each row sorted by logit + Gumbel noise are a
    # sample without replacement from the softmax of the logits.
    rng = numpy_generator(seed, "synthetic", "choices")
    logits = (affinity_scale * math.sqrt(dim)) * (user_f @ item_f.T) + log_pop
    logits += rng.gumbel(size=logits.shape)
    ranked = np.argsort(-logits, axis=1, kind="stable")
    chosen = np.arange(n_items)[None, :] < lengths[:, None]
    users = np.repeat(np.arange(n_users, dtype=np.int64), lengths)
    items = ranked[chosen].astype(np.int64)

    # Random order within each user, then increasing timestamps.
    rng = numpy_generator(seed, "synthetic", "timestamps")
    order = np.lexsort((rng.random(len(users)), users))
    items = items[order]
    start = _START + rng.random(n_users) * (_WINDOW / 2)
    gaps = rng.exponential(scale=1.0, size=len(users))
    indptr = np.concatenate(([0], np.cumsum(lengths)))
    cum = np.cumsum(gaps)
    offsets = cum - np.repeat(cum[indptr[:-1]] - gaps[indptr[:-1]], lengths)
    span = np.repeat(offsets[indptr[1:] - 1], lengths)
    budget = np.repeat(_WINDOW / 2 * rng.random(n_users), lengths)
    timestamps = np.floor(np.repeat(start, lengths) + offsets / span * budget)

    # Attribute correlated with the latent factors.
    rng = numpy_generator(seed, "synthetic", "attributes")
    direction = rng.standard_normal(dim)
    score = user_f @ direction
    score = (score - score.mean()) / (score.std() + 1e-12)
    latent = attribute_strength * score + rng.logistic(size=n_users)
    gender = (latent > np.quantile(latent, 1.0 - attribute_rate)).astype(np.int64)

    return Interactions(
        name="synthetic",
        users=users,
        items=items,
        timestamps=timestamps,
        n_users=n_users,
        n_items=n_items,
        user_ids=np.arange(n_users, dtype=np.int64),
        item_ids=np.arange(n_items, dtype=np.int64),
        attributes={"gender": gender},
        report=LoadReport(
            source=f"synthetic(seed={seed})",
            raw_rows=len(users),
            duplicate_rows=0,
            dropped_users=0,
            dropped_interactions=0,
            synthetic=True,
            notes=(
                f"synthetic data: {n_users} users, {n_items} items, {len(users)} interactions "
                f"from planted {dim}-dim factors and Zipf popularity; results say nothing about "
                "real users",
            ),
        ),
    )
