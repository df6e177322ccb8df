"""A cost model of one securefed round to internet scale (issue 17): written into docs/scale.md.

For each model (fedals, FedRAP, FedRecGEL) at its defaults, a catalogue, a population and a
cohort per round, it computes from the code's own formulas (the update layouts of the model
registry, the SecAgg+ degree and threshold that :class:`protocols.secagg.SecAggConfig`
chooses, the fixed-point ring that :class:`protocols.secagg.FixedPointCodec` sizes for the
cohort) what one client computes, stores and sends, and what the server does, per round:

* **client**: the upload's coordinates ``d`` and its bytes on the wire (masked input of ``d``
  ring elements packed to the ring's bits, sealed and revealed Shamir shares, keys); the
  download (the shared parameters in float32, the neighbours' keys and share boxes); the
  secure-aggregation work (``2k`` X25519 agreements, ``k + 1`` AES-CTR mask expansions of
  ``d`` words) and the local training (from the per-sample rates of :mod:`securefed.costs`),
  in seconds of one core of this machine; the private state a client keeps on its device.
* **server**: summing the masked inputs, re-expanding every survivor's self mask (AES-CTR),
  Lagrange reconstruction of ``t``-of-``k`` shares, re-expanding the dropped clients' pair
  masks, in core-seconds of this machine, and the memory of one running sum.

The rates (X25519 agreement, AES-CTR throughput, Shamir combine) are measured in the same
process unless given. ``--check`` runs the simulated rounds that calibrate the model
(:func:`protocols.secagg.secure_sum`, the batched engine, which does each pair's work once)
and prints the model's prediction next to them.

    python benchmarks/scale_model.py --write            # tables into docs/scale.md
    python benchmarks/scale_model.py --check --write    # and the simulated check points
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey  # noqa: E402
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes  # noqa: E402

from protocols.secagg import FixedPointCodec, SecAggConfig, secure_sum, shamir  # noqa: E402
from protocols.secagg.wire import packed_bytes  # noqa: E402
from securefed.config import TrainConfig  # noqa: E402
from securefed.costs import RunShape, layout_size  # noqa: E402
from securefed.models.fedals import ALS_SECONDS as _ALS_S  # noqa: E402
from securefed.models.fedrap import SAMPLE_SECONDS as _FEDRAP_S  # noqa: E402
from securefed.models.fedrecgel import MLP_SECONDS as _MLP_S  # noqa: E402
from securefed.privacy import DEFAULT_SECAGG_BOUND  # noqa: E402

DOC = ROOT / "docs" / "scale.md"
START, END = "<!-- scale-model:start -->", "<!-- scale-model:end -->"
#: Bytes on the wire per message beyond its payload (docs/secagg.md, "Per-client cost").
HEADER = 44
#: Sealed share box per neighbour and revealed share per neighbour (docs/secagg.md).
BOX, REVEALED = 94, 38


@dataclass(frozen=True)
class Rates:
    x25519_s: float  # one agreement
    aes_bytes_s: float  # AES-CTR keystream bytes per second, one core
    combine_s: float  # one t-of-k Shamir reconstruction (at the calibration t)
    combine_t: int
    sum_bytes_s: float  # adding masked inputs into a running sum, bytes per second


def measure_rates() -> Rates:
    a, b = X25519PrivateKey.generate(), X25519PrivateKey.generate().public_key()
    n = 400
    x = min(_timed(lambda: [a.exchange(b) for _ in range(n)]) for _ in range(3)) / n
    nbytes = 1 << 22
    zeros, buf = bytes(nbytes), bytearray(nbytes + 16)
    keys = [os.urandom(16) for _ in range(24)]

    def aes() -> None:
        for k in keys:
            Cipher(algorithms.AES(k), modes.CTR(bytes(16))).encryptor().update_into(zeros, buf)

    aes_rate = nbytes * len(keys) / min(_timed(aes) for _ in range(5))
    t, k = 17, 30
    xs = list(range(1, k + 1))
    ys = shamir.split(os.urandom(32), xs, t)
    comb = min(
        _timed(lambda: [shamir.combine(xs[:t], ys[:t]) for _ in range(40)]) for _ in range(3)
    )
    # Out of cache, as a long upload is: 64 MB vectors.
    acc = np.zeros(1 << 23, np.uint64)
    row = np.ones(1 << 23, np.uint64)
    add = min(_timed(lambda: [np.add(acc, row, out=acc) for _ in range(5)]) for _ in range(3))
    return Rates(x, aes_rate, comb / 40, t, 5 * acc.nbytes / add)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@dataclass(frozen=True)
class Scenario:
    label: str
    users: int
    items: int
    per_user: float  # training interactions per user (mean)
    cohort: int  # clients per round


def round_costs(model: str, sc: Scenario, rates: Rates) -> dict:
    cfg = TrainConfig(model=model)
    shape = RunShape(
        users=sc.users,
        items=sc.items,
        train_interactions=int(sc.users * sc.per_user),
        synthetic=False,
    )
    d = layout_size(cfg, shape)
    m = sc.cohort
    sa = SecAggConfig(n_clients=max(m, 2))
    k, t = sa.k, sa.t
    codec = FixedPointCodec.for_sum(n_clients=m, clip=DEFAULT_SECAGG_BOUND, scale_bits=16)
    w = 4 if codec.modulus_bits <= 32 else 8
    params = cfg.params
    # What the client downloads: the shared parameters it trains against (float32).
    if model == "fedals":
        from securefed.models.fedals import resolve_dim

        dim = resolve_dim(params, sc.items).factor_dim
        shared = sc.items * dim + sc.items + dim * dim
        local = _ALS_S * (sc.per_user * dim * dim + dim**3)
        private = dim * 4  # its own factor, recomputed every round
    elif model == "fedrap":
        dim = params.dim
        shared = sc.items * dim
        samples = sc.per_user * (1 + params.num_negatives)
        local = _FEDRAP_S * samples * params.local_epochs * dim
        private = sc.items * dim * 4  # its private item view D_u
    else:  # fedrecgel
        widths = tuple(params.layers)
        macs = sum(widths[i] * widths[i + 1] for i in range(len(widths) - 1)) + params.gmf_dim
        shared = d
        samples = sc.per_user * (1 + params.num_negatives)
        local = _MLP_S * samples * macs * (3 if params.sam else 1) * params.local_steps
        private = (params.gmf_dim + params.mlp_dim) * 4 * 3  # user embeddings and Adam moments
    # The masked input is packed to the ring's bits on the wire (protocols.secagg.wire).
    up = 64 + 4 + BOX * k + 5 + packed_bytes(d, codec.modulus_bits) + 4 + REVEALED * k + 4 * HEADER
    down = shared * 4 + k * 64 + k * BOX + 4 * HEADER
    # Agreements, mask expansions, and adding each of the k + 1 masks into the masked input.
    client_secagg = (
        2 * k * rates.x25519_s
        + (k + 1) * d * w / rates.aes_bytes_s
        + (k + 1) * d * w / rates.sum_bytes_s
    )
    dropped = math.ceil(0.05 * m)
    server = {
        "sum": m * d * w / rates.sum_bytes_s,
        "self_masks": m * d * w / rates.aes_bytes_s,
        "reconstruct": (m + dropped) * rates.combine_s * (t / rates.combine_t) ** 2,
        "dropped_pairs": dropped * k * (d * w / rates.aes_bytes_s + rates.x25519_s),
    }
    return {
        "model": model,
        "scenario": sc,
        "d": d,
        "k": k,
        "t": t,
        "bits": codec.modulus_bits,
        "word": w,
        "up_bytes": up,
        "down_bytes": down,
        "client_secagg_s": client_secagg,
        "client_local_s": local,
        "client_private_bytes": private,
        "server": server,
        "server_s": sum(server.values()),
        "server_memory_bytes": 2 * d * w,  # the running sum and the self-mask sum
    }


SCENARIOS = (
    Scenario("Gowalla, every user (simulated here)", 29_858, 40_981, 30.9, 29_858),
    Scenario("Gowalla, 10 % cohorts", 29_858, 40_981, 30.9, 2_986),
    Scenario("1M users, 40,981 items, 1 % cohorts", 1_000_000, 40_981, 30.9, 10_000),
    Scenario("10M users, 40,981 items, 1 % cohorts", 10_000_000, 40_981, 30.9, 100_000),
    Scenario("10M users, 1M items, 1 % cohorts", 10_000_000, 1_000_000, 30.9, 100_000),
)


def _b(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _s(x: float) -> str:
    if x >= 3600:
        return f"{x / 3600:.1f} h"
    if x >= 60:
        return f"{x / 60:.1f} min"
    if x >= 1:
        return f"{x:.1f} s"
    return f"{x * 1e3:.1f} ms"


def check_points() -> tuple[Rates, list[tuple[str, float, float, float]]]:
    """Simulated secure rounds (batched engine, no dropout) against the model's prediction of
    the same round run in one process: every client's work once per pair (the engine's
    saving), i.e. ``n (k/2 + 1)`` expansions, ``n k`` agreements and ``n (k + 2)`` vector
    additions (each pair mask into both of its inputs, the self masks, the server's sum).
    The prediction uses rates measured just before, on the machine as loaded then."""
    rates = measure_rates()
    out = []
    for n, d in ((943, 53_824), (2_986, 53_824), (10_000, 10_000)):
        codec = FixedPointCodec.for_sum(n_clients=n, clip=DEFAULT_SECAGG_BOUND, scale_bits=16)
        cfg = SecAggConfig(n_clients=n, modulus_bits=codec.modulus_bits)
        rng = np.random.default_rng(0)
        ring = codec.encode(rng.uniform(-1, 1, size=(n, d)), rng=rng)
        t0 = time.perf_counter()
        secure_sum(ring, config=cfg, round_index=1, public_seed=os.urandom(32), workers=1)
        wall = time.perf_counter() - t0
        w = ring.dtype.itemsize
        k = cfg.k
        predicted = (
            n * (k / 2 + 1) * d * w / rates.aes_bytes_s  # each pair's mask once, self masks
            + n * k * rates.x25519_s  # two agreements per pair
            + n * (k + 2) * d * w / rates.sum_bytes_s  # masks into both inputs, the sum
            + n * rates.combine_s
        )
        out.append(
            (f"n = {n:,}, d = {d:,}, k = {k}, t = {cfg.t}", wall, predicted, os.getloadavg()[0])
        )
        del ring
    return rates, out


def render(
    rates: Rates,
    checked: tuple[Rates, list[tuple[str, float, float, float]]] | None,
    flags: str = "",
) -> str:
    checks = checked[1] if checked else None
    lines = [
        f"Written by `python benchmarks/scale_model.py{' --check' if checks else ''}"
        f"{flags} --write` ({date.today().isoformat()}; rates on one core of this machine, "
        f"given by the flags or measured in that process at load average "
        f"{os.getloadavg()[0]:.1f}: X25519 agreement "
        f"{rates.x25519_s * 1e6:.1f} us, AES-128-CTR {rates.aes_bytes_s / 1e9:.2f} GB/s, "
        f"Shamir {rates.combine_t}-of-k reconstruction {rates.combine_s * 1e6:.0f} us, "
        f"summing ring words {rates.sum_bytes_s / 1e9:.2f} GB/s). Each model at its defaults "
        "(fedals d 64 on these catalogues of 40,981 items and more (32 below 10,000), "
        "FedRAP dim 32, FedRecGEL GMF 32 / MLP 128 with tower (256, 128, 64, 32)); "
        "secure aggregation at 5 % dropout and 5 % colluding clients (2^-40 secrecy, 2^-20 "
        "correctness), the ring sized for the cohort at the default input bound. Client "
        "seconds are one core of this machine, not a phone; client training is the batched "
        "simulation's rate per client (a lower bound for a device).",
        "",
        "| scenario | model | upload coords d | k / t | ring | up / client | down / client "
        "| client secagg | client training | client keeps | server core-s / round "
        "(sum, self masks, reconstruct, dropped) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for sc in SCENARIOS:
        for model in ("fedals", "fedrap", "fedrecgel"):
            r = round_costs(model, sc, rates)
            s = r["server"]
            parts = ", ".join(
                _s(s[key]) for key in ("sum", "self_masks", "reconstruct", "dropped_pairs")
            )
            lines.append(
                f"| {sc.label} ({sc.cohort:,} per round) | {model} | {r['d']:,} "
                f"| {r['k']} / {r['t']} "
                f"| {r['bits']}-bit in {8 * r['word']}-bit words | {_b(r['up_bytes'])} "
                f"| {_b(r['down_bytes'])} | {_s(r['client_secagg_s'])} | {_s(r['client_local_s'])} "
                f"| {_b(r['client_private_bytes'])} | {_s(r['server_s'])} ({parts}) |"
            )
    if checked and checks:
        cr = checked[0]
        lines += [
            "",
            "Checked by simulation (`protocols.secagg.secure_sum`, batched engine, one mask "
            "thread, no dropout; the prediction counts each pair's work once, as the engine "
            "does, at rates measured just before the simulated rounds: X25519 "
            f"{cr.x25519_s * 1e6:.1f} us, AES-CTR {cr.aes_bytes_s / 1e9:.2f} "
            f"GB/s, summing {cr.sum_bytes_s / 1e9:.2f} GB/s):",
            "",
            "| simulated round | measured s | model s | load average |",
            "|---|---|---|---|",
        ]
        for label, wall, pred, load in checks:
            lines.append(f"| {label} | {wall:.2f} | {pred:.2f} | {load:.1f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--check", action="store_true", help="run the simulated check points")
    p.add_argument("--write", action="store_true", help="write the table into docs/scale.md")
    p.add_argument("--x25519-us", type=float, help="use this agreement time, not a measured one")
    p.add_argument("--aes-gbps", type=float, help="use this AES-CTR rate, not a measured one")
    args = p.parse_args()
    rates = measure_rates()
    if args.x25519_us is not None or args.aes_gbps is not None:
        rates = Rates(
            x25519_s=rates.x25519_s if args.x25519_us is None else args.x25519_us * 1e-6,
            aes_bytes_s=rates.aes_bytes_s if args.aes_gbps is None else args.aes_gbps * 1e9,
            combine_s=rates.combine_s,
            combine_t=rates.combine_t,
            sum_bytes_s=rates.sum_bytes_s,
        )
    checked = check_points() if args.check else None
    flags = "".join(
        f" --{name.replace('_', '-')} {value:g}"
        for name, value in (("x25519_us", args.x25519_us), ("aes_gbps", args.aes_gbps))
        if value is not None
    )
    block = render(rates, checked, flags)
    print(block)
    if args.write:
        text = DOC.read_text()
        if START not in text or END not in text:
            raise SystemExit(f"{DOC} lacks the {START} / {END} markers")
        new = re.sub(
            re.escape(START) + ".*?" + re.escape(END),
            lambda _m: f"{START}\n{block}\n{END}",
            text,
            flags=re.S,
        )
        DOC.write_text(new)
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
