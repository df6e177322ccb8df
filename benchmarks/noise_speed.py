"""Speed of the secure (OS-randomness) DP samplers: an OS-keyed AES-CTR stream against one
``os.urandom`` call per draw, side by side in one process.

Times, for each uniform source, the samplers a distributed-DP secure round of FedRAP on
MovieLens 100K runs on every client (943 x 53,824 coordinates by default): the uniforms
themselves, the discrete Gaussian shares (by the block table, and by the rejection sampler that
replay runs use: ``discrete_gaussian_rejection``) and the conditional randomized rounding, plus
the hardened continuous Gaussian of central DP::

    python benchmarks/noise_speed.py --rows 943 --dim 53824 --repeats 2 --sigma 198073

The ``urandom`` rows swap :func:`protocols.dp.noise.os_cipher`'s keystream for ``os.urandom``
(what securefed did before), so both sources run the same sampler code. Each line is the best of
``--repeats`` wall-clock times; compare the ratios of one run, not absolute times across runs.
Results: docs/benchmarks.md, "Secure randomness".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from protocols.dp import mechanisms, noise  # noqa: E402


class _Urandom:
    """``os_cipher``'s interface with ``os.urandom`` bytes as the keystream."""

    def update(self, data: bytes) -> bytes:
        return os.urandom(len(data))

    def update_into(self, data: bytes, buf: bytearray) -> int:
        buf[: len(data)] = os.urandom(len(data))
        return len(data)


def _rejection_sampler(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` with the secure discrete Gaussian on the rejection sampler (what replay runs and
    sigmas above the block table use) instead of the block table, for the ratio of the two."""

    def run() -> object:
        table = noise.block_table
        noise.block_table = lambda sigma: None  # type: ignore[assignment]
        try:
            return fn()
        finally:
            noise.block_table = table  # type: ignore[assignment]

    return run


def best_of(repeats: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=943, help="Clients (rows of the update).")
    ap.add_argument("--dim", type=int, default=53_824, help="Coordinates per client.")
    ap.add_argument("--sigma", type=float, default=60.0, help="Discrete Gaussian share sigma.")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads.")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    n = args.rows * args.dim
    updates = torch.randn(args.rows, args.dim, generator=torch.Generator().manual_seed(0))
    updates /= torch.linalg.vector_norm(updates, dim=1, keepdim=True)
    scale = 2.0**10
    bound = mechanisms.rounded_l2_bound(scale, args.dim, float(torch.e) ** -0.5)
    work: dict[str, Callable[[], object]] = {
        "uniforms": lambda: [noise.os_uniform(noise.CHUNK) for _ in range(n // noise.CHUNK)],
        "discrete_gaussian": lambda: noise.discrete_gaussian(
            (args.rows, args.dim), args.sigma, generator=None, secure=True
        ),
        "discrete_gaussian_rejection": _rejection_sampler(
            lambda: noise.discrete_gaussian(
                (args.rows, args.dim), args.sigma, generator=None, secure=True
            )
        ),
        "randomized_rounding": lambda: mechanisms.conditional_randomized_round(
            updates, scale=scale, l2_bound=bound, generator=None, secure=True
        ),
        "gaussian": lambda: noise.gaussian_noise(n, 1.0, generator=None, secure=True),
    }
    cipher = noise.os_cipher
    load = os.getloadavg()[0]
    results: dict[str, dict[str, float]] = {}
    for source in ("aes-ctr", "urandom"):
        noise.os_cipher = cipher if source == "aes-ctr" else _Urandom  # type: ignore[assignment]
        try:
            results[source] = {name: best_of(args.repeats, fn) for name, fn in work.items()}
        finally:
            noise.os_cipher = cipher  # type: ignore[assignment]
    for name in work:
        a, u = results["aes-ctr"][name], results["urandom"][name]
        row = {"sampler": name, "elements": n, "aes_ctr_s": round(a, 3)}
        row |= {"urandom_s": round(u, 3), "speedup": round(u / a, 2)}
        print(json.dumps(row))
    after = os.getloadavg()[0]
    print(json.dumps({"threads": args.threads, "load_before": load, "load_after": after}))


if __name__ == "__main__":
    main()
