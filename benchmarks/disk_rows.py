"""How much of FedRAP's private item views a checkpoint must store, round by round.

Trains FedRAP (no evaluation until the last round) and after the chosen rounds prints, as one
JSON line each, how many rows ``D_u[i]`` differ bit for bit from the initial view (what
``FedRAP.checkpoint_state`` stores) and the size of the checkpoint it would write::

    python benchmarks/disk_rows.py --dataset ml-100k --data-dir ../shared/data --rounds 100

Results: docs/benchmarks.md, "Disk".
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from securefed.training import TrainConfig, build_model, load_split, train  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="ml-100k")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--at", default="1,2,3,5,10,20,50,100", help="Rounds to measure after.")
    args = ap.parse_args()
    marks = {int(x) for x in args.at.split(",")}
    cfg = TrainConfig(
        model="fedrap",
        dataset=args.dataset,
        data_dir=args.data_dir,
        rounds=args.rounds,
        eval_every=args.rounds,
        checkpoint_every=args.rounds,
    )
    split = load_split(cfg)
    base = build_model(cfg, split).D[0].view(torch.int32).clone()

    def observe(view) -> None:
        r = view.round_index + 1
        if r not in marks:
            return
        model = view.model
        differ = (model.D.view(torch.int32) != base).any(dim=2)
        state = model.checkpoint_state()
        buf = io.BytesIO()
        torch.save(state, buf)
        row = {
            "round": r,
            "rows_differ": int(differ.sum()),
            "fraction": round(float(differ.float().mean()), 4),
            "sparse": "D_rows" in state,
            "model_state_bytes": buf.tell(),
        }
        print(json.dumps(row), flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, out=Path(tmp) / "run", split=split, observer=observe)


if __name__ == "__main__":
    main()
