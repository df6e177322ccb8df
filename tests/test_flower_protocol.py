"""The distributed protocol without Flower's processes: server driver + node handlers in-process.

Every payload goes through the same message handler, wire format and session freeze/thaw as a
deployment (``LocalTransport``); these tests pin that the distributed run computes exactly what
``securefed.train`` computes, and that dropouts, aborts and tampering follow the protocol.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from protocols.secagg import wire
from protocols.secagg.wire import ring_dtype
from securefed import runs
from securefed.errors import ConfigError, IntegrityError
from securefed.federation.base import DenseUpdates
from securefed.federation.cohort import round_cohort
from securefed.flower import models
from securefed.flower.local import LocalTransport
from securefed.flower.messages import SESSION_KEY, join_messages, split_messages
from securefed.flower.node import NodeRuntime, TrainTask
from securefed.flower.pipeline import (
    EVAL_RING_BITS,
    LOSS_OFFSET,
    LOSS_SCALE,
    encode_updates,
    evaluation_parameters,
    public_seed,
    round_parameters,
)
from securefed.flower.server import FederatedServer, ServerSettings
from securefed.flower.session import NodeSession
from securefed.training import (
    PrivacyConfig,
    TrainConfig,
    build_aggregator,
    build_model,
    load_split,
    train,
)

METRICS = ("val_hr@10", "val_ndcg@10", "test_hr@10", "test_full_hr@10", "test_full_ndcg@10")
_SECAGG_ONLY = PrivacyConfig(secagg=True)


def _metric_tol(key: str) -> float:
    """How far a deployed round's metric may be from the in-process one: hits are summed
    exactly by the secure evaluation round, a user's NDCG to 2^-16."""
    return 2.0**-16 if "ndcg" in key else 1e-12


def _cfg(**kw) -> TrainConfig:
    base = dict(
        model="fedrap",
        synthetic_users=60,
        synthetic_items=400,
        rounds=2,
        checkpoint_every=1,
        # Replay: the equivalence tests compare the deployment with the seeded simulation.
        privacy=PrivacyConfig(secagg=True, epsilon=8.0, replay=True),
    )
    base.update(kw)
    return TrainConfig(**base)


def _run(cfg, tmp_path, name="fl", *, eager=True, **kw):
    transport = LocalTransport(3, state_dir=tmp_path / f"{name}-nodes", **kw)
    server = FederatedServer(
        cfg,
        run_dir=tmp_path / name,
        transport=transport,
        settings=ServerSettings(eager_masking=eager),
    )
    return server.run(), transport


def _decode_error_bound(cfg: TrainConfig, m: int) -> float:
    split = load_split(cfg)
    agg = build_aggregator(cfg, split, build_model(cfg, split))
    return round_parameters(agg, m).codec.max_decode_error(m)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["fedrap", "fedrecgel", "fedals", "mostpop"])
def test_distributed_run_equals_in_process_simulation(tmp_path, model):
    # FedRecGEL with Poisson cohorts of half the users (its 10 % default would sample 6 of
    # 60): both sides size each round's noise shares for that round's own cohort; and full
    # ranking every round (the in-process run gives the selected round full-ranking
    # metrics after the fact, the Flower server only where it evaluated in full).
    extra = {"client_fraction": 0.5, "full_eval_every": 1} if model == "fedrecgel" else {}
    cfg = _cfg(model=model, **extra)
    ref = train(cfg, out=tmp_path / "ref")
    res, _ = _run(cfg, tmp_path)
    assert len(res.metrics) == len(ref.metrics) == 2
    for a, b in zip(ref.metrics, res.metrics, strict=True):
        assert a["contributors"] == b["contributors"] > 0 and not b.get("aborted")
        assert a["epsilon"] == b["epsilon"]
        for key in METRICS:
            if key in a:
                assert b[key] == pytest.approx(a[key], abs=_metric_tol(key)), key
        # The training counters, summed in the masked inputs (loss to 2^-16 a user).
        assert b["clipped_fraction"] == a["clipped_fraction"]
        assert b["loss"] == pytest.approx(a["loss"], abs=2.0**-16)
    # Same global model to the fixed-point precision: the nodes train their subsets of the
    # same round plan, so a float32 rounding difference can move one ring coordinate by one
    # unit (1/scale of the sum) per round; nothing larger is allowed.
    # The in-process run has finished: its released model is the shared parameters.
    shared = runs.load_state(tmp_path / "ref" / runs.MODEL_FILE)["state"]
    assert set(shared) == set(ref.model.global_parameters())
    got = runs.load_checkpoint(tmp_path / "fl")["global"]
    m = res.metrics[0]["participants"]
    tol = cfg.rounds * _decode_error_bound(cfg, m) / m
    if model == "fedals":
        # fedals's private server step solves for V from the sums instead of adding their
        # mean: a sum's rounding error reaches V scaled by (1 + alpha) / reg and the
        # population scale, not divided by m; the metrics above are still equal exactly.
        tol = cfg.rounds * _decode_error_bound(cfg, m) * 4.0
    for key, value in shared.items():
        assert float((got[key] - value).abs().max()) <= tol, key
    assert res.summary["epsilon"] == ref.summary["epsilon"]


def _replay_ring(cfg, tmp_path, round_index=0, partition=(0, 1)):
    """Every participant's encoded input of round 0 (an auditor replaying the seeded run,
    with the config resolved on the data as the server resolves and sends it); with
    ``partition`` ``(i, n)``, those of node ``i`` of ``n`` (its users carry its mean loss)."""
    if cfg.spec.resolve_for_data is not None:
        cfg, _ = cfg.spec.resolve_for_data(cfg, load_split(cfg))
    pid, nparts = partition
    runtime = NodeRuntime(
        cfg,
        run_token="audit",
        partition_id=pid,
        num_partitions=nparts,
        state_dir=tmp_path / f"audit-{pid}-{nparts}",
    )
    agg = runtime.aggregator
    cohort = torch.arange(runtime.split.n_users)
    params = round_parameters(agg, cohort.numel())
    arrays, scalars = models.global_payload(cfg.model, build_model(cfg, runtime.split))
    task = TrainTask(
        round_index=round_index,
        cohort=cohort,
        public_seed=public_seed(agg, round_index),
        fingerprint=params.fingerprint(),
        aggregate=True,
    )
    reply = runtime.train(task, arrays, scalars)
    return reply.session.inputs, params, agg, arrays


