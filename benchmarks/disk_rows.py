"""How much of FedRAP's private item views a checkpoint must store, round by round.

Trains FedRAP (no evaluation until the last round) and after the chosen rounds prints, as one
JSON line each, how many rows ``D_u[i]`` a checkpoint stores (``FedRAP.written_rows``: with
dense views those whose bits differ from the initial view, with sparse ones those a local step
wrote) and the size of the checkpoint it would write::

    python benchmarks/disk_rows.py --dataset ml-100k --data-dir ../shared/data --rounds 100
    python benchmarks/disk_rows.py --dataset ../shared/data/gowalla/checkins.csv \
        --client-fraction 0.1 --rounds 5 --at 1,2,3,4,5

Results: docs/benchmarks.md, "Disk".
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from securefed.models.fedrap import FedRAPConfig  # noqa: E402
from securefed.training import TrainConfig, load_split, train  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="ml-100k")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--at", default="1,2,3,5,10,20,50,100", help="Rounds to measure after.")
    ap.add_argument("--client-fraction", type=float, default=None)
    ap.add_argument("--views", choices=("auto", "dense", "sparse"), default="auto")
    ap.add_argument("--eval-users", type=int, default=None, help="Full ranking of a sample.")
    args = ap.parse_args()
    marks = {int(x) for x in args.at.split(",")}
    extra: dict = {} if args.client_fraction is None else {"client_fraction": args.client_fraction}
    if args.eval_users is not None:
        extra["eval_users"] = args.eval_users
    cfg = TrainConfig(
        model="fedrap",
        dataset=args.dataset,
        data_dir=args.data_dir,
        rounds=args.rounds,
        eval_every=args.rounds,
        checkpoint_every=args.rounds,
        params=FedRAPConfig(views=args.views),
        **extra,
    )
    split = load_split(cfg)
    cells = split.n_users * split.n_items

    def observe(view) -> None:
        r = view.round_index + 1
        if r not in marks:
            return
        model = view.model
        written = model.written_rows()
        state = model.checkpoint_state()
        buf = io.BytesIO()
        torch.save(state, buf)
        row = {
            "round": r,
            "views": model.views,
            "rows_written": written,
            "fraction": round(written / cells, 4),
            "sparse": "D_rows" in state,
            "model_state_bytes": buf.tell(),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
        print(json.dumps(row), flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, out=Path(tmp) / "run", split=split, observer=observe)


if __name__ == "__main__":
    main()
