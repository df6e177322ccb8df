"""How far one user moves the other clients' clipped updates through a shared seeded stream.

Before 2026-12-06 a round's local training (FedRAP's and FedRecGEL's negatives, shuffles,
batches) drew every participant's randomness from one stream derived from the recorded run
seed, in user order. For whoever knows the seed, removing a user shifts the draws of every
user after it, so the round's sum of clipped updates moves by more than the clip the noise
is calibrated for. This script measures that on the seeded stream (what a DP run used then
and a ``--replay-from-seed`` run still uses; a DP run now seeds the stream from the OS:
docs/privacy.md, "Local training randomness"):

    python benchmarks/training_stream_shift.py --models fedrap,fedrecgel --cohort 100 \
        --remove 0,50,99

For each removed user: how many other clients' clipped updates changed, and the L2 distance
between the two sums of clipped updates, in clips (1.0 is what the accounting assumes).
"""

from __future__ import annotations

import argparse

import torch

from protocols.dp import clip_scales
from protocols.seeding import torch_generator
from securefed.config import PrivacyConfig, TrainConfig
from securefed.training import build_model, load_split


def clipped(cfg: TrainConfig, split, cohort: torch.Tensor, clip: float):
    model = build_model(cfg, split)  # the same seeded initial model every time
    updates, _ = model.client_round(cohort, 0, torch_generator(cfg.seed, "train", 0))
    x = updates.dense()
    return updates.clients.tolist(), x * clip_scales(updates.norms(), clip).unsqueeze(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="fedrap,fedrecgel")
    ap.add_argument("--users", type=int, default=300)
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--cohort", type=int, default=100)
    ap.add_argument("--remove", default="0,50,99")
    args = ap.parse_args()
    print("| model | clip | removed user | other updates changed | sum moved (clips) |")
    print("|---|---|---|---|---|")
    for model in args.models.split(","):
        cfg = TrainConfig(
            model=model,
            synthetic_users=args.users,
            synthetic_items=args.items,
            privacy=PrivacyConfig(epsilon=2.0, replay=True),
        )
        clip = float(cfg.spec.default_clip(cfg.params))
        split = load_split(cfg)
        cohort = torch.arange(args.cohort)
        ids, full = clipped(cfg, split, cohort, clip)
        for u in (int(v) for v in args.remove.split(",")):
            ids2, less = clipped(cfg, split, cohort[cohort != u], clip)
            row = {c: i for i, c in enumerate(ids2)}
            others = [i for i, c in enumerate(ids) if c != u]
            moved = torch.stack([full[i] - less[row[ids[i]]] for i in others]).norm(dim=1)
            changed = int((moved > 1e-6).sum())
            shift = float((full.sum(0) - less.sum(0)).norm()) / clip
            print(f"| {model} | {clip:g} | {u} | {changed} of {len(others)} | {shift:.2f} |")


if __name__ == "__main__":
    main()
