"""Seconds per federated round and peak memory of FedRAP and FedRecGEL (and fedals on Gowalla).

Each measurement runs in its own subprocess so that peak RSS belongs to one configuration.
Results are printed as JSON and, with ``--write``, written into ``docs/benchmarks.md``
between the ``round-speed`` markers.

    python benchmarks/round_speed.py --data-dir ../shared/data --rounds 100 --write
    python benchmarks/round_speed.py --data-dir ../shared/data --rounds 100 --ml1m-memory \
        --ml1m-views dense,paged --write       # + FedRAP at MovieLens-1M size, both storages

``--gowalla FILE`` times FedRAP, FedRecGEL and fedals on the Gowalla check-ins (5 rounds at
client fraction 0.1, every user evaluated every round) into their own table, between the
``round-speed-gowalla`` markers (``--models '' --extra-fedrecgel-dataset ''`` runs only those).

``--baseline-fedrecgel FILE`` also times a saved copy of an earlier
``securefed/models/fedrecgel.py`` against the current one on FilmTrust, interleaved round by
round in one process (same cohorts, same plans), so that the ratio holds on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
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
    if args.baseline_fedrecgel:
        return _compare(args)
    kw = dict(model=args.model, rounds=args.rounds, seed=0, checkpoint_every=10**6)
    if args.client_fraction is not None:
        kw["client_fraction"] = args.client_fraction
    if args.views is not None:
        from securefed.models.fedrap import FedRAPConfig

        kw["params"] = FedRAPConfig(views=args.views)
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
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    res = train(cfg, out=out, split=split)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
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
        "user_cpu_seconds": round(r1.ru_utime - r0.ru_utime, 2),
        "sys_cpu_seconds": round(r1.ru_stime - r0.ru_stime, 2),
        "client_fraction": args.client_fraction,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "test_hr@10": res.summary.get("final_test_hr@10"),
        "threads": args.threads,
        "views": getattr(res.model, "views", None),
    }


def _compare(args: argparse.Namespace) -> dict:
    """Seconds per FedRecGEL round (local training + aggregation + server step) of a baseline
    module file and of the current module, interleaved on the same rounds."""
    import importlib.util
    import statistics

    import securefed.models.fedrecgel as current
    from protocols.seeding import torch_generator
    from securefed.federation.aggregation import aggregate
    from securefed.federation.cohort import sample_cohort
    from securefed.training import TrainConfig, load_split

    spec = importlib.util.spec_from_file_location("fedrecgel_baseline", args.baseline_fedrecgel)
    assert spec is not None and spec.loader is not None
    baseline = importlib.util.module_from_spec(spec)
    sys.modules["fedrecgel_baseline"] = baseline
    spec.loader.exec_module(baseline)
    cfg = TrainConfig(
        model="fedrecgel", dataset=args.dataset, data_dir=args.data_dir, seed=0, rounds=1
    )
    split = load_split(cfg)
    cohort = cfg.cohort(split.n_users)
    mods = {"baseline": baseline, "current": current}
    models = {
        k: mod.FedRecGEL(split, mod.FedRecGELConfig(), generator=torch_generator(0, "init"))
        for k, mod in mods.items()
    }
    wall: dict[str, list[float]] = {k: [] for k in mods}
    cpu: dict[str, list[float]] = {k: [] for k in mods}
    for r in range(args.rounds):
        users = sample_cohort(cohort, split.n_users, torch_generator(0, "cohort", r))
        for k in list(mods) if r % 2 == 0 else list(mods)[::-1]:
            model = models[k]
            plan = model.plan_round(users, torch_generator(0, "train", r))
            t0, c0 = time.perf_counter(), time.process_time()
            updates, _ = model.train_plan(plan, r)
            model.apply_aggregate(aggregate(updates), r)
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
            del updates
    out: dict = {"dataset": args.dataset, "rounds": args.rounds, "threads": args.threads}
    for k in mods:
        out[f"{k}_wall_median"] = round(statistics.median(wall[k][1:]), 4)
        out[f"{k}_cpu_median"] = round(statistics.median(cpu[k][1:]), 4)
    out["speedup_wall"] = round(out["baseline_wall_median"] / out["current_wall_median"], 2)
    out["speedup_cpu"] = round(out["baseline_cpu_median"] / out["current_cpu_median"], 2)
    out["load_average"] = round(os.getloadavg()[0], 1)
    return out


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
        "| model | dataset | clients/round | rounds | evaluation | train s/round | eval s/round "
        "| first round s | whole run s | user / sys CPU s | peak RSS MB |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['model']} | {_name(r['dataset'])} ({r['users']}x{r['items']}){_views(r)} | "
        f"{_cohort(r)} | {r['rounds']} | "
        f"{'yes' if r['evaluation'] else 'no'} | {r['train_seconds_per_round']:.3f} | "
        f"{_num(r['eval_seconds_per_round'])} | "
        f"{r['first_round_seconds']:.2f} | {r['wall_seconds']:.1f} | "
        f"{r['user_cpu_seconds']:.1f} / {r['sys_cpu_seconds']:.1f} | {r['peak_rss_mb']:.0f} |\n"
        for r in rows
    )
    return head + body


def _name(dataset: str) -> str:
    """A dataset's name for the table: a file as its folder and name."""
    return "/".join(Path(dataset).parts[-2:]) if dataset.endswith(".csv") else dataset