@pytest.mark.slow
@pytest.mark.parametrize(
    ("eager", "stage", "dropped"),
    [
        # the paper's four exchanges: node 101's users shared keys, then went silent; their
        # mask keys are rebuilt from the survivors' shares
        (False, "masked", 20),
        # eager masking: node 101 never answers the share stage, the server discards the
        # eager inputs (masked towards its users too) and runs the masked stage after all
        (True, "share", 0),
    ],
)
def test_node_killed_mid_round_gives_the_survivors_sum(tmp_path, eager, stage, dropped):
    # One of three nodes is a third of the users: the graph must tolerate that many dropouts.
    cfg = _cfg(
        rounds=1,
        privacy=PrivacyConfig(secagg=True, epsilon=8.0, secagg_dropout=0.4, replay=True),
    )
    res, transport = _run(
        cfg, tmp_path, eager=eager, drop=lambda st, node, r: st == stage and node == 101
    )
    rec = res.metrics[0]
    assert "aborted" not in rec, rec.get("aborted")
    holders = torch.arange(1, 60, 3)  # partition 1: users 1, 4, 7, ...
    survivors = [u for u in range(60) if u not in set(holders.tolist())]
    assert rec["contributors"] == rec["secagg_survivors"] == len(survivors) == 40
    assert rec["secagg_dropped"] == dropped
    assert rec["secagg_eager"] is False  # a fallback, or eager masking off
    assert rec["flower_masked_seconds"] > 0
    assert rec["eval_users"] == 40  # the secure evaluation round: the live nodes' users
    # The server's model step used exactly the survivors' sum (recomputed by replay).
    inputs, params, agg, arrays = _replay_ring(cfg, tmp_path)
    bits = params.codec.modulus_bits
    total = np.zeros(next(iter(inputs.values())).shape, dtype=np.uint64)
    for sid in survivors:  # cohort is everyone, so sid == user
        total += inputs[sid]
    total &= np.uint64((1 << bits) - 1)
    mean = torch.from_numpy(params.codec.decode_sum(total[: agg.dim])).float() / len(survivors)
    # The counters beside the update: the surviving nodes' (0 and 2 of 3, each user carrying
    # its node's mean loss), replayed node by node.
    counters = np.zeros(params.counters.width, dtype=np.uint64)
    for pid in (0, 2):
        node_inputs, *_ = _replay_ring(cfg, tmp_path, partition=(pid, 3))
        for row in node_inputs.values():
            counters = params.codec.add(counters, row[agg.dim :])
    trained, clipped, loss, _ = params.counters.decode_sum(counters)
    assert trained == 40 and rec["clipped_fraction"] == clipped / 40
    assert rec["loss"] == (loss - 40 * LOSS_OFFSET) / LOSS_SCALE / 40
    c0 = torch.from_numpy(arrays["C"])
    expected = c0 + mean.reshape(c0.shape)
    got = runs.load_checkpoint(tmp_path / "fl")["global"]["C"]
    # Equal to the fixed-point precision (a float32 ulp in local training can move one ring
    # unit per client); including the dropped users' inputs would be far off.
    tol = params.codec.max_decode_error(60) / len(survivors)
    assert float((got - expected).abs().max()) <= tol
    everyone = np.zeros_like(total)
    for sid in range(60):
        everyone += inputs[sid]
    everyone &= np.uint64((1 << bits) - 1)
    wrong = c0 + (
        torch.from_numpy(params.codec.decode_sum(everyone[: agg.dim])).float() / 60
    ).reshape(c0.shape)
    assert float((got - wrong).abs().max()) > 100 * tol
    assert transport.dead == {101}


def test_keys_ahead_make_every_later_round_two_exchanges(tmp_path):
    cfg = _cfg(rounds=3, eval_every=3)
    ref = train(cfg, out=tmp_path / "ref")
    res, transport = _run(cfg, tmp_path)
    stages = [s for s, *_ in transport.seen if s != "hello"]
    # round 1: train (advertise), share (+ masked), unmask (+ round 2's keys); rounds 2 and
    # 3: train (keys in, shares and masked inputs out), unmask; then the secure evaluation
    # round: evaluate (advertise), share (+ masked), unmask
    assert stages.count("share") == 6  # one reply per node, round 1 and the evaluation
    assert stages.count("train") == stages.count("evaluate") * 3 == 9
    assert stages.count("unmask") == 12
    assert "masked" not in stages
    assert [m.get("flower_share_seconds") is not None for m in res.metrics] == [True, False, False]
    for a, b in zip(ref.metrics, res.metrics, strict=True):  # the same rounds as in process
        assert a["contributors"] == b["contributors"] == 60
        for key in METRICS:
            if key in a:
                assert b[key] == pytest.approx(a[key], abs=_metric_tol(key)), key


