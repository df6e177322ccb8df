"""How much the canary audit can see (docs/attacks.md, "What the audit can and cannot see").

Three measurements, each printed as a markdown table:

* ``caps``: the largest lower bound a *perfect* attack can reach with ``M`` canaries at the
  audit's levels (each bound at ``alpha = 0.025``, delta 1e-5), over ``--draws`` draws of
  which canaries are included. The one-run guesser calls the top ``r/2`` scores "in" and the
  bottom ``r/2`` "out" (``attacks.canaries.one_run_bound``), so unless exactly half the
  canaries were included a perfect attack loses guesses at the grid's largest ``r``.
* ``false-alarms``: scores of an exactly known Gaussian mechanism (``mu * included + N(0,
  1)``, true epsilon at delta 1e-5 from the Gaussian's privacy profile, Balle and Wang 2018):
  how often each bound exceeds the true epsilon (allowed: 0.025) and its median.
* ``broken``: the audit of a run whose central noise is multiplied by ``--factors`` while the
  ledger still accounts the calibrated sigma (a mutant of ``CentralGaussian.noise_for_sum``):
  what lower bound the audit reports when the mechanism is weaker than printed. Small runs
  (60 synthetic users, 1,000 items, 2 rounds, every user, epsilon 2, 100 canaries).
* ``poisson``: audits of Poisson-cohort runs at the correct noise, beside the printed
  (amplified) and the unamplified epsilon.

    python benchmarks/audit_power.py caps false-alarms broken
"""

from __future__ import annotations

import argparse
import math
import tempfile

import numpy as np
from scipy import optimize, stats

from attacks.canaries import clopper_pearson_bound, one_run_bound

DELTA = 1e-5
ALPHA = 0.025  # each bound's level in an audit without a prior (attacks.report)


def caps(draws: int) -> None:
    print(
        "| canaries | one-run cap: 5 % / 50 % / 95 % / max | exactly balanced "
        "| Clopper-Pearson max |"
    )
    print("|---|---|---|---|")
    for m in (100, 256):
        rng = np.random.default_rng(0)
        one, cp = [], []
        for _ in range(draws):
            inc = rng.random(m) < 0.5
            s = inc + rng.random(m) * 1e-3  # a perfect attack
            one.append(one_run_bound(s, inc, delta=DELTA, alpha=ALPHA)[0])
            cp.append(clopper_pearson_bound(s, inc, delta=DELTA, alpha=ALPHA, rng=rng))
        q = np.quantile(one, [0.05, 0.5, 0.95, 1.0])
        inc = np.arange(m) < m // 2
        balanced = one_run_bound(inc + 0.0, inc, delta=DELTA, alpha=ALPHA)[0]
        cells = " / ".join(f"{v:.2f}" for v in q)
        print(f"| {m} | {cells} | {balanced:.2f} | {max(cp):.2f} |")


def gaussian_epsilon(mu: float, delta: float) -> float:
    def gap(e: float) -> float:
        a = stats.norm.cdf(-e / mu + mu / 2) - math.exp(e) * stats.norm.cdf(-e / mu - mu / 2)
        return a - delta

    return optimize.brentq(gap, 0.0, 200.0) if gap(0.0) > 0 else 0.0


def false_alarms(draws: int) -> None:
    print("| mu | canaries | true epsilon | one-run above it | CP above it | median bound |")
    print("|---|---|---|---|---|---|")
    for mu, m in ((1.0, 256), (2.0, 256), (3.0, 256), (4.0, 100), (6.0, 256)):
        truth = gaussian_epsilon(mu, DELTA)
        rng = np.random.default_rng(1)
        over_one = over_cp = 0
        best = []
        for _ in range(draws):
            inc = rng.random(m) < 0.5
            s = mu * inc + rng.standard_normal(m)
            one = one_run_bound(s, inc, delta=DELTA, alpha=ALPHA)[0]
            cp = clopper_pearson_bound(s, inc, delta=DELTA, alpha=ALPHA, rng=rng)
            over_one += one > truth
            over_cp += cp > truth
            best.append(max(one, cp))
        print(
            f"| {mu:g} | {m} | {truth:.2f} | {over_one / draws:.3f} | {over_cp / draws:.3f} "
            f"| {np.median(best):.2f} |"
        )


