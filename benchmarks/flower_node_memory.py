"""What a Flower node holds and how long it takes to get ready, at a dataset's full scale.

Each measurement runs in a fresh process doing what a SuperNode's long-lived ClientApp
process (securefed.flower.worker) does before its first round: import securefed's node code
(torch included), answer the server's hello (load the dataset named by the run's config,
split it as the run does, report its name and sizes) and build its runtime for the first
train message (the model, its users' state, the privacy aggregator). Per step: seconds and
the process's resident memory after it; then the peak, the bytes of the node's split (its
numpy arrays) and of its model's state.

    python benchmarks/flower_node_memory.py --dataset ../shared/data/gowalla/checkins.csv \\
        --models fedals,fedrecgel --nodes 3

Rows: ``replay`` is a run with ``--replay-from-seed`` (or without DP), whose nodes replay the
in-process round for the whole cohort; the default DP run draws from the OS and a node trains
its own users only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _rss_mb() -> tuple[float, float]:
    """(current, peak) resident set size of this process, MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def _child(args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    import numpy as np
    import torch

    import securefed.flower.apps  # noqa: F401  (what the worker imports before any task)
    import securefed.flower.node  # noqa: F401
    from securefed import runs
    from securefed.flower.messages import (
        PROTOCOL,
        NodeMemory,
        Payload,
        _runtime,
        handle_node_message,
    )
    from securefed.training import TrainConfig

    t1 = time.perf_counter()
    rss_import = _rss_mb()[0]
    privacy = {"epsilon": args.epsilon, "secagg": True, "replay": args.replay}
    cfg = TrainConfig.from_dict(
        {"model": args.model, "dataset": args.dataset, "rounds": 2, "privacy": privacy}
    )
    memory = NodeMemory()
    node_config = {
        "partition-id": args.partition,
        "num-partitions": args.nodes,
        "state-dir": tempfile.mkdtemp(prefix="node-memory-"),
    }
    toml = runs.dumps_toml(cfg.to_dict())
    message = {"protocol": PROTOCOL, "run-token": "bench0", "config": toml}
    hello = handle_node_message(
        "hello", Payload(config=dict(message)), node_config=node_config, state={}, memory=memory
    )
    t2 = time.perf_counter()
    rss_hello = _rss_mb()[0]
    runtime = _runtime(
        Payload(config=dict(message)), node_config, memory, "bench0", args.partition, args.nodes
    )
    _ = runtime.aggregator  # built by the first train message
    t3 = time.perf_counter()
    rss_runtime, peak = _rss_mb()
    split = runtime.split
    split_bytes = sum(v.nbytes for v in vars(split).values() if isinstance(v, np.ndarray))
    model_bytes = sum(
        v.numel() * v.element_size()
        for v in runtime.model.state_dict().values()
        if isinstance(v, torch.Tensor)
    )
    return {
        "model": args.model,
        "replay": args.replay,
        "dataset": hello.config["data-name"],
        "users": hello.config["data-users"],
        "items": hello.config["data-items"],
        "own_users": int(runtime.users.numel()),
        "import_s": round(t1 - t0, 2),
        "hello_s": round(t2 - t1, 2),
        "runtime_s": round(t3 - t2, 2),
        "ready_s": round(t3 - t0, 2),
        "rss_import_mb": round(rss_import),
        "rss_hello_mb": round(rss_hello),
        "rss_ready_mb": round(rss_runtime),
        "peak_rss_mb": round(peak),
        "split_mb": round(split_bytes / 2**20, 1),
        "model_mb": round(model_bytes / 2**20, 1),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--models", default="fedals")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--partition", type=int, default=0)
    ap.add_argument("--epsilon", type=float, default=8.0)
    ap.add_argument("--modes", default="os,replay", help="os (the default DP run), replay")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--replay", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args)))
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for model in args.models.split(","):
        for mode in args.modes.split(","):
            cmd = [sys.executable, __file__, "--child", "--model", model, "--dataset", args.dataset]
            cmd += ["--nodes", str(args.nodes), "--partition", str(args.partition)]
            cmd += ["--epsilon", str(args.epsilon)] + (["--replay"] if mode == "replay" else [])
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            if out.returncode != 0:
                print(out.stderr, file=sys.stderr)
                raise SystemExit(out.returncode)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["load_avg"] = round(os.getloadavg()[0], 2)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