def test_keys_ahead_ride_on_the_evaluation_rounds_unmask(tmp_path):
    # Evaluation after every round: the secure evaluation round's unmask announces the next
    # training round (the nodes keep one round session), which is then two exchanges.
    cfg = _cfg(rounds=3, eval_every=1)
    ref = train(cfg, out=tmp_path / "ref")
    res, transport = _run(cfg, tmp_path)
    stages = [s for s, *_ in transport.seen if s != "hello"]
    # per node: round 1 train, share, unmask; each evaluation: evaluate, share, unmask;
    # rounds 2 and 3: train, unmask
    assert stages.count("train") == stages.count("evaluate") == 9
    assert stages.count("share") == 3 * (1 + 3)
    assert stages.count("unmask") == 3 * (3 + 3)
    assert "masked" not in stages
    assert [m.get("flower_share_seconds") is not None for m in res.metrics] == [True, False, False]
    for a, b in zip(ref.metrics, res.metrics, strict=True):
        assert a["contributors"] == b["contributors"] == 60
        assert b["eval_users"] == 60
        for key in METRICS:
            if key in a:
                assert b[key] == pytest.approx(a[key], abs=_metric_tol(key)), key


def test_keys_ahead_reach_a_node_with_no_users_in_this_round(tmp_path):
    # Cohorts of 4 of 60 users on 3 nodes: some node holds nobody in one round and somebody in
    # the next, so the announcement reaches it without a round session of its own.
    # (No DP: under user-level DP a cohort is Poisson or everyone; keys ahead are the same.)
    cfg = _cfg(rounds=4, eval_every=4, clients_per_round=4, seed=1, privacy=_SECAGG_ONLY)
    split = load_split(cfg)
    cohorts = [
        set(
            (round_cohort(cfg.cohort(60), 60, seed=cfg.seed, round_index=r, secure=False) % 3)
            .unique()
            .tolist()
        )
        for r in range(4)
    ]
    assert split.n_users == 60
    assert any(cohorts[r + 1] - cohorts[r] for r in range(3))  # the case is exercised
    ref = train(cfg, out=tmp_path / "ref")
    res, transport = _run(cfg, tmp_path, long_lived=True)
    # Round 1 only, then the secure evaluation round's (one reply per node).
    assert [s for s, *_ in transport.seen].count("share") == len(cohorts[0]) + 3
    for a, b in zip(ref.metrics, res.metrics, strict=True):
        assert a["contributors"] == b["contributors"] == 4
        for key in METRICS:
            if key in a:
                assert b[key] == pytest.approx(a[key], abs=_metric_tol(key)), key


def test_a_first_round_without_dropouts_is_three_exchanges(tmp_path):
    cfg = _cfg(rounds=1)
    res, transport = _run(cfg, tmp_path)
    rec = res.metrics[0]
    assert rec["secagg_eager"] is True and rec["secagg_survivors"] == 60
    assert [s for s, *_ in transport.seen if s != "hello"].count("masked") == 0
    assert sorted({s for s, *_ in transport.seen}) == [
        "evaluate",
        "hello",
        "share",
        "train",
        "unmask",
    ]


def test_too_many_dropouts_abort_cleanly_and_spend_nothing(tmp_path):
    cfg = _cfg(rounds=1)
    res, _ = _run(cfg, tmp_path, drop=lambda stage, node, r: stage == "share" and node != 100)
    rec = res.metrics[0]
    assert rec["contributors"] == 0
    # The server stops before asking for unmasking shares: 5 masked inputs cannot carry the
    # noise the round is calibrated for (and fewer than the threshold would reveal nothing).
    assert "fewer than the 57 the noise shares are sized for" in rec["aborted"]
    ledger = runs.load_checkpoint(tmp_path / "fl")["aggregator"]["ledger"]
    assert ledger == []  # nothing released, nothing charged
    init = build_model(cfg, load_split(cfg))
    assert torch.equal(runs.load_checkpoint(tmp_path / "fl")["global"]["C"], init.C)


@pytest.mark.parametrize("eager", [False, True])
def test_tampered_masked_input_is_an_integrity_failure_treated_as_dropout(tmp_path, eager):
    cfg = _cfg(
        rounds=1,
        privacy=PrivacyConfig(secagg=True, epsilon=8.0, secagg_dropout=0.4, replay=True),
    )
    transport = LocalTransport(3, state_dir=tmp_path / "nodes")
    original = transport.exchange

    def corrupt(masked: bytes) -> bytes:
        raw = bytearray(masked)
        raw[-1] ^= 1  # one flipped bit in the masked vector is still a valid message...
        raw[20] ^= 0xFF  # ...but a corrupted header is not
        return bytes(raw)

    def tamper(stage, messages, *, timeout):
        replies = original(stage, messages, timeout=timeout)
        if stage == ("share" if eager else "masked") and 102 in replies:
            cfgrec = replies[102].config
            key = sorted(cfgrec)[0]
            if eager:  # the masked input travels after the shares in the same value
                shares, masked = split_messages(cfgrec[key])
                cfgrec[key] = join_messages(shares, corrupt(masked))
            else:
                cfgrec[key] = corrupt(cfgrec[key])
        return replies

    transport.exchange = tamper  # type: ignore[method-assign]
    settings = ServerSettings(eager_masking=eager)
    res = FederatedServer(
        cfg, run_dir=tmp_path / "fl", transport=transport, settings=settings
    ).run()
    rec = res.metrics[0]
    assert rec["secagg_survivors"] == 59  # the tampered user dropped, the round completed
    # eager: its shares were refused with its input, so it left the graph before anyone
    # needed its mask key (and the masked stage ran as the fallback)
    assert rec["secagg_dropped"] == (0 if eager else 1)
    assert rec["secagg_eager"] is False


