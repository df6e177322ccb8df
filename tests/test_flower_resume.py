"""Resuming a distributed run: the server back at its checkpoint, the nodes back at theirs.

The server keeps the shared model, its own step's state and the ledger; every user's private
state stays on the nodes, which keep a snapshot at each checkpoint round. A run interrupted
mid-round and resumed must compute what the uninterrupted run computes (same seeds), and
count the releases made after the checkpoint again. Flower's processes are not needed for
this (``LocalTransport`` runs the same message code); ``test_flower_deploy.py`` restarts a
real local deployment.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from securefed import runs
from securefed.errors import ConfigError, IntegrityError, PrivacyBudgetError, ProtocolError
from securefed.flower import models
from securefed.flower.local import LocalTransport
from securefed.flower.node import NodeRuntime, TrainTask
from securefed.flower.pipeline import (
    EVAL_ROUND_OFFSET,
    ReleaseLedger,
    public_seed,
    round_parameters,
)
from securefed.flower.server import WORST_CASE_FILE, FederatedServer, ServerSettings
from securefed.training import PrivacyConfig, RunFinished, TrainConfig, build_model

RESULT_KEYS = ("loss", "participants", "contributors", "epsilon", "val_hr@10", "val_ndcg@10")
RESULT_KEYS += ("test_hr@10", "test_ndcg@10", "test_full_hr@10", "test_full_ndcg@10")


def _cfg(model: str = "fedrap", **kw) -> TrainConfig:
    base = dict(
        model=model,
        synthetic_users=60,
        synthetic_items=400,
        rounds=4,
        checkpoint_every=2,
        privacy=PrivacyConfig(secagg=True, epsilon=8.0, replay=True),
    )
    base.update(kw)
    return TrainConfig(**base)


class _Crash(Exception):
    """The server process dies here."""


class CrashingTransport:
    """Forwards to ``inner`` until the server asks for ``stage`` of round ``round_index``:
    then the server 'dies' (an exception out of ``run``) and the nodes live on. Stage
    ``evaluation-unmask``: the unmask of the secure evaluation round after that round."""

    def __init__(self, inner: LocalTransport, stage: str, round_index: int) -> None:
        self.inner, self.stage, self.round_index = inner, stage, round_index
        self.current = -1  # the round of the last train message

    def node_ids(self) -> list[int]:
        return self.inner.node_ids()

    def exchange(self, stage, messages, *, timeout):
        rnd = int(next(iter(messages.values())).config.get("round", -1))
        if stage == "train":
            self.current = rnd
        if self.stage == "evaluation-unmask":
            crash = stage == "unmask" and rnd == EVAL_ROUND_OFFSET + self.round_index
        else:
            crash = stage == self.stage and self.current == self.round_index
        if crash:
            raise _Crash(f"{self.stage} of round {self.round_index}")
        return self.inner.exchange(stage, messages, timeout=timeout)


def _run(cfg, tmp_path, name, transport):
    return FederatedServer(
        cfg, run_dir=tmp_path / name, transport=transport, settings=ServerSettings()
    ).run()


def _ledger(run_dir) -> list:
    return json.loads((run_dir / runs.LEDGER_FILE).read_text())["events"]


SIGMA = PrivacyConfig(secagg=True, noise_multiplier=1.0, replay=True)  # no epsilon cap


@pytest.mark.parametrize(
    ("model", "stage", "long_lived"),
    [
        ("fedrap", "train", False),  # before the round's release: nothing to count again
        ("fedrap", "evaluate", True),  # after the release (ledger written ahead of unmask)
        # inside the secure evaluation round: the nodes hold its session when the server dies
        ("fedrap", "evaluation-unmask", True),
        ("fedrecgel", "unmask", False),  # server Adam state comes back from the checkpoint
    ],
)
def test_resumed_run_computes_the_uninterrupted_run(tmp_path, model, stage, long_lived):
    # FedRecGEL's 10 % default is Poisson under DP (6 of 60 expected), and a Poisson round
    # below the survivors its noise shares are sized for aborts: every user instead.
    fraction = 1.0 if model == "fedrecgel" else None
    cfg = _cfg(model, privacy=SIGMA, client_fraction=fraction)
    ref = _run(cfg, tmp_path, "ref", LocalTransport(3, state_dir=tmp_path / "ref-nodes"))

    nodes = LocalTransport(3, state_dir=tmp_path / "nodes", long_lived=long_lived)
    with pytest.raises(_Crash):
        _run(cfg, tmp_path, "run", CrashingTransport(nodes, stage, round_index=2))
    run_dir = tmp_path / "run"
    assert runs.load_checkpoint(run_dir)["round"] == 2  # rounds 1-2 kept, round 3 lost
    released_before = len(_ledger(run_dir))

    res = FederatedServer.resume(run_dir, transport=nodes).run()

    assert [m["round"] for m in res.metrics] == [1, 2, 3, 4]
    assert [m["round"] for m in runs.read_metrics(run_dir)] == [1, 2, 3, 4]
    # written ahead of unmask
    counted_twice = 1 if stage in ("unmask", "evaluate", "evaluation-unmask") else 0
    for a, b in zip(ref.metrics, res.metrics, strict=True):
        for key in RESULT_KEYS:
            if key == "epsilon" and counted_twice and a["round"] > 2:
                assert b[key] > a[key]  # round 3's first release is counted too
            elif key in a:
                assert b[key] == a[key], (a["round"], key)
    got = runs.load_checkpoint(run_dir)["global"]
    want = runs.load_checkpoint(tmp_path / "ref")["global"]
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    # Every release is counted: round 3's, if it happened before the crash, twice.
    assert released_before == 2 + counted_twice
    assert len(_ledger(run_dir)) == len(_ledger(tmp_path / "ref")) + counted_twice
    assert res.summary["epsilon"] >= ref.summary["epsilon"]


def test_a_resume_that_counts_a_release_again_stops_at_the_epsilon_cap(tmp_path):
    cfg = _cfg()  # epsilon 8, the noise sized for 4 releases
    nodes = LocalTransport(3, state_dir=tmp_path / "nodes", long_lived=True)
    with pytest.raises(_Crash):
        _run(cfg, tmp_path, "run", CrashingTransport(nodes, "evaluate", round_index=2))
    res = FederatedServer.resume(tmp_path / "run", transport=nodes).run()
    # Round 3 was released before the crash and again after it: 5 releases would pass the
    # budget, so the run stops after round 3 with its budget spent, never above it.
    assert [m["round"] for m in res.metrics] == [1, 2, 3]
    assert res.summary["budget_spent"] is True
    assert res.summary["epsilon"] <= 8.0
    assert len(_ledger(tmp_path / "run")) == 4


def test_keys_advertised_for_one_round_serve_no_other_task(tmp_path):
    # Keys ahead: a node advertises its users' keys for the round the server announced; the
    # train message must name the same cohort, seed and parameters, or the node refuses it
    # before anything is charged or trained (found in review: the session's cohort size
    # could differ from the one charged and encoded).
    cfg = _cfg(rounds=3, checkpoint_every=1)
    state_dir = tmp_path / "state"
    runtime = NodeRuntime(
        cfg, run_token="t0", partition_id=0, num_partitions=1, state_dir=state_dir
    )
    agg = runtime.aggregator
    arrays, scalars = models.global_payload(cfg.model, build_model(cfg, runtime.split))

    def task(cohort):
        fingerprint = round_parameters(agg, cohort.numel()).fingerprint()
        return TrainTask(
            round_index=0,
            cohort=cohort,
            public_seed=public_seed(agg, 0),
            fingerprint=fingerprint,
            aggregate=True,
        )

    announced = task(torch.arange(runtime.split.n_users))
    session, adverts = runtime.advertise(announced)
    assert adverts
    for other in (
        task(torch.arange(runtime.split.n_users - 10)),
        dataclasses.replace(announced, public_seed=b"\1" * 16),
    ):
        with pytest.raises(IntegrityError):
            runtime.train(other, arrays, scalars, ahead=session, keys={})
    assert runtime.trained_rounds == 0
    assert not (state_dir / "partition-0.user.ledger.json").exists()


def test_processes_sharing_a_state_directory_share_one_count(tmp_path):
    # Two runs at once, or overlapping per-message ClientApps: each re-reads the count under
    # a lock before it charges (found in review: 40 charges accepted, 20 on disk).
    cfg = _cfg(rounds=3)
    runtime = NodeRuntime(cfg, run_token="t0", partition_id=0, num_partitions=1, state_dir=None)
    agg, m = runtime.aggregator, runtime.split.n_users
    path = tmp_path / "partition-0.user.ledger.json"
    a, b = ReleaseLedger(path), ReleaseLedger(path)  # both opened before any charge
    a.charge(agg, 0, m)
    b.charge(agg, 1, m)
    a.charge(agg, 2, m)
    with pytest.raises(PrivacyBudgetError):
        b.charge(agg, 2, m)  # a fourth release of three
    assert [e["round"] for e in json.loads(path.read_text())["events"]] == [0, 1, 2]


def test_a_node_charges_local_dp_sgd_in_a_round_too_small_to_aggregate(tmp_path):
    # Interaction-level DP: the users' DP-SGD writes their private state (FedRAP's D_u feeds
    # later uploads) even in a round that uploads nothing; the node counts it (found in
    # review: six such rounds went uncounted).
    privacy = PrivacyConfig(epsilon=8.0, privacy_unit="interaction", secagg=True)
    cfg = _cfg(rounds=2, privacy=privacy)
    runtime = NodeRuntime(
        cfg, run_token="t0", partition_id=0, num_partitions=1, state_dir=tmp_path / "state"
    )
    arrays, scalars = models.global_payload(cfg.model, build_model(cfg, runtime.split))
    runtime.train(_task(cfg, runtime, 0), arrays, scalars)  # aggregate=False
    ledger = tmp_path / "state" / "partition-0.interaction.ledger.json"
    events = json.loads(ledger.read_text())["events"]
    assert len(events) == runtime.aggregator.releases_per_round > 0


def test_after_a_resume_the_server_stops_at_the_cap_before_any_node_refuses(tmp_path):
    # 20 releases sized for epsilon 8 (every user every round). Round 3, released before the
    # crash, is released again: its real-survivor ledger then leaves round 20 under the cap,
    # but not its worst case, which the nodes count. The server counts the same worst case
    # and stops; checking its real ledger plus one worst round let round 20 go out, every
    # node refused it, and every later round would abort the same way (found in review).
    cfg = _cfg(rounds=20, eval_every=5)
    nodes = LocalTransport(3, state_dir=tmp_path / "nodes", long_lived=True)
    with pytest.raises(_Crash):
        _run(cfg, tmp_path, "run", CrashingTransport(nodes, "unmask", round_index=2))
    res = FederatedServer.resume(tmp_path / "run", transport=nodes).run()
    assert [m["round"] for m in res.metrics] == list(range(1, 20))
    assert res.summary["budget_spent"] is True and res.summary["epsilon"] <= 8.0
    assert not any("aborted" in m for m in res.metrics)
    assert "fewest survivors" in res.summary["stopped"] and "node" not in res.summary["stopped"]
    worst = json.loads((tmp_path / "run" / WORST_CASE_FILE).read_text())["events"]
    assert [e["round"] for e in worst] == sorted([*range(19), 2])


def test_a_new_run_on_spent_nodes_stops_on_their_refusal(tmp_path):
    # The nodes count their users' releases across runs on their state directory: a second
    # run (a fresh server, a new run token) gets a refusal in its first train replies and
    # stops with its budget spent, instead of aborting every round on silent nodes.
    cfg = _cfg()  # epsilon 8, the noise sized for 4 releases
    nodes = LocalTransport(3, state_dir=tmp_path / "nodes")
    assert len(_run(cfg, tmp_path, "first", nodes).metrics) == 4
    second = _run(cfg, tmp_path, "second", nodes)
    assert second.metrics == [] and second.summary["budget_spent"] is True
    assert "refused beyond the budget" in second.summary["stopped"]
    assert _ledger(tmp_path / "second") == []  # nothing released


def test_resume_without_a_checkpoint_starts_over_and_counts_what_was_released(tmp_path):
    cfg = _cfg(checkpoint_every=3, privacy=SIGMA)
    ref = _run(cfg, tmp_path, "ref", LocalTransport(3, state_dir=tmp_path / "ref-nodes"))
    nodes = LocalTransport(3, state_dir=tmp_path / "nodes")
    with pytest.raises(_Crash):
        _run(cfg, tmp_path, "run", CrashingTransport(nodes, "train", round_index=2))
    run_dir = tmp_path / "run"
    assert not (run_dir / runs.CHECKPOINT_FILE).exists()
    res = FederatedServer.resume(run_dir, transport=nodes).run()
    assert [m["test_hr@10"] for m in res.metrics] == [m["test_hr@10"] for m in ref.metrics]
    assert len(_ledger(run_dir)) == len(_ledger(tmp_path / "ref")) + 2  # rounds 1-2 again


def test_a_finished_run_or_a_foreign_directory_is_not_resumed(tmp_path):
    cfg = _cfg(rounds=2)
    nodes = LocalTransport(3, state_dir=tmp_path / "nodes")
    _run(cfg, tmp_path, "done", nodes)
    released = runs.load_state(tmp_path / "done" / runs.MODEL_FILE)  # as in-process runs
    assert released is not None and released["round"] == 2 and released["model"] == "fedrap"
    assert "C" in released["state"]  # FedRAP's global item view, the shared parameters
    with pytest.raises(RunFinished):
        FederatedServer.resume(tmp_path / "done", transport=nodes)
    with pytest.raises(ConfigError, match="does not exist"):
        FederatedServer.resume(tmp_path / "nothing", transport=nodes)
    (tmp_path / "nothing").mkdir()
    with pytest.raises(ConfigError, match="not a run directory"):
        FederatedServer.resume(tmp_path / "nothing", transport=nodes)
    (tmp_path / "done" / "flower.json").unlink()
    (tmp_path / "done" / runs.SUMMARY_FILE).unlink()
    with pytest.raises(ConfigError, match="flower.json"):
        FederatedServer.resume(tmp_path / "done", transport=nodes)


def test_a_flower_run_is_trained_by_one_server_at_a_time(tmp_path):
    """A server resuming a run directory another process holds is refused before it reads
    or writes anything there (two servers would each write their own ledger over the
    other's); the running server holds its directory, and gives it back when it stops."""
    cfg = _cfg()
    nodes = LocalTransport(3, state_dir=tmp_path / "n")
    run_dir = tmp_path / "run"
    with pytest.raises(_Crash):
        _run(cfg, tmp_path, "run", CrashingTransport(nodes, "train", 2))
    assert not (run_dir / runs.LOCK_FILE).exists()
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    held = runs.RunLock.acquire(run_dir)
    try:
        with pytest.raises(ConfigError, match="is being trained by process"):
            FederatedServer.resume(run_dir, transport=nodes).run()
    finally:
        held.release()
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before
    seen = []

    def progress(record):
        if not seen:
            with pytest.raises(ConfigError, match="is being trained by"):
                runs.RunLock.acquire(run_dir)
            seen.append(record)

    res = FederatedServer.resume(run_dir, transport=nodes, progress=progress).run()
    assert seen and res.metrics[-1]["round"] >= 3
    assert not (run_dir / runs.LOCK_FILE).exists()


def test_resume_refuses_another_number_of_partitions(tmp_path):
    cfg = _cfg()
    with pytest.raises(_Crash):
        _run(
            cfg,
            tmp_path,
            "run",
            CrashingTransport(LocalTransport(3, state_dir=tmp_path / "n"), "train", 2),
        )
    other = LocalTransport(2, state_dir=tmp_path / "n2")
    with pytest.raises(ConfigError, match="started with 3 partitions and 2 nodes"):
        FederatedServer.resume(tmp_path / "run", transport=other).run()


def _task(cfg, runtime, r, *, resume=False):
    return TrainTask(
        round_index=r,
        cohort=torch.arange(runtime.split.n_users),
        public_seed=b"\0" * 16,
        fingerprint="",
        aggregate=False,
        resume=resume,
    )


def _private(cfg, runtime):
    return models.private_state(cfg.model, runtime.model, runtime.users)


@pytest.mark.parametrize("on_disk", [True, False])
def test_node_rewinds_to_its_snapshot_of_the_resumed_round_only(tmp_path, on_disk):
    cfg = _cfg(rounds=6, checkpoint_every=2, privacy=PrivacyConfig())
    state_dir = tmp_path / "state" if on_disk else None
    runtime = NodeRuntime(
        cfg, run_token="t0", partition_id=0, num_partitions=1, state_dir=state_dir
    )
    arrays, scalars = models.global_payload(cfg.model, build_model(cfg, runtime.split))
    states = {}
    for r in range(5):
        states[r] = _private(cfg, runtime)
        runtime.train(_task(cfg, runtime, r), arrays, scalars)
    assert runtime.trained_rounds == 5
    # Snapshots of the two newest checkpoint rounds only (2 and 4), never of round 0 now.
    assert runtime._snapshot_rounds() == [2, 4]
    with pytest.raises(ProtocolError, match="already trained"):
        runtime.train(_task(cfg, runtime, 2), arrays, scalars)
    with pytest.raises(ProtocolError, match="keeps no snapshot of round 3"):
        runtime.train(_task(cfg, runtime, 3, resume=True), arrays, scalars)
    # A restarted node (from disk) rewinds as well as a running one.
    if on_disk:
        runtime = NodeRuntime(
            cfg, run_token="t0", partition_id=0, num_partitions=1, state_dir=state_dir
        )
        assert runtime.trained_rounds == 5
    runtime._rewind(2)
    assert runtime.trained_rounds == 2
    for key, value in _private(cfg, runtime).items():
        assert torch.equal(value, states[2][key]), key
    assert runtime._snapshot_rounds() == [2]  # round 4's belonged to the abandoned future


def test_a_node_counts_its_own_releases_and_refuses_a_server_that_asks_beyond_the_budget(
    tmp_path,
):
    # Epsilon 8 with the noise sized for 3 releases of every user (the whole population each
    # round). A server may ask for a round again with `resume` (a real resume must), so the
    # node counts every release itself, re-releases too, before it trains anything.
    cfg = _cfg(rounds=3, checkpoint_every=1)
    state_dir = tmp_path / "state"

    def node(token="t0"):
        return NodeRuntime(
            cfg, run_token=token, partition_id=0, num_partitions=1, state_dir=state_dir
        )

    runtime = node()
    agg = runtime.aggregator
    cohort = torch.arange(runtime.split.n_users)
    fingerprint = round_parameters(agg, cohort.numel()).fingerprint()
    arrays, scalars = models.global_payload(cfg.model, build_model(cfg, runtime.split))

    def task(r, *, resume=False):
        seed = public_seed(agg, r)
        return TrainTask(
            round_index=r,
            cohort=cohort,
            public_seed=seed,
            fingerprint=fingerprint,
            aggregate=True,
            resume=resume,
        )

    runtime.train(task(0), arrays, scalars)
    runtime.train(task(1), arrays, scalars)
    # A resume to round 2 (index 1) fits the budget: the third release.
    runtime.train(task(1, resume=True), arrays, scalars)
    assert runtime.trained_rounds == 2
    ledger = state_dir / "partition-0.user.ledger.json"  # beside the runs: across run tokens
    assert [e["round"] for e in json.loads(ledger.read_text())["events"]] == [0, 1, 1]
    # Nothing is charged for a round another check refuses (the server's parameters).
    with pytest.raises(ProtocolError, match="round parameters differ"):
        runtime.train(dataclasses.replace(task(2), fingerprint="forged"), arrays, scalars)
    # A fourth, whether round 3, round 2 once more, or round 1 of a "new run" the server
    # opens on the same state directory, would pass epsilon 8: refused before the node
    # trains or rewinds, by a restarted node too (the count is on disk, never rewound).
    kept = _private(cfg, runtime)
    for again in (runtime, node()):
        for r, resume in ((2, False), (1, True)):
            with pytest.raises(ProtocolError, match="beyond the budget"):
                again.train(task(r, resume=resume), arrays, scalars)
            assert again.trained_rounds == 2
            for key, value in _private(cfg, again).items():
                assert torch.equal(value, kept[key]), key
    with pytest.raises(ProtocolError, match="beyond the budget"):
        node("t1").train(task(0), arrays, scalars)
    assert len(json.loads(ledger.read_text())["events"]) == 3


@pytest.mark.parametrize("command", ["local", "simulate"])
def test_cli_resume_takes_the_recorded_run_and_refuses_new_settings(tmp_path, monkeypatch, command):
    pytest.importorskip("flwr", reason="Flower is not installed")
    import typer
    from typer.testing import CliRunner

    from securefed.cli.flower import flower_app
    from securefed.flower import deploy

    cfg = _cfg(rounds=3)
    nodes = LocalTransport(3, state_dir=tmp_path / "nodes")
    with pytest.raises(_Crash):
        _run(cfg, tmp_path, "run", CrashingTransport(nodes, "train", round_index=2))
    calls = []

    def fake(config, *, run_dir, nodes, work_dir, stage_timeout, resume, **_):
        calls.append((config, run_dir, nodes, work_dir, resume))
        return {"model": config.model, "dataset": "synthetic", "rounds": 3, "seconds": 1.0}

    runner = "run_local_deployment" if command == "local" else "run_simulation"
    monkeypatch.setattr(deploy, runner, fake)
    root = typer.Typer()
    root.add_typer(flower_app, name="flower")
    run_dir = tmp_path / "run"
    res = CliRunner().invoke(root, ["flower", command, "--resume", str(run_dir)])
    assert res.exit_code == 0, res.output
    [(config, got_dir, n, work, resume)] = calls
    assert (got_dir, n, work, resume) == (run_dir, 3, tmp_path / "run.flower", True)
    assert config.to_dict() == cfg.to_dict()  # the recorded config, nothing re-resolved
    for bad, what in (
        (["--rounds", "9"], "drop --rounds"),
        (["--nodes", "2"], "resume it with --nodes 3"),
    ):
        res = CliRunner().invoke(root, ["flower", command, "--resume", str(run_dir), *bad])
        assert res.exit_code == 2 and what in " ".join(res.output.split()), res.output
        assert "Traceback" not in res.output
    res = CliRunner().invoke(root, ["flower", command, "--resume", str(tmp_path / "nothing")])
    assert res.exit_code == 2 and "does not exist" in " ".join(res.output.split())
    (tmp_path / "nothing").mkdir()
    res = CliRunner().invoke(root, ["flower", command, "--resume", str(tmp_path / "nothing")])
    assert res.exit_code == 2 and "not a run directory" in " ".join(res.output.split())
    assert len(calls) == 1
    # A finished run: nothing to do, said in one line, exit 0.
    _run(_cfg(rounds=2), tmp_path, "done", LocalTransport(3, state_dir=tmp_path / "n2"))
    res = CliRunner().invoke(root, ["flower", command, "--resume", str(tmp_path / "done")])
    assert res.exit_code == 0 and "nothing to resume" in " ".join(res.output.split())
    assert "kept its private state" not in " ".join(res.output.split())  # found in a walkthrough
    assert len(calls) == 1
