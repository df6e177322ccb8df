"""What distributed noise is worth against the server's colluders (docs/privacy.md,
"Colluders' noise shares are not noise").

With ``--secagg`` and user-level DP the noise is the sum of the survivors' discrete Gaussian
shares. Secure aggregation's threat model lets ``ceil(g m)`` of a round's ``m`` clients
collude with the server (``secagg_corrupt`` ``g``, 0.05 by default); they know their own
shares and can subtract them, so only the others are noise against that coalition. Until
2026-12-06 the shares were sized, and every round accounted, as if all ``ceil((1 - f) m)``
survivors' shares were noise. This script prints, per setting, the epsilon against the
coalition (RDP of the round's plan with the survivors less the colluders as contributors,
composed over the rounds) for the shares sized then (recomputed here from the protocol's
functions) and for the shares securefed sizes now (``PrivateAggregator.discrete_noise``,
calibrated for the honest shares), at the largest cohort of the run.

    python benchmarks/colluder_shares.py --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import math

from protocols.dp.mechanisms import (
    calibrate_distributed_noise_multiplier,
    distributed_epsilon,
    distributed_noise_plan,
)
from securefed.config import PrivacyConfig, TrainConfig
from securefed.privacy import PrivateAggregator
from securefed.training import build_aggregator, build_model, load_split

# (label, dataset, users or None, model, client fraction, rounds, epsilon)
SETTINGS = [
    ("synthetic 60 x 400", "synthetic", 60, "fedrap", 1.0, 20, 8.0),
    ("MovieLens 100K", "ml-100k", None, "fedrap", 1.0, 100, 2.0),
    ("MovieLens 100K", "ml-100k", None, "fedrap", 0.1, 100, 2.0),
]


def before(agg: PrivateAggregator, m: int, epsilon: float) -> tuple[float, float]:
    """Share sigma and epsilon against the coalition of the shares sized before 2026-12-06:
    calibrated for ``t = ceil((1 - f) m)`` survivors' shares, each of std
    ``sigma D2 / sqrt((1 - f) m)``."""
    assert agg.dp is not None and agg._discrete_scale is not None
    p = agg.p
    t = max(1, math.ceil((1.0 - p.secagg_dropout) * m))
    common = {"clip": agg.dp.clip, "scale": agg._discrete_scale, "dim": agg.dim}
    sigma = calibrate_distributed_noise_multiplier(
        epsilon=epsilon,
        delta=p.delta,
        sample_rate=agg.sample_rate,
        steps=agg.rounds,
        min_survivors=t,
        n_users=agg.n_users,
        **common,
    )
    plan = distributed_noise_plan(
        noise_multiplier=sigma,
        min_survivors=t,
        share_divisor=min(float(t), (1.0 - p.secagg_dropout) * m),
        **common,
    )
    eps = distributed_epsilon(
        plan,
        sample_rate=agg.sample_rate,
        steps=agg.rounds,
        delta=p.delta,
        noise_contributors=max(1, t - agg.colluders(m)),
    )
    return plan.share_sigma, eps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir", default="../shared/data")
    a = ap.parse_args()
    print(
        "| data | q | rounds | printed eps | cohort m | colluders | survivor floor then / now "
        "| share sigma now / then | eps against colluders then | now |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, dataset, users, model, q, rounds, eps in SETTINGS:
        extra = {"synthetic_users": users, "synthetic_items": 400} if users else {}
        cfg = TrainConfig(
            model=model,
            dataset=dataset,
            data_dir=a.data_dir,
            rounds=rounds,
            client_fraction=q,
            privacy=PrivacyConfig(secagg=True, epsilon=eps),
            **extra,
        )
        split = load_split(cfg)
        agg = build_aggregator(cfg, split, build_model(cfg, split))
        assert isinstance(agg, PrivateAggregator)
        m = agg._largest_cohort()
        ddg = agg.discrete_noise(m)
        assert ddg is not None
        plan = ddg.plan
        now = distributed_epsilon(
            plan,
            sample_rate=agg.sample_rate,
            steps=rounds,
            delta=cfg.privacy.delta,
            noise_contributors=agg.honest_shares(plan.min_survivors, m),
        )
        share_then, eps_then = before(agg, m, eps)
        t_then = math.ceil((1.0 - cfg.privacy.secagg_dropout) * m)
        print(
            f"| {label} | {q:g} | {rounds} | {eps:g} | {m:,} | {agg.colluders(m)} "
            f"| {t_then} / {plan.min_survivors} | {plan.share_sigma / share_then:.4f} "
            f"| {eps_then:.3f} | {now:.3f} |"
        )


if __name__ == "__main__":
    main()