def test_server_never_receives_an_unmasked_input(tmp_path):
    cfg = _cfg(rounds=1)
    res, transport = _run(cfg, tmp_path)
    inputs, params, agg, _ = _replay_ring(cfg, tmp_path)
    bits = params.codec.modulus_bits
    dtype = ring_dtype(bits)
    body = wire.packed_bytes(inputs[0].size, bits)
    split = load_split(cfg)
    evaluation = evaluation_parameters(agg, split.n_users, full=True)
    eval_body = wire.packed_bytes(evaluation.counters.width, EVAL_RING_BITS)
    masked, eval_masked = {}, {}
    evaluating = False  # the secure evaluation round follows the training round
    for stage, _node, reply in transport.seen:
        assert not reply.arrays, f"a node sent arrays at stage {stage}"
        # Training counters and evaluation hits ride in masked inputs: no metric in the clear.
        assert not reply.metrics, stage
        evaluating = evaluating or stage == "evaluate"
        for key, value in reply.config.items():
            assert key.startswith("sid.") or stage == "hello", key
            if stage == "share":  # eager masking: each user's masked input follows its shares
                _, y = split_messages(value)
                if evaluating:
                    eval_masked[int(key[4:])] = wire.unpack_ring(
                        y[-eval_body:], EVAL_RING_BITS, evaluation.counters.width
                    )
                else:
                    masked[int(key[4:])] = wire.unpack_ring(y[-body:], bits, inputs[0].size)
    assert len(masked) == len(eval_masked) == 60
    for sid, y in masked.items():
        x = inputs[sid].astype(dtype)
        assert np.mean(y == x) < 0.01  # masked: agrees with the input only by chance
        # The training counters too (the user's loss and clip flag; a few ring elements, any
        # one equal by chance with probability 2^-bits).
        assert (y[agg.dim :] != x[agg.dim :]).all()
    # A user's evaluation input is 1, its hits (0/1) and NDCGs (< 2^17); masked, each of its
    # 48-bit elements is below 2^17 with probability 2^-31.
    assert all(int(y.min()) >= 1 << 17 for y in eval_masked.values())
    assert res.metrics[0]["eval_users"] == 60
    # ...and yet the unmasked sum is exactly the inputs' sum (the round did complete).
    assert res.metrics[0]["secagg_survivors"] == 60


def test_private_state_persists_and_is_refused_under_another_config(tmp_path):
    cfg = _cfg(rounds=1)
    _run(cfg, tmp_path)
    # The run's own directory; beside it, the node's release count across runs.
    node_dir = tmp_path / "fl-nodes" / "node-0"
    [token_dir] = [d for d in node_dir.iterdir() if d.is_dir()]
    assert (node_dir / "partition-0.user.ledger.json").is_file()
    saved = runs.load_state(token_dir / "partition-0.pt")
    assert saved["trained_rounds"] == 1
    assert saved["users"].tolist() == list(range(0, 60, 3))
    restarted = NodeRuntime(
        cfg,
        run_token=token_dir.name,
        partition_id=0,
        num_partitions=3,
        state_dir=tmp_path / "fl-nodes" / "node-0",
    )
    assert torch.equal(restarted.model.D[saved["users"]], saved["private"]["D"])
    other = _cfg(rounds=1, seed=5)
    with pytest.raises(ConfigError, match="another config"):
        NodeRuntime(
            other,
            run_token=token_dir.name,
            partition_id=0,
            num_partitions=3,
            state_dir=tmp_path / "fl-nodes" / "node-0",
        )


def test_session_store_refuses_foreign_objects():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with pytest.raises(IntegrityError):
        NodeSession.thaw(pickle.dumps(Evil()))
    with pytest.raises(IntegrityError):
        NodeSession.thaw(b"not a pickle")
    assert SESSION_KEY


def test_flower_run_requires_secure_aggregation(tmp_path):
    with pytest.raises(ConfigError, match="--secagg"):
        FederatedServer(
            _cfg(privacy=PrivacyConfig(epsilon=8.0)),
            run_dir=tmp_path / "x",
            transport=LocalTransport(1, state_dir=tmp_path / "n"),
        )
    with pytest.raises(ConfigError, match="simulate"):
        FederatedServer(
            _cfg(privacy=PrivacyConfig(secagg=True, secagg_simulate_dropout=0.1)),
            run_dir=tmp_path / "y",
            transport=LocalTransport(1, state_dir=tmp_path / "n"),
        )


def test_cli_writes_the_flower_app_and_refuses_a_config_without_secagg(tmp_path):
    import typer
    from typer.testing import CliRunner

    from securefed.cli.flower import flower_app

    root = typer.Typer()
    root.add_typer(flower_app, name="flower")
    good = tmp_path / "good.toml"
    good.write_text("rounds = 2\n[privacy]\nsecagg = true\nepsilon = 8.0\n")
    bad = tmp_path / "bad.toml"
    bad.write_text("rounds = 2\n")
    runner = CliRunner()
    res = runner.invoke(
        root, ["flower", "app", str(tmp_path / "app"), "--config", str(good), "--out", "r"]
    )
    assert res.exit_code == 0, res.output
    text = (tmp_path / "app" / "pyproject.toml").read_text()
    assert 'serverapp = "securefed.flower.apps:server_app"' in text
    assert str(good.resolve()) in text
    res = runner.invoke(
        root, ["flower", "app", str(tmp_path / "app2"), "--config", str(bad), "--out", "r"]
    )
    assert res.exit_code == 2 and "--secagg" in res.output


