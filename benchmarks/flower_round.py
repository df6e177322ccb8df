"""Round time of one workload: in-process vs Flower simulation vs local deployment.

The workload is FedRAP on the synthetic dataset with secure aggregation and distributed DP
(``--secagg --epsilon``); every engine computes the same model (tests/test_flower_*.py).
Per engine we report the mean ``train_seconds`` of a round (cohort -> local training ->
secure aggregation -> model step; evaluation excluded) and the wall time of the whole run
(startup included). Engines: ``inprocess`` (``securefed.train``), ``transport`` (the
distributed protocol over an in-process transport: the protocol's own cost), ``simulation``
(Flower's simulation engine, Ray), ``deployment`` (SuperLink + N SuperNodes on 127.0.0.1, TLS
and SuperNode authentication, one long-lived ClientApp process per node: the defaults),
``deployment-insecure`` (the same with ``insecure=True``: no TLS, no node authentication) and
``deployment-per-message`` (TLS and authentication, but Flower's own scheduling: a fresh
ClientApp process per message and the SuperNode's 3 s idle poll; not run by default) and
``deployment-three`` (the default deployment without keys ahead: three exchanges a round,
each round advertising in its train reply) and ``deployment-four`` (eager masking off too: the
paper's four exchanges a round; neither run by default).
Deployment rows carry ``tls``, ``authenticated``, ``isolation``, ``eager_masking`` and
``keys_ahead``; the distributed engines' rows ``stage_seconds`` (mean seconds a round of each
Flower exchange); every row the 1-minute load average when it finished (the machine is shared).

    python benchmarks/flower_round.py --rounds 3 --nodes 3 --json
    python benchmarks/flower_round.py --rounds 2 --nodes 3 --write    # docs/deployment.md
    python benchmarks/flower_round.py --model fedrecgel --dataset ml-100k \
        --engines inprocess,deployment --rounds 2 --write-mark flower-round-ml100k-fedrecgel

``--write`` puts the table between the ``flower-round`` markers of docs/deployment.md
(``--write-mark NAME``: between ``<!-- NAME -->`` markers, added at the end of the "Round
time" section if missing), with each row's time per round as a multiple of the in-process
row's measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENGINES = (
    "inprocess",
    "transport",
    "simulation",
    "deployment",
    "deployment-insecure",
    "deployment-per-message",
    "deployment-three",
    "deployment-four",
)
DEFAULT_ENGINES = ENGINES[:-3]


def _config(args: argparse.Namespace):
    from securefed.training import PrivacyConfig, TrainConfig

    data = (
        {"synthetic_users": args.users, "synthetic_items": args.items}
        if args.dataset == "synthetic"
        else {"dataset": args.dataset, "data_dir": args.data_dir}
    )
    return TrainConfig(
        model=args.model,
        **data,
        rounds=args.rounds,
        eval_every=args.rounds,
        checkpoint_every=args.rounds,
        privacy=PrivacyConfig(secagg=True, epsilon=args.epsilon),
    )


def _round_seconds(run_dir: Path) -> float:
    from securefed import runs

    metrics = runs.read_metrics(run_dir)
    return sum(m["train_seconds"] for m in metrics) / max(len(metrics), 1)


def _stage_seconds(run_dir: Path) -> dict[str, float]:
    """Mean seconds a round of each Flower exchange (the server's ``flower_<stage>_seconds``:
    the message path there and back plus the nodes' work); a stage that ran in only some
    rounds (the ``masked`` fallback) is averaged over all rounds."""
    from securefed import runs

    metrics = runs.read_metrics(run_dir)
    keys = sorted({k for m in metrics for k in m if k.startswith("flower_")})
    n = max(len(metrics), 1)
    return {
        k[len("flower_") : -len("_seconds")]: round(sum(m.get(k, 0.0) for m in metrics) / n, 3)
        for k in keys
    }


def measure(engine: str, args: argparse.Namespace, work: Path) -> dict:
    cfg = _config(args)
    work = work / f"{len(list(work.iterdir()))}"  # an engine may be listed twice
    run_dir = work / engine / "run"
    t0 = time.perf_counter()
    if engine == "inprocess":
        from securefed.training import train

        train(cfg, out=run_dir)
    elif engine == "transport":
        from securefed.flower.local import LocalTransport
        from securefed.flower.server import FederatedServer

        transport = LocalTransport(args.nodes, state_dir=work / engine / "nodes")
        FederatedServer(cfg, run_dir=run_dir, transport=transport).run()
    elif engine == "simulation":
        from securefed.flower.deploy import run_simulation

        run_simulation(cfg, run_dir=run_dir, nodes=args.nodes, work_dir=work / engine / "work")
    else:
        from securefed.flower.deploy import run_local_deployment

        per_message = engine == "deployment-per-message"
        run_local_deployment(
            cfg,
            run_dir=run_dir,
            nodes=args.nodes,
            work_dir=work / engine / "work",
            insecure=engine == "deployment-insecure",
            isolation="subprocess" if per_message else "process",
            idle_poll=None if per_message else args.idle_poll,
            eager_masking=engine != "deployment-four",
            keys_ahead=engine not in ("deployment-three", "deployment-four"),
        )
    wall = time.perf_counter() - t0
    deployed = engine.startswith("deployment")
    secure = deployed and engine != "deployment-insecure"  # TLS + SuperNode authentication
    row = {
        "engine": engine,
        "nodes": args.nodes if engine != "inprocess" else None,
        "tls": secure,
        "authenticated": secure,
        "round_seconds": round(_round_seconds(run_dir), 2),
        "wall_seconds": round(wall, 1),
    }
    stages = _stage_seconds(run_dir)
    if stages:  # the distributed engines: where a round's exchanges went
        row["stage_seconds"] = stages
    if deployed:
        row["isolation"] = "subprocess" if engine == "deployment-per-message" else "process"
        row["eager_masking"] = engine != "deployment-four"
        row["keys_ahead"] = engine not in ("deployment-three", "deployment-four")
    row["load_average"] = round(os.getloadavg()[0], 2)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--engines",
        default=",".join(DEFAULT_ENGINES),
        help=f"Comma-separated, from {', '.join(ENGINES)}.",
    )
    ap.add_argument(
        "--idle-poll", type=float, default=0.2, help="SuperNode idle poll (s) of deployments."
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--users", type=int, default=60)
    ap.add_argument("--items", type=int, default=400)
    ap.add_argument("--epsilon", type=float, default=8.0)
    ap.add_argument("--model", default="fedrap")
    ap.add_argument("--dataset", default="synthetic", help="synthetic (--users x --items), ...")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--json", action="store_true", help="Print one JSON list.")
    ap.add_argument("--write", action="store_true", help="Write the table into docs/deployment.md.")
    ap.add_argument("--write-mark", default="flower-round", help="Marker name for --write.")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="flower-bench-") as tmp:
        for engine in args.engines.split(","):
            rows.append(measure(engine, args, Path(tmp)))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows))
    table = _table(rows, args)
    if not args.json:
        print(table)
    if args.write or args.write_mark != "flower-round":
        _write(table, args.write_mark)


_LABELS = {
    "inprocess": "in-process (`securefed.train`)",
    "transport": "distributed protocol, in-process transport",
    "simulation": "Flower simulation engine (Ray)",
    "deployment": "local deployment, TLS + node auth, long-lived ClientApp",
    "deployment-insecure": "local deployment, `--insecure`, long-lived ClientApp",
    "deployment-per-message": "local deployment, TLS + node auth, ClientApp per message",
    "deployment-three": "local deployment, TLS + node auth, long-lived, keys ahead off",
    "deployment-four": "local deployment, TLS + node auth, long-lived, eager masking off",
}


def _table(rows: list[dict], args: argparse.Namespace) -> str:
    """The markdown table, each row's s/round also as a multiple of the in-process row's."""
    base = next((r["round_seconds"] for r in rows if r["engine"] == "inprocess"), None)
    data = f"synthetic {args.users} x {args.items}" if args.dataset == "synthetic" else args.dataset
    head = (
        f"Written by `python benchmarks/flower_round.py --model {args.model} --dataset "
        f"{args.dataset} --engines {args.engines} --rounds {args.rounds} --nodes {args.nodes}` "
        f"({time.strftime('%Y-%m-%d')}, {args.model} on {data}, `--secagg --epsilon "
        f"{args.epsilon:g}`, engines one after another in one run; `load` is the 1-minute "
        "load average when the row finished, on this shared 2-core machine)."
    )
    lines = [
        head,
        "",
        "| engine | nodes | s / round | x in-process | wall s | load |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r['round_seconds'] / base:.1f}" if base else "-"
        lines.append(
            f"| {_LABELS.get(r['engine'], r['engine'])} | {r['nodes'] or '-'} | "
            f"{r['round_seconds']} | {ratio} | {r['wall_seconds']} | {r['load_average']} |"
        )
    return "\n".join(lines)


def _write(table: str, mark: str) -> None:
    doc = ROOT / "docs" / "deployment.md"
    text = doc.read_text()
    start, end = f"<!-- {mark} -->", f"<!-- /{mark} -->"
    if start not in text:  # at the end of the "Round time" section
        anchor = text.find("\n## ", text.index("## Round time") + 1)
        anchor = len(text) if anchor < 0 else anchor
        text = text[:anchor].rstrip("\n") + f"\n\n{start}\n{end}\n" + text[anchor:]
    a = text.index(start) + len(start)
    b = text.index(end)
    doc.write_text(text[:a] + "\n" + table + "\n" + text[b:])


if __name__ == "__main__":
    main()
