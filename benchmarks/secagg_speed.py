"""Speed of secure aggregation: one full simulated round against its cryptographic floor.

Usage::

    # the round `securefed train --secagg` runs on MovieLens-100K (n = 943, d = 53,824,
    # k and t chosen to tolerate 5 % dropout and 5 % colluders: k = 30, t = 17; no client
    # drops; input bound 1000 at a 16-bit scale: a 37-bit ring in 64-bit words)
    python benchmarks/secagg_speed.py --training --repeats 3 --json
    # a Gowalla cohort: 3,000 clients of FedRAP updates (40,981 items x 32), inputs streamed
    # a block of coordinates at a time (the [n, d] table would be 31 GB), 5 % dropouts
    python benchmarks/secagg_speed.py --clients 3000 --dim 1311392 --clip 1000 --stream --json
    # the agreement helper process on and off, alternated round by round in one process
    python benchmarks/secagg_speed.py --training --repeats 6 --agreement-helper alternate --json
    # the k = 10 headline (no dropout tolerated: t = 6, a 27-bit ring in 32-bit words)
    python benchmarks/secagg_speed.py --neighbours 10 --dropout 0 --dropout-tolerance 0 \
        --corrupt-fraction 0 --repeats 3 --json

(``--neighbours 10`` at 5 % dropout is refused since the Shamir threshold must be a majority of
each neighbourhood, docs/secagg.md; 22 is the smallest k that tolerates it.)

Prints one JSON object (with ``--json``) or a short text report: the whole protocol round
(every client's keys, agreements, shares, masks and the server's unmasking; ``--engine`` picks
the batched engine of ``secure_sum`` or the per-client objects), the plain sum of the same
inputs, raw AES-128-CTR throughput and mask-expansion throughput (expand + add) measured in the
same process, whether the unmasked sum equals the plain sum of the survivors, and the load
average before and after (the development machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey  # noqa: E402
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes  # noqa: E402

from protocols.secagg import (  # noqa: E402
    DropoutSchedule,
    FixedPointCodec,
    RoundAborted,
    SecAggConfig,
    agreement,  # noqa: E402
    secure_sum,
    shamir,  # noqa: E402
)
from protocols.secagg.primitives import MaskExpander  # noqa: E402
from protocols.secagg.wire import ring_dtype  # noqa: E402
from securefed.privacy import DEFAULT_SECAGG_BOUND  # noqa: E402


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def aes_and_mask_gbps(dim: int, bits: int, reps: int = 200) -> tuple[float, float]:
    """Raw AES-128-CTR ``update_into`` vs MaskExpander.add on the same keystream length.

    Both in GB of keystream per second; the mask uses the ring's word size (4 bytes per
    coordinate for rings up to 2**32), so a mask of ``dim`` coordinates is ``dim * 4`` bytes.
    """
    word = ring_dtype(bits)
    nbytes = dim * word.itemsize
    zeros = bytes(nbytes)
    buf = bytearray(nbytes + 16)
    keys = [os.urandom(16) for _ in range(reps)]

    def raw() -> None:
        for k in keys:
            Cipher(algorithms.AES(k), modes.CTR(bytes(16))).encryptor().update_into(zeros, buf)

    ex = MaskExpander(dim, word)
    acc = np.zeros(dim, word)

    def mask() -> None:
        for k in keys:
            ex.add(k, acc)

    # Interleaved, best of 7 each, so load from other processes hits both alike.
    best_raw = best_mask = float("inf")
    for _ in range(7):
        best_raw = min(best_raw, _best(raw, 1))
        best_mask = min(best_mask, _best(mask, 1))
    total = nbytes * reps
    return total / best_raw / 1e9, total / best_mask / 1e9


def primitive_costs(threshold: int, k: int) -> dict[str, float]:
    a, b = X25519PrivateKey.generate(), X25519PrivateKey.generate().public_key()
    n = 500
    x25519 = _best(lambda: [a.exchange(b) for _ in range(n)], 3) / n
    secret = os.urandom(32)
    xs = list(range(1, k + 1))
    split = _best(lambda: [shamir.split(secret, xs, threshold) for _ in range(50)], 3) / 50
    ys = shamir.split(secret, xs, threshold)
    comb = (
        _best(lambda: [shamir.combine(xs[:threshold], ys[:threshold]) for _ in range(50)], 3) / 50
    )
    return {
        "x25519_us": x25519 * 1e6,
        "shamir_split_us": split * 1e6,
        "shamir_combine_us": comb * 1e6,
    }


class HashedInputs:
    """Ring inputs of ``n`` clients in ``[n, dim]`` blocks, never held whole (``--stream``).

    Coordinate ``(u, j)`` is a SplitMix64 hash of ``u * dim + j`` and the seed, cut to a
    signed integer ``|v| <= codec.per_client_bound`` and put in the ring: the same value
    whatever the block boundaries, computed by numpy in the calling thread.
    """

    def __init__(self, n: int, dim: int, codec: FixedPointCodec, seed: int) -> None:
        self.shape = (n, dim)
        self.align = 1  # every coordinate is its own hash: any block boundaries
        self._seed = np.uint64(0x9E3779B97F4A7C15 * (seed + 1) % 2**64)
        bits = codec.per_client_bound.bit_length()  # 2**(bits - 1) <= per-client bound
        self._low = np.uint64((1 << bits) - 1)
        self._half = np.uint64(1 << (bits - 1))
        self._ring = codec.mask

    def block(self, lo: int, hi: int) -> np.ndarray:
        n, dim = self.shape
        z = np.arange(n, dtype=np.uint64)[:, None] * np.uint64(dim)
        z = z + np.arange(lo, hi, dtype=np.uint64)[None, :]
        with np.errstate(over="ignore"):
            z += self._seed
            z ^= z >> np.uint64(30)
            z *= np.uint64(0xBF58476D1CE4E5B9)
            z ^= z >> np.uint64(27)
            z *= np.uint64(0x94D049BB133111EB)
            z ^= z >> np.uint64(31)
            z &= self._low
            z -= self._half  # two's complement in uint64
        z &= self._ring
        return z

    def plain_sum(self, rows: np.ndarray | None = None, width: int = 1 << 13) -> np.ndarray:
        """The ring sum of the inputs of ``rows`` (all clients by default), block by block."""
        out = np.empty(self.shape[1], dtype=np.uint64)
        for lo in range(0, self.shape[1], width):
            x = self.block(lo, min(self.shape[1], lo + width))
            out[lo : lo + x.shape[1]] = (x if rows is None else x[rows]).sum(
                axis=0, dtype=np.uint64
            )
        return out & self._ring


def run(args: argparse.Namespace) -> dict:
    load_before = os.getloadavg()
    rng = np.random.default_rng(args.seed)
    codec = FixedPointCodec.for_sum(n_clients=args.clients, clip=args.clip, scale_bits=16)
    config = SecAggConfig(
        n_clients=args.clients,
        neighbours=args.neighbours,
        dropout_tolerance=max(args.dropout, args.dropout_tolerance),
        corrupt_fraction=args.corrupt_fraction,
        modulus_bits=codec.modulus_bits,
        threshold=args.threshold,
        mode=args.mode,
    )
    source = HashedInputs(args.clients, args.dim, codec, args.seed) if args.stream else None
    ring = (
        None
        if args.stream
        else codec.encode(
            rng.uniform(-args.clip, args.clip, size=(args.clients, args.dim)), rng=rng
        )
    )
    sched = DropoutSchedule.random(args.clients, rate=args.dropout, rng=rng)
    walls, cpus, helper_on = [], [], []
    result, aborted = None, False
    min_pairs = agreement.MIN_PAIRS
    for i in range(args.repeats):
        on = args.agreement_helper == "on" or (args.agreement_helper == "alternate" and i % 2 == 0)
        agreement.MIN_PAIRS = min_pairs if on else sys.maxsize
        helper_on.append(on)
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            result = secure_sum(
                ring if source is None else source,
                config=config,
                round_index=1,
                public_seed=os.urandom(32),
                dropouts=sched,
                engine=args.engine,
                workers=args.workers,
            )
        except RoundAborted:
            result, aborted = None, True
            break
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    agreement.MIN_PAIRS = min_pairs
    seconds = min(walls) if walls else float("nan")
    if source is None:
        assert ring is not None
        plain_s = _best(lambda: ring.sum(axis=0, dtype=np.uint64) & codec.mask, 3)
    else:  # the inputs are generated as they are summed, as in the secure round
        plain_s = _best(source.plain_sum, 1)
        input_s = _best(
            lambda: all(  # each block dropped as soon as it is made
                source.block(lo, min(args.dim, lo + 8192)).size for lo in range(0, args.dim, 8192)
            ),
            1,
        )
    aes_gbps, mask_gbps = aes_and_mask_gbps(args.dim, codec.modulus_bits)
    out = {
        "clients": args.clients,
        "dim": args.dim,
        "neighbours": config.k,
        "threshold": config.t,
        "modulus_bits": codec.modulus_bits,
        "dropout": args.dropout,
        "engine": args.engine,
        "mode": args.mode,
        "workers": args.workers,
        "seconds_per_round": seconds,
        "seconds_all_repeats": walls,
        "cpu_seconds_all_repeats": cpus,
        "agreement_helper": args.agreement_helper,
        "agreement_helper_all_repeats": helper_on[: len(walls)],
        "plain_sum_seconds": plain_s,
        "streamed": bool(args.stream),
        "aes_ctr_gbps": aes_gbps,
        "mask_gbps": mask_gbps,
        "aborted": aborted,
        "exact": False,
    }
    if source is not None:
        out["input_seconds"] = input_s  # generating the inputs alone, within plain_sum_seconds
    if result is not None:
        plain = (
            ring[result.survivors].sum(axis=0, dtype=np.uint64) & codec.mask
            if ring is not None
            else source.plain_sum(result.survivors)
        )
        out.update(
            exact=bool(np.array_equal(plain, result.sum)),
            survivors=len(result.survivors),
            dropped=len(result.dropped),
            excluded=len(result.excluded),
            seconds_per_stage=result.seconds_per_stage,
            bytes_per_stage=result.bytes_per_stage,
            client_ms=1e3 * seconds / args.clients,
        )
    out.update(primitive_costs(config.t, config.k))
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["load_average_before_after"] = [load_before[0], os.getloadavg()[0]]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=943)
    p.add_argument("--dim", type=int, default=53_824)
    p.add_argument("--neighbours", type=int, default=None, help="k; default: chosen from n")
    p.add_argument("--dropout", type=float, default=0.05, help="simulated dropout rate")
    p.add_argument("--dropout-tolerance", type=float, default=0.05)
    p.add_argument("--corrupt-fraction", type=float, default=0.05)
    p.add_argument("--clip", type=float, default=1.0, help="input bound (sets the ring size)")
    p.add_argument("--threshold", type=int, default=None, help="t; default: chosen")
    p.add_argument(
        "--mode",
        choices=("semi-honest", "malicious"),
        default="semi-honest",
        help="malicious: signed advertisements and the consistency round (objects engine only)",
    )
    p.add_argument("--engine", choices=("batched", "objects"), default="batched")
    p.add_argument("--workers", type=int, default=None, help="mask threads; default: cores")
    p.add_argument("--repeats", type=int, default=1, help="rounds; the fastest is reported")
    p.add_argument(
        "--training",
        action="store_true",
        help="the round of `securefed train --secagg` on ML-100K: n 943, d 53,824, k and t "
        "tolerating 5 %% dropout and 5 %% colluders, no dropouts, input bound 1000 (37-bit ring)",
    )
    p.add_argument(
        "--stream",
        action="store_true",
        help="produce the inputs a block of coordinates at a time (RingBlocks) instead of "
        "holding the [clients, dim] table; batched engine only",
    )
    p.add_argument(
        "--agreement-helper",
        choices=("on", "off", "alternate"),
        default="on",
        help="the batched engine's X25519 helper process (protocols/secagg/agreement.py): on "
        "(the default everywhere), off, or alternate round by round from on (a ratio in one run)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.training:
        args.clients, args.dim, args.neighbours = 943, 53_824, None
        args.dropout = 0.0  # training simulates no dropouts unless asked
        args.dropout_tolerance = args.corrupt_fraction = 0.05
        args.clip = DEFAULT_SECAGG_BOUND
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    out = run(args)
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:>20}: {value}")
    return 0 if (out["exact"] or out["aborted"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