@pytest.mark.parametrize(
    ("command", "runner_name"), [("simulate", "run_simulation"), ("local", "run_local_deployment")]
)
def test_cli_deploy_commands_pass_their_options_and_report_errors_in_one_line(
    tmp_path, monkeypatch, command, runner_name
):
    import typer
    from typer.testing import CliRunner

    from securefed.cli.flower import flower_app
    from securefed.errors import ConfigError
    from securefed.flower import deploy as deploy_module

    calls = []

    def fake(cfg, *, run_dir, nodes, work_dir, stage_timeout, **security):
        calls.append((cfg, nodes, stage_timeout))
        assert callable(security.pop("progress"))  # a line per round as the server writes it
        insecure.append(security)
        raise ConfigError(f"stopped before deploying ({runner_name})")

    insecure: list[dict] = []

    monkeypatch.setattr(deploy_module, runner_name, fake)
    root = typer.Typer()
    root.add_typer(flower_app, name="flower")
    good = tmp_path / "good.toml"
    good.write_text("rounds = 2\n[privacy]\nsecagg = true\nepsilon = 8.0\n")
    args = ["flower", command, "--config", str(good), "--nodes", "4", "--rounds", "3"]
    args += ["--synthetic-users", "50", "--stage-timeout", "7", "--out", str(tmp_path / "r")]
    args += ["--work-dir", str(tmp_path / "w")]
    args += ["--dataset", "synthetic", "--data-dir", str(tmp_path / "data")]
    res = CliRunner().invoke(root, args)
    assert res.exit_code == 2, res.output
    assert f"stopped before deploying ({runner_name})" in res.output
    assert "Traceback" not in res.output
    first = res.output
    [(cfg, nodes, stage_timeout)] = calls
    assert (cfg.rounds, cfg.synthetic_users, nodes, stage_timeout) == (3, 50, 4, 7.0)
    assert cfg.privacy.secagg and cfg.privacy.epsilon == 8.0
    assert (cfg.dataset, cfg.data_dir) == ("synthetic", str(tmp_path / "data"))
    # Refused before Flower starts: a catalogue too small to evaluate, more nodes than users.
    for bad, what in (
        (["--synthetic-items", "90"], "--synthetic-items"),
        (["--nodes", "1000"], "--nodes must be between 1 and the"),
    ):
        res = CliRunner().invoke(root, [*args, *bad])
        assert res.exit_code == 2 and what in res.output.replace("\n", ""), res.output
        assert len(calls) == 1  # the runner was not called again
    if command == "simulate":
        assert insecure == [{"resume": False}]
        return
    # Issue 16 item 2: TLS + SuperNode authentication unless --insecure, which is labelled.
    # Issue 16 item 1: one long-lived ClientApp process per node unless asked otherwise.
    assert insecure == [{"insecure": False, "isolation": "process", "resume": False}]
    assert "TLS" in first and "debugging only" not in first
    res = CliRunner().invoke(root, [*args, "--insecure"])
    assert res.exit_code == 2 and insecure[-1]["insecure"] is True
    text = " ".join(res.output.split())
    assert "WARNING: --insecure is for debugging only: no TLS and no SuperNode" in text
    res = CliRunner().invoke(root, [*args, "--isolation", "subprocess"])
    assert res.exit_code == 2 and insecure[-1]["isolation"] == "subprocess"
    # A bad --isolation is refused before the deployment's banner (found in a walkthrough).
    calls = len(insecure)
    res = CliRunner().invoke(root, [*args, "--isolation", "foo"])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "isolation must be one of process, subprocess" in text
    assert "logs in" not in text and len(insecure) == calls


def test_flower_init_writes_a_config_the_deploy_commands_take(tmp_path, monkeypatch):
    """Issue 18 point 5: nothing but the README's commands; the file is a complete config."""
    import typer
    from typer.testing import CliRunner

    from securefed.cli.flower import flower_app
    from securefed.config import load_config_file
    from securefed.flower import deploy as deploy_module

    root = typer.Typer()
    root.add_typer(flower_app, name="flower")
    path = tmp_path / "run.toml"
    res = CliRunner().invoke(root, ["flower", "init", str(path), "--model", "fedrap"])
    assert res.exit_code == 0, res.output
    assert f"--config {path}" in res.output.replace("\n", "")
    cfg = TrainConfig.from_dict(load_config_file(path))
    assert cfg.model == "fedrap" and cfg.privacy.secagg
    assert cfg == TrainConfig(model="fedrap", privacy=PrivacyConfig(secagg=True))
    before = path.read_bytes()
    again = CliRunner().invoke(root, ["flower", "init", str(path)])
    assert again.exit_code == 2 and "exists" in again.output
    assert path.read_bytes() == before
    calls = []

    def fake(cfg, *, run_dir, nodes, work_dir, stage_timeout, **_):
        calls.append(cfg)
        raise ConfigError("stopped before deploying")

    monkeypatch.setattr(deploy_module, "run_local_deployment", fake)
    res = CliRunner().invoke(root, ["flower", "local", "--config", str(path)])
    assert "stopped before deploying" in res.output
    assert calls == [cfg]


def test_secure_mode_trains_own_users_only_with_os_randomness(tmp_path):
    # A DP run (no replay, the default): nothing is replayed; each node plans, rounds and
    # noises only its own users, and the round's public seed comes from the OS, not the seed.
    cfg = _cfg(privacy=PrivacyConfig(secagg=True, epsilon=8.0))
    transport = LocalTransport(3, state_dir=tmp_path / "nodes")
    sent = []
    original = transport.exchange

    def spy(stage, messages, *, timeout):
        sent.extend((stage, p.config) for p in messages.values())
        return original(stage, messages, timeout=timeout)

    transport.exchange = spy  # type: ignore[method-assign]
    res = FederatedServer(cfg, run_dir=tmp_path / "fl", transport=transport).run()
    assert [m["contributors"] for m in res.metrics] == [60, 60]
    assert len(runs.load_checkpoint(tmp_path / "fl")["aggregator"]["ledger"]) == 2
    seeds = {c["public-seed"] for stage, c in sent if stage == "train"}
    seeded = public_seed(
        build_aggregator(_cfg(), load_split(cfg), build_model(cfg, load_split(cfg))), 0
    )
    assert len(seeds) == 2 and seeded not in seeds