def broken(models: list[str], factors: list[float]) -> None:
    from protocols.dp import CentralGaussian

    real = CentralGaussian.noise_for_sum
    from attacks.audit import AuditConfig, audit
    from securefed.training import PrivacyConfig, TrainConfig

    small = {"synthetic_users": 60, "synthetic_items": 1000, "eval_every": 100}
    print("| model | noise factor | true epsilon (about) | accounted | lower bound | canary AUC |")
    print("|---|---|---|---|---|---|")
    for model in models:
        for factor in factors:

            def scaled(self, dim, *a, _f=factor, **k):
                return real(self, dim, *a, **k) * _f

            CentralGaussian.noise_for_sum = scaled  # type: ignore[method-assign]
            try:
                cfg = TrainConfig(
                    model=model,
                    rounds=2,
                    client_fraction=1.0,
                    checkpoint_every=100,
                    privacy=PrivacyConfig(epsilon=2.0, replay=True),
                    **small,
                )
                with tempfile.TemporaryDirectory() as tmp:
                    res = audit(
                        AuditConfig(train=cfg, attacks=("differencing",), canaries=100),
                        out=f"{tmp}/a",
                    )
            finally:
                CentralGaussian.noise_for_sum = real  # type: ignore[method-assign]
            block = res.report["audit"]
            sigma = res.report["noise_multiplier"]
            truth = "inf" if factor == 0 else f"{_two_round_epsilon(sigma * factor):.1f}"
            print(
                f"| {model} | {factor:g} | {truth} | {res.report['accounted_epsilon']:.2f} "
                f"| {block['epsilon_lower_bound']:.2f} | {block['canary_auc']:.3f} |"
            )


def poisson() -> None:
    """Audits of Poisson-cohort runs at the correct noise: the bound against the printed
    (amplified) and the unamplified epsilon (300 synthetic users, 1,000 items, 5 rounds,
    256 canaries)."""
    from attacks.audit import AuditConfig, audit
    from securefed.training import PrivacyConfig, TrainConfig

    print("| model | q | epsilon | accounted | unamplified | lower bound | canary AUC |")
    print("|---|---|---|---|---|---|---|")
    for model, q, eps in (("fedrap", 0.1, 2.0), ("fedrecgel", 0.1, 2.0), ("fedrap", 0.5, 8.0)):
        cfg = TrainConfig(
            model=model,
            rounds=5,
            client_fraction=q,
            synthetic_users=300,
            synthetic_items=1000,
            eval_every=100,
            checkpoint_every=100,
            privacy=PrivacyConfig(epsilon=eps),
        )
        with tempfile.TemporaryDirectory() as tmp:
            res = audit(
                AuditConfig(train=cfg, attacks=("differencing",), canaries=256), out=f"{tmp}/a"
            )
        block = res.report["audit"]
        print(
            f"| {model} | {q:g} | {eps:g} | {block['accounted_epsilon']:.3f} "
            f"| {block['accounted_epsilon_unamplified']:.3f} "
            f"| {block['epsilon_lower_bound']:.3f} | {block['canary_auc']:.3f} |"
        )


def _two_round_epsilon(sigma: float) -> float:
    """Two unsampled Gaussian releases at ``sigma``: one at ``sigma / sqrt(2)``."""
    return gaussian_epsilon(math.sqrt(2.0) / sigma, DELTA)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("what", nargs="+", choices=("caps", "false-alarms", "broken", "poisson"))
    ap.add_argument("--draws", type=int, default=400)
    ap.add_argument("--models", default="mostpop,fedals,fedrap,fedrecgel")
    ap.add_argument("--factors", default="1,0.5,0.25,0.1,0")
    a = ap.parse_args()
    for what in a.what:
        print(f"\n{what}:")
        if what == "caps":
            caps(a.draws)
        elif what == "false-alarms":
            false_alarms(a.draws)
        elif what == "poisson":
            poisson()
        else:
            broken(a.models.split(","), [float(f) for f in a.factors.split(",")])


if __name__ == "__main__":
    main()
