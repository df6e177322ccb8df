"""The canary test on the private popularity prior's release (``--private-prior``).

A run with the prior (:mod:`securefed.prior`) makes two kinds of Gaussian releases: one sum of
every user's bounded count vector before the first round (noise std ``sigma_p * sqrt(k)`` per
item) and then the model's rounds (noise std ``sigma * C``). The per-round canary statistic of
:mod:`attacks.recorder` reads the rounds; this module scores the canaries on the prior, with
the same known-others DP adversary: from the released counts it subtracts every other user's
clipped contribution, formed as the device forms it (:func:`securefed.prior.prior_updates`,
deterministic given the data and the run seed), which leaves the canary's own contribution
(its weight ``sqrt(k / 3)`` on its item, or 1 when ``sample`` draws it) plus the release's
noise. No real user has a canary item, so the residual at a canary's item is its released
count itself; the subtraction is kept so the statistic stays the known-others one if that
ever changes.

The two statistics are not added up: their signals and noises are on different scales and any
fixed weighting would let the weaker release drown the stronger one. :mod:`attacks.report`
computes a bound from each at half the significance level (Bonferroni) and reports the larger.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from securefed.errors import DataError

if TYPE_CHECKING:
    from attacks.canaries import Canaries
    from securefed.config import PrivacyConfig
    from securefed.data.types import Split

__all__ = ["load_prior_counts", "prior_canary_scores"]


def load_prior_counts(run_dir: Path) -> np.ndarray:
    """The released (noisy) counts of the run's popularity prior (``PRIOR_FILE``)."""
    from securefed import runs
    from securefed.prior import PRIOR_FILE

    path = Path(run_dir) / PRIOR_FILE
    state = runs.load_state(path)
    if state is None or not state.get("released"):
        raise DataError(
            f"the run's released popularity prior {path} is missing; audit the run again"
        )
    return state["counts"].to(torch.float64).numpy()


def prior_canary_scores(
    counts: np.ndarray, split: Split, canaries: Canaries, privacy: PrivacyConfig, *, seed: int
) -> np.ndarray:
    """Each canary's known-others statistic on the prior's release, ``[m]``.

    Args:
        counts: The released counts over the planted catalogue (real and canary items).
        split: The planted split (every canary client, ``null_users`` the null ones), as the
            run trained it.
        canaries: User-level canaries.
        privacy: The run's privacy settings (``prior_items``, ``prior_weighting``).
        seed: The run seed (the ``sample`` weighting's draw derives from it).

    Returns:
        ``released count - other users' contributions`` at each canary's item: its own
        contribution plus the noise when real, the noise alone when null.
    """
    from securefed.federation.aggregation import null_out
    from securefed.prior import prior_updates

    if canaries.unit != "user":
        raise ValueError("the prior's canary test is for user-level canaries")
    k = int(privacy.prior_items)
    updates = prior_updates(
        split,
        max_items=k,
        seed=seed,
        weighting=privacy.prior_weighting,
        secure=privacy.os_randomness,  # False: audits replay, so the sample is the run's
    )
    clip = float(np.sqrt(k))
    factors = null_out(
        torch.clamp(clip / updates.norms().clamp_min(1e-30), max=1.0),
        updates.clients,
        split.null_users,
    )
    everyone = updates.weighted_sum(factors).to(torch.float64).numpy()
    items = canaries.items
    # Each canary client's own contribution (zero for a null one), added back: the released
    # count minus every other user's contribution.
    rows = torch.from_numpy(canaries.users)
    dense = updates.dense(rows).to(torch.float64) * factors[rows].unsqueeze(1).double()
    own = dense[torch.arange(rows.shape[0]), torch.from_numpy(items)].numpy()
    return np.asarray(counts, dtype=np.float64)[items] - everyone[items] + own