@pytest.mark.parametrize("model", ["fedrecgel", "fedrap"])
def test_node_encodes_an_update_concentrated_on_one_coordinate(model):
    # A user's whole clipped update on one coordinate: its rounded value alone exceeds the
    # bound on one noise share, so the node must check its input against the bound of a
    # whole input (update plus share), as the in-process round does. It checked the share's
    # bound, and FedRecGEL's nodes failed every round of a deployment on MovieLens 100K.
    cfg = _cfg(model=model, synthetic_users=300, client_fraction=1.0)
    split = load_split(cfg)
    model_obj = build_model(cfg, split)
    agg = build_aggregator(cfg, split, model_obj)
    m = 300  # shares sized for 285 of 300 clients: a share's bound < C * scale
    vectors = torch.zeros(m, agg.dim)
    vectors[:, 0] = agg.clip
    updates = DenseUpdates(clients=torch.arange(m), vectors=vectors, layout=model_obj.layout)
    params = round_parameters(agg, m)
    codec = params.codec
    assert agg.clip * codec.scale > codec.extra_int_bound  # the case the test is about
    ring = encode_updates(agg, updates, round_index=0, params=params)
    total = np.zeros(params.width(agg.dim), dtype=np.uint64)
    for row in ring:
        total = codec.add(total, row)
    trained, clipped, *_ = params.counters.decode_sum(total[agg.dim :])
    assert (trained, clipped) == (m, 0)
    total = total[: agg.dim]
    decoded = codec.decode_sum(total)
    noise = (
        6 * agg.discrete_noise(m).plan.share_sigma * np.sqrt(m) / codec.scale
    )  # 6 sd of m shares
    assert abs(decoded[0] - m * agg.clip) <= noise + codec.max_decode_error(m) + 2 * m / codec.scale


def test_secure_rounds_refuse_fewer_survivors_than_their_noise_is_sized_for():
    # Malicious-mode clients check the survivor set against SecAggConfig.min_survivors: in a
    # DP run it is the distributed noise's floor, which can pass the graph's own (30 clients
    # at 5 %: 29 noise shares, the graph designed for 2 dropouts).
    cfg = _cfg(privacy=PrivacyConfig(secagg=True, epsilon=8.0, secagg_mode="malicious"))
    split = load_split(cfg)
    agg = build_aggregator(cfg, split, build_model(cfg, split))
    for m in (30, 60):
        params = round_parameters(agg, m)
        assert params.secagg.min_survivors == agg.discrete_noise(m).plan.min_survivors
    assert round_parameters(agg, 30).secagg.min_survivors == 29 > 30 - 2


def test_a_node_zeroes_a_null_users_upload_as_the_in_process_round_does():
    # The zero-out canaries (Split.null_users) upload zero wherever uploads are clipped; the
    # node's half of the round clipped without them.
    import dataclasses

    cfg = _cfg(privacy=_SECAGG_ONLY)
    split = dataclasses.replace(load_split(cfg), null_users=np.array([3], dtype=np.int64))
    model_obj = build_model(cfg, split)
    agg = build_aggregator(cfg, split, model_obj)
    m = 8
    vectors = torch.full((m, agg.dim), 0.01)
    updates = DenseUpdates(clients=torch.arange(m), vectors=vectors, layout=model_obj.layout)
    ring = encode_updates(agg, updates, round_index=0, params=round_parameters(agg, m))
    assert not ring[3, : agg.dim].any()
    assert all(ring[u, : agg.dim].any() for u in range(m) if u != 3)