def _views(row: dict) -> str:
    """FedRAP's storage of the private views, where it is not dense."""
    return f", {row['views']} views" if row.get("views") not in (None, "dense") else ""


def _cohort(row: dict) -> str:
    if row.get("client_fraction") is not None:
        return f"all ({row['client_fraction']:g})" if row["client_fraction"] == 1 else "poisson"
    return "10%" if row["model"] == "fedrecgel" else "all"


def _compare_table(result: dict, baseline: str) -> str:
    return (
        f"\n### FedRecGEL against a baseline module (`--baseline-fedrecgel {baseline}`)\n\n"
        f"{result['dataset']}, {result['rounds']} rounds interleaved in one process, "
        f"{result['threads']} thread(s), load average {result['load_average']} at the end; "
        "seconds per round (local training + aggregation + server step), median over rounds "
        "2 onwards.\n\n"
        "| module | wall s/round | CPU s/round |\n|---|---|---|\n"
        f"| baseline | {result['baseline_wall_median']:.3f} "
        f"| {result['baseline_cpu_median']:.3f} |\n"
        f"| current | {result['current_wall_median']:.3f} "
        f"| {result['current_cpu_median']:.3f} |\n"
        f"| speedup | {result['speedup_wall']:.2f}x | {result['speedup_cpu']:.2f}x |\n"
    )


def _write_docs(
    rows: list[dict],
    command: str,
    extra: str = "",
    *,
    mark: str = "round-speed",
    title: str = "## Seconds per round and peak memory",
) -> None:
    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start, end = f"<!-- {mark}:start -->", f"<!-- {mark}:end -->"
    block = (
        f"{start}\n{title}\n\nMeasured with `{command}` "
        f"({time.strftime('%Y-%m-%d')}, 2 cores, torch CPU, each row its own process; "
        f"load average {os.getloadavg()[0]:.1f} when written).\n\n"
        + _table(rows)
        + extra
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
    ap.add_argument(
        "--ml1m-views",
        default="auto",
        help="comma-separated private-view storages of the --ml1m-memory rows (auto, dense, "
        "paged: one row each)",
    )
    ap.add_argument("--client-fraction", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--views",
        choices=("auto", "dense", "sparse", "paged"),
        default=None,
        help="FedRAP's storage of the private views (default: the model's, 'auto')",
    )
    ap.add_argument(
        "--fedrecgel-all-clients-rounds",
        type=int,
        default=0,
        help="also FedRecGEL with every client every round on --dataset for this many rounds",
    )
    ap.add_argument(
        "--baseline-fedrecgel",
        default=None,
        help="a copy of an earlier fedrecgel.py to time against the current one (on FilmTrust)",
    )
    ap.add_argument(
        "--gowalla",
        default=None,
        help="also FedRAP, FedRecGEL and fedals on this Gowalla check-in file: 5 rounds at "
        "client fraction 0.1, every user evaluated (sampled and full ranking) every round; "
        "written into their own table",
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
    for model in filter(None, args.models.split(",")):
        for ev in (0, 1):
            rows.append(_run([*base, "--model", model, "--eval", str(ev)]))
            print(json.dumps(rows[-1]), flush=True)
    if args.extra_fedrecgel_dataset:
        extra_args = list(base)
        extra_args[extra_args.index("--dataset") + 1] = args.extra_fedrecgel_dataset
        rows.append(_run([*extra_args, "--model", "fedrecgel", "--eval", "1"]))
        print(json.dumps(rows[-1]), flush=True)
    if args.fedrecgel_all_clients_rounds:
        full = list(base)
        full[full.index("--rounds") + 1] = str(args.fedrecgel_all_clients_rounds)
        rows.append(
            _run([*full, "--model", "fedrecgel", "--eval", "0", "--client-fraction", "1.0"])
        )
        print(json.dumps(rows[-1]), flush=True)
    extra = ""
    if args.baseline_fedrecgel:
        compare_args = list(base)
        compare_args[compare_args.index("--dataset") + 1] = "filmtrust"
        result = _run([*compare_args, "--baseline-fedrecgel", args.baseline_fedrecgel])
        print(json.dumps(result), flush=True)
        extra = _compare_table(result, args.baseline_fedrecgel)
    for views in args.ml1m_views.split(",") if args.ml1m_memory else []:
        ml1m = ["--model", "fedrap", "--dataset", "synthetic-ml1m", "--rounds", "3", "--eval", "1"]
        ml1m += ["--threads", str(args.threads), "--out", args.out]
        rows.append(_run(ml1m + ([] if views == "auto" else ["--views", views])))
        print(json.dumps(rows[-1]), flush=True)
    command = "python benchmarks/round_speed.py " + shlex.join(sys.argv[1:])
    if args.write and rows:
        _write_docs(rows, command, extra)
    if args.gowalla:
        large = []
        for model in ("fedrap", "fedrecgel", "fedals"):
            run = ["--model", model, "--dataset", args.gowalla, "--rounds", "5", "--eval", "1"]
            run += ["--client-fraction", "0.1", "--threads", str(args.threads), "--out", args.out]
            large.append(_run(run))
            print(json.dumps(large[-1]), flush=True)
        if args.write:
            title = "### Gowalla: 5 rounds at client fraction 0.1, every user evaluated"
            _write_docs(large, command, mark="round-speed-gowalla", title=title)


if __name__ == "__main__":
    main()
