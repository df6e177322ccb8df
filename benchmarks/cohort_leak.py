"""What a Poisson cohort's *size* tells an observer of the releases (docs/privacy.md,
"Distributed noise sized for each round's cohort").

Amplification by sampling (the printed epsilon of a run with ``--client-fraction q < 1``)
holds against an observer who does not learn the cohorts. Under add/remove neighbours a
cohort's size ``m`` is itself such information: it is ``Binomial(N, q)`` without user ``u``
and that plus ``Bernoulli(q)`` with it. This script computes, for each population ``N`` and
rate ``q``, over ``R`` rounds at ``delta``:

* ``abort``: the probability that a round aborts when the distributed noise shares are sized
  for a fixed ``t = ceil((1 - f) floor(q N))`` survivors (what securefed did before
  2026-12-06): the round aborts whenever fewer than ``t`` clients were sampled.
* ``eps(aborts)``: the epsilon of the ``R`` abort/release flags alone (the observer sees
  which rounds released). Exact: the flags are i.i.d. across rounds, so the privacy loss
  depends on the number of aborts only (a binomial); the larger of the two directions and of
  the two neighbours (``N + 1`` and ``N - 1`` users).
* ``eps(sizes)``: the epsilon of revealing every round's exact cohort size, which fixed-``t``
  sizing came close to (the sum's noise variance is ``m / t`` of the calibrated one, and its
  estimate over ``d`` coordinates has relative std ``sqrt(2 / d)``: 0.6 % at ``d`` 53,824,
  where one more client of 94 moves it by 1.1 %). Privacy-loss distribution of one round
  composed ``R`` times by FFT on a grid of ``--grid`` nats, rounded down and up: the true
  value lies between the two printed numbers.

Neither is in any ledger; securefed now sizes each round's shares for its own cohort
(``PrivateAggregator.discrete_noise``), so no round aborts for a short sample and the noise
variance does not depend on ``m``.

    python benchmarks/cohort_leak.py --populations 943,1336,29858 --fractions 0.1,0.3
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from scipy.signal import fftconvolve
from scipy.stats import binom


def eps_of_flags(p: float, p2: float, rounds: int, delta: float) -> float:
    """Smallest epsilon (to 1e-4) with ``sum_k max(0, P(k) - e^eps Q(k)) <= delta`` for ``k``
    aborts out of ``rounds``, aborts w.p. ``p`` under P and ``p2`` under Q."""
    ks = np.arange(rounds + 1)
    lp, lq = binom.logpmf(ks, rounds, p), binom.logpmf(ks, rounds, p2)
    return _smallest_eps(lp, lq, delta)


def _smallest_eps(lp: np.ndarray, lq: np.ndarray, delta: float) -> float:
    return _bisect(
        lambda eps: float(np.clip(np.exp(lp) - np.exp(eps + lq), 0.0, None).sum()), delta
    )


def _bisect(excess, delta: float) -> float:
    """Smallest epsilon (to 1e-4) with ``excess(epsilon) <= delta`` (``excess`` decreasing)."""
    if excess(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while excess(hi) > delta:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-4:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if excess(mid) > delta else (lo, mid)
    return hi


def _pld(p: np.ndarray, q: np.ndarray, grid: float, up: bool) -> tuple[int, np.ndarray]:
    keep = p > 0
    loss = np.log(p[keep]) - np.log(np.maximum(q[keep], 1e-300))
    idx = (np.ceil if up else np.floor)(loss / grid).astype(np.int64)
    lo = int(idx.min())
    mass = np.zeros(int(idx.max()) - lo + 1)
    np.add.at(mass, idx - lo, p[keep])
    return lo, mass


def _compose(lo: int, mass: np.ndarray, times: int) -> tuple[int, np.ndarray]:
    out_lo, out = 0, np.array([1.0])
    while times:
        if times & 1:
            out, out_lo = np.clip(fftconvolve(out, mass), 0.0, None), out_lo + lo
        times >>= 1
        if times:
            mass, lo = np.clip(fftconvolve(mass, mass), 0.0, None), 2 * lo
    return out_lo, out


def eps_of_sizes(pmf: np.ndarray, pmf2: np.ndarray, rounds: int, delta: float, grid: float):
    """(lower, upper) epsilon of ``rounds`` exact cohort sizes drawn from ``pmf`` vs ``pmf2``.

    Sizes where either pmf is below 1e-25 are left out (their losses span tens of nats and
    would make the grid huge); the upper value charges their mass, ``rounds`` times, to
    delta, the lower one ignores it."""
    keep = (pmf >= 1e-25) & (pmf2 >= 1e-25)
    tail = float(pmf[~keep].sum()) * rounds
    out = []
    for up in (False, True):
        lo, mass = _compose(*_pld(pmf[keep], pmf2[keep], grid, up), rounds)
        target = delta - tail if up else delta
        assert target > 0
        loss = (np.arange(len(mass)) + lo) * grid

        def excess(eps: float, mass=mass, loss=loss) -> float:
            hit = loss > eps
            return float((mass[hit] * (1.0 - np.exp(eps - loss[hit]))).sum())

        out.append(_bisect(excess, target))
    return tuple(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--populations", default="943,1336,29858")
    ap.add_argument("--fractions", default="0.1,0.3")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--tolerance", type=float, default=0.05, help="secagg dropout tolerance f")
    ap.add_argument("--grid", type=float, default=1e-4, help="privacy-loss grid, nats")
    a = ap.parse_args()
    print(
        f"rounds {a.rounds}, delta {a.delta:g}, dropout tolerance {a.tolerance:g}; "
        "eps(sizes) as [rounded down, rounded up]"
    )
    print("| users | q | expected cohort | t (fixed) | abort | eps(aborts) | eps(sizes) |")
    print("|---|---|---|---|---|---|---|")
    for n in (int(x) for x in a.populations.split(",")):
        for q in (float(x) for x in a.fractions.split(",")):
            t = math.ceil((1 - a.tolerance) * math.floor(q * n))
            abort = float(binom.cdf(t - 1, n, q))
            flags, sizes = [], []
            # Neighbours: one user more (N + 1) and one fewer (N - 1); both directions.
            for other in (n + 1, n - 1):
                big, small = max(n, other), min(n, other)
                a_small = float(binom.cdf(t - 1, small, q))
                a_big = (1 - q) * a_small + q * float(binom.cdf(t - 2, small, q))
                flags += [
                    eps_of_flags(a_small, a_big, a.rounds, a.delta),
                    eps_of_flags(a_big, a_small, a.rounds, a.delta),
                ]
                ks = np.arange(big + 1)
                p_small = binom.pmf(ks, small, q)
                p_big = binom.pmf(ks, big, q)
                sizes += [
                    eps_of_sizes(p_small, p_big, a.rounds, a.delta, a.grid),
                    eps_of_sizes(p_big, p_small, a.rounds, a.delta, a.grid),
                ]
            lo = max(s[0] for s in sizes)
            hi = max(s[1] for s in sizes)
            print(
                f"| {n:,} | {q:g} | {q * n:.1f} | {t} | {abort:.3f} | {max(flags):.3f} "
                f"| {lo:.3f} - {hi:.3f} |"
            )


if __name__ == "__main__":
    main()