@pytest.mark.slow
def test_long_lived_node_keeps_round_secrets_in_memory_and_computes_the_same_run(
    tmp_path, monkeypatch
):
    """Issue 16 item 1: a node served by one long-lived process (securefed.flower.worker)
    builds its runtime (data, model) once and keeps it and the round session as live objects
    in its own memory; the run equals the per-message nodes' (session frozen into
    Context.state, runtime rebuilt per message) and no session bytes reach the transport."""
    from securefed.flower import node as node_module

    built: list[int] = []

    class Counted(node_module.NodeRuntime):
        def __init__(self, *args, **kwargs):
            built.append(kwargs["partition_id"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(node_module, "NodeRuntime", Counted)
    cfg = _cfg(rounds=2, checkpoint_every=2)
    per_message, fresh = _run(cfg, tmp_path, name="per-message")
    per_message_builds, built[:] = len(built), []
    long_lived, kept = _run(cfg, tmp_path, name="long-lived", long_lived=True)
    assert sorted(built) == [0, 1, 2] and per_message_builds > 3 * 2
    for a, b in zip(per_message.metrics, long_lived.metrics, strict=True):
        for key in METRICS:
            if key in a:
                assert b[key] == a[key], key
    # Same messages (SecAgg key pairs are fresh per round, so not the same bytes).
    assert [(s, n, sorted(r.config)) for s, n, r in fresh.seen] == [
        (s, n, sorted(r.config)) for s, n, r in kept.seen
    ]
    assert all(SESSION_KEY in state for state in fresh.states.values())
    assert all(SESSION_KEY not in state for state in kept.states.values())
    assert kept.memories is not None
    for memory in kept.memories.values():
        assert memory.sessions == {}  # dropped after the last unmask: no secret outlives it
        assert memory.runtime.trained_rounds == 2


def test_joined_messages_split_back_and_malformed_ones_are_refused():
    assert split_messages(join_messages(b"shares", b"masked")) == (b"shares", b"masked")
    assert split_messages(join_messages(b"", b"x")) == (b"", b"x")
    for bad in (b"", b"\x00\x00\x01", (7).to_bytes(4, "big") + b"short"):
        with pytest.raises(IntegrityError):
            split_messages(bad)


def test_the_round_fingerprint_carries_the_noise_share():
    """Shares are sized for each round's own cohort since protocol 6: the fingerprint a node
    checks before any secret carries the share's scale, so a node that would size its shares
    otherwise (an older version: for the expected cohort) is refused even where bits, n, k
    and t agree (the review found 11 of 13 cohort sizes that agreed)."""
    import dataclasses

    cfg = _cfg(synthetic_users=300, client_fraction=0.3)
    split = load_split(cfg)
    agg = build_aggregator(cfg, split, build_model(cfg, split))
    params = round_parameters(agg, 60)
    assert params.share_sigma == agg.discrete_noise(60).plan.share_sigma
    assert f";share={params.share_sigma!r};" in params.fingerprint()
    older = dataclasses.replace(params, share_sigma=agg.discrete_noise(90).plan.share_sigma)
    assert older.fingerprint() != params.fingerprint()
    plain = _cfg(privacy=PrivacyConfig(secagg=True))
    split = load_split(plain)
    agg = build_aggregator(plain, split, build_model(plain, split))
    assert ";share=none;" in round_parameters(agg, 60).fingerprint()


@pytest.mark.parametrize("model", ["fedrap", "fedrecgel"])
def test_interaction_dp_never_trains_without_dp_sgd_on_a_node(tmp_path, model):
    """Found in review: with --privacy-unit interaction and --replay-from-seed a node replayed
    the in-process plan, which is the non-private one: its uploads equalled a non-private
    run's while the server's ledger counted DP-SGD releases (printed epsilon ~1, no noise)."""
    from securefed.flower.server import check_config
    from securefed.training import build_model, load_split

    privacy = PrivacyConfig(epsilon=1.0, privacy_unit="interaction", replay=True, secagg=True)
    cfg = TrainConfig(model=model, synthetic_users=60, synthetic_items=400, privacy=privacy)
    with pytest.raises(ConfigError, match="interaction-level DP on Flower"):
        check_config(cfg)
    split = load_split(cfg)
    dp_model = build_model(cfg, split)
    assert dp_model.dpsgd is not None
    cohort = torch.arange(20)
    with pytest.raises(ConfigError, match="cannot replay"):
        models.train_own(
            model, dp_model, cohort, cohort[:10], 0, torch.Generator().manual_seed(0), replay=True
        )
    # Without replay the node runs DP-SGD on its own users: a dense, noised upload.
    updates, _, _ = models.train_own(
        model, dp_model, cohort, cohort[:10], 0, torch.Generator().manual_seed(0), replay=False
    )
    assert isinstance(updates, DenseUpdates)


def test_a_node_rounds_its_secure_inputs_from_the_os_in_a_dp_run(tmp_path):
    """Found in review: a node's plain-codec stochastic rounding (interaction-level DP under
    secure aggregation, where no discrete noise rounds the inputs) drew from the run seed's
    stream in user order, the pattern the in-process engine had OS-seeded."""
    from securefed.training import build_aggregator, build_model, load_split

    privacy = PrivacyConfig(epsilon=1.0, privacy_unit="interaction", secagg=True)
    cfg = TrainConfig(model="fedrap", synthetic_users=60, synthetic_items=400, privacy=privacy)
    split = load_split(cfg)
    model = build_model(cfg, split)
    agg = build_aggregator(cfg, split, model)
    assert agg.secure and agg.discrete_noise(20) is None
    cohort = torch.arange(20)
    updates, _, _ = models.train_own(
        "fedrap", model, cohort, cohort[:10], 0, torch.Generator().manual_seed(0), replay=False
    )
    params = round_parameters(agg, 20)
    a = encode_updates(agg, updates, round_index=0, params=params)
    b = encode_updates(agg, updates, round_index=0, params=params)
    assert not np.array_equal(a, b)


def test_a_node_refuses_a_secure_round_below_the_minimum(tmp_path):
    """An honest server aborts a round of fewer clients than the settings need (10 with noise
    shares at the defaults); a node asked for one anyway refuses it as a protocol violation
    before any key or share exists (it raised ConfigError from the noise plan before)."""
    from protocols.errors import ProtocolError

    cfg = _cfg(rounds=1)
    runtime = NodeRuntime(
        cfg, run_token="t", partition_id=0, num_partitions=1, state_dir=tmp_path / "node"
    )
    arrays, scalars = models.global_payload(cfg.model, build_model(cfg, runtime.split))
    task = TrainTask(
        round_index=0,
        cohort=torch.arange(9),
        public_seed=public_seed(runtime.aggregator, 0),
        fingerprint="whatever the server says",
        aggregate=True,
    )
    with pytest.raises(ProtocolError, match="secure round of 9 clients, fewer than the 10"):
        runtime.train(task, arrays, scalars)
    assert len(runtime.releases.ledger) == 0  # nothing charged


def test_a_model_a_node_cannot_replay_is_refused_before_the_run(monkeypatch):
    """Found in a walkthrough: a fourth model without plan_round / train_subset ran on Flower,
    every node's worker failed, every round was aborted and the run exited 0 with the
    untrained model's metrics. A run that replays (no DP, or --replay-from-seed) is refused."""
    import dataclasses
    import sys
    import types

    from securefed.flower.server import check_config
    from securefed.models import registry
    from securefed.models.mostpop import MostPop

    class NoReplay(MostPop):
        plan_round = None  # what a model written for in-process training only lacks

    module = types.ModuleType("_noreplay_model")
    module.SPEC = dataclasses.replace(registry.get_spec("mostpop"), name="noreplay", build=NoReplay)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "_noreplay_model", module)
    monkeypatch.setitem(registry._MODULES, "noreplay", "_noreplay_model")
    monkeypatch.setattr(registry, "_CACHE", dict(registry._CACHE))  # restored afterwards
    assert registry.get_spec("mostpop").replays_on_nodes
    assert not registry.get_spec("noreplay").replays_on_nodes
    small = {"synthetic_users": 60, "synthetic_items": 400}
    for privacy, how in (
        (PrivacyConfig(secagg=True), "without DP"),
        (PrivacyConfig(secagg=True, epsilon=2.0, replay=True), "with --replay-from-seed"),
    ):
        with pytest.raises(ConfigError, match=f"model noreplay cannot run on Flower {how}"):
            check_config(TrainConfig(model="noreplay", privacy=privacy, **small))
    # A DP run from OS randomness trains each node's users with client_round: any model.
    check_config(
        TrainConfig(model="noreplay", privacy=PrivacyConfig(secagg=True, epsilon=2.0), **small)
    )


def test_a_flower_run_checkpoints_every_round_unless_told_otherwise(tmp_path, monkeypatch):
    """Found in a walkthrough: a 4-round `flower local` run stopped after round 2 had no
    checkpoint (every 10 rounds), resumed from round 0, spent its budget on re-running the
    counted rounds and released a 1-round model. A Flower run checkpoints every round unless
    its config gives a cadence (the Python API's TrainConfig too: found in review, a default
    written into the file at 10 was no longer 'not given'); in process the default stays 10."""
    from securefed.config import DEFAULT_CHECKPOINT_EVERY, FLOWER_CHECKPOINT_EVERY

    assert (DEFAULT_CHECKPOINT_EVERY, FLOWER_CHECKPOINT_EVERY) == (10, 1)
    unset = TrainConfig(rounds=4)
    assert unset.checkpoint_every is None and "checkpoint_every" not in runs.dumps_toml(
        unset.to_dict()
    )
    assert unset.resolved_checkpoint_every() == 10
    assert unset.resolved_checkpoint_every(flower=True) == 1
    given = TrainConfig(rounds=4, checkpoint_every=3)
    assert given.resolved_checkpoint_every() == given.resolved_checkpoint_every(flower=True) == 3
    with pytest.raises(ConfigError, match="checkpoint every must be a positive integer"):
        TrainConfig(checkpoint_every=0)

    saved: list[int] = []
    real = runs.save_checkpoint

    def counted(run_dir, state):
        saved.append(int(state["round"]))
        return real(run_dir, state)

    monkeypatch.setattr(runs, "save_checkpoint", counted)
    cfg = TrainConfig(
        model="fedrap",
        rounds=3,
        synthetic_users=60,
        synthetic_items=400,
        privacy=PrivacyConfig(secagg=True),
    )
    FederatedServer(
        cfg, run_dir=tmp_path / "fl", transport=LocalTransport(2, state_dir=tmp_path / "n")
    ).run()
    assert saved == [1, 2, 3]
    # Each node keeps its snapshots of the two newest checkpoint rounds it trained past.
    snaps = sorted(p.name.split(".at-")[1] for p in (tmp_path / "n").rglob("partition-0.at-*.pt"))
    assert snaps == ["1.pt", "2.pt"]


def test_a_worker_started_with_sigint_ignored_still_stops_with_its_supernode(tmp_path):
    """Found in a walkthrough: a worker started in the background by a script (SIGINT
    inherited as ignored) outlived its killed SuperNode, holding the node's round secrets:
    Flower's parent monitor stops it with SIGINT."""
    import subprocess
    import sys
    import textwrap

    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    script = textwrap.dedent(
        f"""
        import signal, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job of a script
        from securefed.flower.worker import stop_with
        stop_with({parent.pid})
        print("watching", flush=True)
        try:
            for _ in range(200):  # a worker wakes at least every poll (0.1 s) to ask for tasks
                time.sleep(0.1)
            print("outlived its parent")
        except KeyboardInterrupt:
            print("stopped with its parent")
        """
    )
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "watching"
        parent.kill()
        parent.wait()  # reaped: its pid is gone, as a SuperNode's is once its launcher reaps it
        out, _ = worker.communicate(timeout=60)
    finally:
        parent.kill()
        worker.kill()
    assert out.strip() == "stopped with its parent"


@pytest.mark.parametrize("value", ["0.2s", "10", "0", "nan"])
def test_a_bad_idle_poll_is_one_line_not_a_traceback(value, capsys):
    """Found in a walkthrough: `--idle-poll 0.2s` and `--idle-poll 10` were ValueError
    tracebacks from securefed's SuperNode wrapper."""
    from securefed.flower.supernode import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--idle-poll", value, "--insecure"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith("error: --idle-poll takes seconds in (0, 3]") and "Traceback" not in err


def test_the_server_app_logs_each_round_and_why_a_run_stopped(tmp_path):
    """Found in a deployment walkthrough: `flwr run --stream` showed no round, and a run
    stopped by the nodes' budget ended as Flower's 'completed' with its reason only in
    summary.json."""
    import logging

    from flwr.common.logger import FLOWER_LOGGER

    from securefed.flower.apps import log_outcome, log_round
    from securefed.training import RoundRecord

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(f"{record.levelname} {record.getMessage()}")

    handler = Keep()
    FLOWER_LOGGER.addHandler(handler)
    try:
        log_round(
            RoundRecord(
                {"round": 2, "loss": 0.5, "contributors": 120, "participants": 134,
                 "epsilon": 3.21, "val_hr@10": 0.3},
                warning="the loss grew",
            )
        )  # fmt: skip
        log_round(RoundRecord({"round": 3, "loss": float("nan"), "participants": 5,
                               "contributors": 0, "aborted": "too few users"}))  # fmt: skip
        log_outcome(
            {
                "rounds": 3,
                "rounds_planned": 4,
                "epsilon": 7.7,
                "stopped": "refused beyond the budget",
            },
            tmp_path,
        )
    finally:
        FLOWER_LOGGER.removeHandler(handler)
    assert seen[:3] == [
        "INFO securefed: round 2, loss 0.5, 120 of 134 users summed, epsilon 3.210, "
        "validation HR@10 0.3000",
        "WARNING securefed: the loss grew",
        "INFO securefed: round 3, 0 of 5 users summed, aborted: too few users",
    ]
    assert seen[3].startswith("INFO securefed: 3 of 4 rounds, epsilon 7.700; results in ")
    assert "securefed flower yardsticks" in seen[3]
    assert seen[4] == "WARNING securefed: stopped early: refused beyond the budget"
