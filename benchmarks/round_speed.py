"""Seconds per federated round and peak memory of FedRAP and FedRecGEL.

Each measurement runs in its own subprocess so that peak RSS belongs to one configuration.
Results are printed as JSON and, with ``--write``, written into ``docs/benchmarks.md``
between the ``round-speed`` markers.

    python benchmarks/round_speed.py --data-dir ../shared/data --rounds 100 --write
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _child(args: argparse.Namespace) -> dict:
    import torch

    from securefed.training import TrainConfig, load_split, train

    torch.set_num_threads(args.threads)
    kw = dict(model=args.model, rounds=args.rounds, seed=0, checkpoint_every=10**6)
    if args.dataset == "synthetic-ml1m":
        kw.update(dataset="synthetic", synthetic_users=6040, synthetic_items=3706)
    else:
        kw.update(dataset=args.dataset, data_dir=args.data_dir)
    cfg = TrainConfig(**kw, eval_every=1 if args.eval else 10**6)
    t0 = time.perf_counter()
    split = load_split(cfg)
    load_s = time.perf_counter() - t0
    out = Path(args.out) / f"{args.model}-{args.dataset}-{int(args.eval)}-{os.getpid()}"
    t0 = time.perf_counter()
    res = train(cfg, out=out, split=split)
    wall = time.perf_counter() - t0
    train_s = [m["train_seconds"] for m in res.metrics]
    eval_s = [m.get("eval_seconds", 0.0) for m in res.metrics]
    steady = train_s[1:] if len(train_s) > 1 else train_s  # round 1 includes compilation
    return {
        "model": args.model,
        "dataset": args.dataset,
        "users": split.n_users,
        "items": split.n_items,
        "rounds": args.rounds,
        "evaluation": bool(args.eval),
        "load_seconds": round(load_s, 3),
        "wall_seconds": round(wall, 2),
        "first_round_seconds": round(train_s[0], 3),
        "train_seconds_per_round": round(sum(steady) / len(steady), 4),
        "eval_seconds_per_round": round(sum(eval_s) / len(eval_s), 4) if args.eval else None,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "test_hr@10": res.summary.get("final_test_hr@10"),
        "threads": args.threads,
    }


def _run(cmd_args: list[str]) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", *cmd_args],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _table(rows: list[dict]) -> str:
    head = (
        "| model | dataset | rounds | evaluation | train s/round | eval s/round | first round s "
        "| whole run s | peak RSS MB |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['model']} | {r['dataset']} ({r['users']}x{r['items']}) | {r['rounds']} | "
        f"{'yes' if r['evaluation'] else 'no'} | {r['train_seconds_per_round']:.3f} | "
        f"{_num(r['eval_seconds_per_round'])} | "
        f"{r['first_round_seconds']:.2f} | {r['wall_seconds']:.1f} | {r['peak_rss_mb']:.0f} |\n"
        for r in rows
    )
    return head + body


def _write_docs(rows: list[dict], command: str) -> None:
    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start, end = "<!-- round-speed:start -->", "<!-- round-speed:end -->"
    block = (
        f"{start}\n## Seconds per round and peak memory\n\nMeasured with `{command}` "
        f"({time.strftime('%Y-%m-%d')}, 2 cores, torch CPU, each row its own process).\n\n"
        + _table(rows)
        + f"\n{end}"
    )
    if start in text:
        pre, rest = text.split(start, 1)
        text = pre + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="fedrap")
    ap.add_argument("--dataset", default="ml-100k")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--eval", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="/tmp/securefed-bench")
    ap.add_argument("--models", default="fedrap,fedrecgel")
    ap.add_argument(
        "--extra-fedrecgel-dataset",
        default="filmtrust",
        help="also time FedRecGEL here (the official code's 3.8 s/round was measured on FilmTrust)",
    )
    ap.add_argument(
        "--ml1m-memory", action="store_true", help="also FedRAP on a 6040x3706 synthetic set"
    )
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args)))
        return
    rows = []
    base = [
        "--data-dir",
        args.data_dir,
        "--rounds",
        str(args.rounds),
        "--threads",
        str(args.threads),
        "--out",
        args.out,
        "--dataset",
        args.dataset,
    ]
    for model in args.models.split(","):
        for ev in (0, 1):
            rows.append(_run([*base, "--model", model, "--eval", str(ev)]))
            print(json.dumps(rows[-1]), flush=True)
    if args.extra_fedrecgel_dataset:
        extra = [a if a != args.dataset else args.extra_fedrecgel_dataset for a in base]
        rows.append(_run([*extra, "--model", "fedrecgel", "--eval", "1"]))
        print(json.dumps(rows[-1]), flush=True)
    if args.ml1m_memory:
        rows.append(
            _run(
                [
                    "--model",
                    "fedrap",
                    "--dataset",
                    "synthetic-ml1m",
                    "--rounds",
                    "3",
                    "--eval",
                    "1",
                    "--threads",
                    str(args.threads),
                    "--out",
                    args.out,
                ]
            )
        )
        print(json.dumps(rows[-1]), flush=True)
    if args.write:
        _write_docs(rows, "python benchmarks/round_speed.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
