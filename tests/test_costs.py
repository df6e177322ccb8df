"""Stated costs before a run (issue 17, issue 18): the memory formula against the tensors a
model really holds, the refusal of a run that cannot fit, the estimate recorded in the run
directory, and its update from measured rounds."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from typer.testing import CliRunner

from securefed.cli import app
from securefed.config import PrivacyConfig, TrainConfig
from securefed.costs import (
    CostEstimate,
    InsufficientMemory,
    RunShape,
    check_memory,
    estimate_run,
    state_bytes,
    state_bytes_of,
    streamed_secagg,
)
from securefed.models.registry import get_spec, model_names
from securefed.training import build_model

runner = CliRunner()


def _config(model: str, **params: object) -> TrainConfig:
    spec = get_spec(model)
    return TrainConfig(model=model, params=dataclasses.replace(spec.params(), **params))


@pytest.mark.parametrize(
    ("model", "params"),
    [
        ("fedrap", {}),
        ("fedrap", {"dim": 7}),
        ("fedrecgel", {}),
        ("fedrecgel", {"gmf_dim": 5, "mlp_dim": 12, "layers": (24, 10, 6)}),
        ("fedals", {}),
        ("fedals", {"private": True, "private_dim": 6, "count_only": True}),
        ("mostpop", {}),
        ("ease", {}),
        ("ials", {"dim": 9}),
    ],
)
def test_state_formula_is_exactly_the_bytes_of_the_state_dict(small_split, model, params):
    cfg = _config(model, **params)
    built = build_model(cfg, small_split)
    assert state_bytes(model, cfg.params, RunShape.of(small_split)) == state_bytes_of(
        built.state_dict()
    )


@pytest.mark.parametrize("gram_items", [None, 9])
def test_private_fedals_state_formula_is_the_state_its_rounds_build(
    small_split, small_split_data, tmp_path, gram_items
):
    """Private fedals's co-occurrence rounds add the sum of their releases (float64, one entry
    per item pair) to the state: the formula is the state the run checkpoints, not the fresh
    model's (a checkpoint of 758 kB was estimated at 132 kB on MovieLens 100K)."""
    from securefed.training import train

    params = dataclasses.replace(
        get_spec("fedals").params(),
        private=True,
        private_dim=6,
        gram_items=gram_items,
        count_only=False,  # 40 users: the count-only rule would release no pairs
    )
    cfg = TrainConfig(
        model="fedals",
        params=params,
        rounds=3,
        privacy=PrivacyConfig(noise_multiplier=0.5),
        keep_private_state=True,
        **small_split_data,
    )
    fresh = build_model(cfg, small_split)
    result = train(cfg, out=tmp_path / "run", split=small_split)
    model = result.model
    shape = RunShape.of(small_split)
    built = state_bytes_of(model.state_dict())
    assert model.gram >= 2 and "cooc_sum" in built
    assert state_bytes("fedals", model.config, shape) == built
    # The fresh model holds all of it but the releases' sum, which the estimate adds.
    assert {**state_bytes_of(fresh.state_dict()), "cooc_sum": built["cooc_sum"]} == built
    est = estimate_run(cfg, shape, speed=1.0, state=state_bytes_of(fresh.state_dict()))
    assert est.state == built
    written = (tmp_path / "run" / "checkpoint.pt").stat().st_size
    assert sum(built.values()) <= written <= est.checkpoint_bytes
    # model.pt holds the shared parameters, not the releases' sum.
    assert est.model_bytes < est.checkpoint_bytes - built["cooc_sum"] // 2


def test_private_fedals_counts_the_pairs_its_co_occurrence_rounds_upload(small_split):
    """The pairs a co-occurrence round uploads are counted from the data (they set the round's
    memory and time: 120 bytes each at the peak)."""
    from securefed.models.fedals import PAIR_BYTES, cooc_pairs, with_population

    params = with_population(
        dataclasses.replace(
            get_spec("fedals").params(), private=True, private_dim=6, count_only=False
        )
    )
    cfg = TrainConfig(model="fedals", params=params, rounds=3)
    model = build_model(cfg, small_split)
    users = torch.arange(small_split.n_users)
    model.apply_aggregate(_aggregate_of(model, model.client_round(users, 0, None)[0]), 0)
    uploads, _ = model.client_round(users, 1, None)  # a co-occurrence round: every item
    shape = RunShape.of(small_split)
    assert model.gram == small_split.n_items
    assert cooc_pairs(params, shape, 1.0) == uploads.cooc_client.numel() > 0
    est = estimate_run(cfg, shape, speed=1.0)
    assert est.memory["round"] >= PAIR_BYTES * uploads.cooc_client.numel()


def _aggregate_of(model, uploads):
    from securefed.federation.base import Aggregate

    total = uploads.weighted_sum(torch.ones(len(uploads)))
    return Aggregate(total=total, contributors=len(uploads), denominator=float(len(uploads)))


#: MovieLens 100K's and the built-in synthetic data's shapes as RunShape.of gives them.
ML100K_SHAPE = RunShape(
    users=943,
    items=1682,
    train_interactions=98_114,
    head_pairs=((400, 4_322_795), (1000, 8_815_346), (1682, 9_853_235)),
)
SYNTHETIC_SHAPE = RunShape(
    users=3000,
    items=1682,
    train_interactions=303_530,
    synthetic=True,
    head_pairs=((400, 7_675_836), (1000, 20_847_622), (1682, 33_294_323)),
)


@pytest.mark.parametrize(("shape", "measured"), [(ML100K_SHAPE, 0.99e9), (SYNTHETIC_SHAPE, 1.43e9)])
def test_private_fedals_peak_memory_is_near_what_its_runs_measured(shape, measured):
    """``securefed train --epsilon 2`` (synthetic) and on MovieLens 100K: peak RSS 1.41-1.45 GB
    and 0.97-1.00 GB measured on 2026-12-07 (979 MB and 621 MB were estimated before the
    co-occurrence pairs were counted); its checkpoint holds the releases' sum (758 kB
    written); its round and full evaluation solve every user's factor."""
    from securefed.models.fedals import ALS_SECONDS

    cfg = TrainConfig(model="fedals", privacy=PrivacyConfig(epsilon=2.0))
    assert cfg.params.private and cfg.rounds == 3
    est = estimate_run(cfg, shape, speed=1.0)
    assert abs(est.peak_memory - measured) <= 0.15 * measured
    assert abs(est.checkpoint_bytes - 758_109) <= 0.05 * 758_109
    solve = ALS_SECONDS * (shape.train_interactions * 16**2 + shape.users * 16**3)
    assert est.full_eval_seconds > solve and est.eval_seconds > solve
    # Two of its three rounds upload the pairs: far above the count round's sweep alone.
    plain = estimate_run(
        dataclasses.replace(cfg, params=dataclasses.replace(cfg.params, count_only=True)),
        shape,
        speed=1.0,
    )
    assert est.round_seconds > 3 * plain.round_seconds


def test_fedals_evaluation_estimate_solves_every_users_factor():
    """Non-private fedals solves every user's factor before it scores (as the private mode
    does): its evaluation was estimated as dot products alone, 0.05 s on MovieLens 100K at
    probe factor 1.0 against 0.14-0.19 s for the solve alone on one thread (2026-12-08, load
    average 5), 0.01-0.02 s for the dot products."""
    from securefed.models.fedals import ALS_SECONDS

    cfg = TrainConfig(model="fedals", rounds=3)
    assert not cfg.params.private
    est = estimate_run(cfg, ML100K_SHAPE, speed=1.0)
    d = 32
    solve = ALS_SECONDS * (ML100K_SHAPE.train_interactions * d**2 + ML100K_SHAPE.users * d**3)
    assert est.full_eval_seconds > solve and est.eval_seconds > solve
    assert est.full_eval_seconds < 4 * solve  # the dot products are the smaller part


def test_a_private_fedals_audit_counts_its_canaries_uploads_every_round(monkeypatch):
    """``securefed audit --dataset ml-100k --epsilon 2``: 615 MB estimated, 2.04-2.30 GB peak
    RSS measured. The canary test reads each canary's upload dense and clipped every round, and
    the audit puts the canaries' items in the co-occurrence set (453,000 floats an upload on
    MovieLens 100K: 0.93 GB for 256 canaries); the recorder's work grows with the rounds and
    the upload's width (about 11 s estimated, 56-95 s measured)."""
    from attacks.audit import (
        _RECORD_S_PER_COORD,
        _check_audit_memory,
        audit_memory_bytes,
        estimate_audit_seconds,
        prepare_audit_config,
    )
    from attacks.canaries import plant_canaries
    from protocols.seeding import numpy_generator
    from securefed import costs
    from securefed.training import load_split

    cfg = TrainConfig(
        model="fedals",
        synthetic_users=50,
        synthetic_items=300,
        rounds=3,
        privacy=PrivacyConfig(epsilon=2.0),
    )
    split, _ = plant_canaries(
        load_split(cfg), 40, numpy_generator(0, "audit-canaries"), items_per_canary=2
    )
    cfg = prepare_audit_config(cfg, 40)  # the canaries' 80 items join the co-occurrence set
    layout = build_model(cfg, split).layout.size  # what each client uploads
    assert layout > split.n_items * 17  # the co-occurrence part over the set and the canaries'
    u, i = split.n_users, split.n_items
    chosen = ["row-change"]
    plain = audit_memory_bytes(chosen, u, i, upload=True)
    arrays = _check_audit_memory(cfg, split, chosen, upload=True, canaries=40, available=2**60)
    assert arrays == plain + 2 * 4 * 40 * layout
    # A refusal says so.
    real = costs.estimate_run
    monkeypatch.setattr(
        costs,
        "estimate_run",
        lambda *a, **k: dataclasses.replace(real(*a, **k), peak_memory=0),
    )
    with pytest.raises(InsufficientMemory, match="the 40 canaries' uploads"):
        _check_audit_memory(cfg, split, chosen, upload=True, canaries=40, available=plain)
    # Every round is recorded: three more rounds, three more rounds of reading the uploads.
    more = dataclasses.replace(cfg, rounds=6)
    kw = dict(canaries=40, canaries_included=True, attacks=chosen)
    three = estimate_audit_seconds(cfg, u, i, 0.0, **kw)
    six = estimate_audit_seconds(more, u, i, 0.0, **kw)
    assert six - three >= 3 * _RECORD_S_PER_COORD * u * layout * 0.99


@pytest.mark.parametrize("unit", ["user", "interaction"])
def test_the_audit_estimate_follows_the_canaries_it_plants(unit):
    """estimate_audit_seconds assumed 256 canaries whatever ``--canaries`` said: an audit
    planting 40 (the split's 40 canary clients counted in) was estimated as if 256 had been
    taken away from its users and each round recorded 256 canaries' uploads."""
    from attacks.audit import DEFAULT_CANARIES, estimate_audit_seconds, replayed_shape

    cfg = TrainConfig(
        model="fedrap", rounds=3, privacy=PrivacyConfig(epsilon=2.0, privacy_unit=unit)
    )
    users, items, t = 300, 500, 10.0

    def est(n):
        return estimate_audit_seconds(cfg, users, items, t, canaries=n, attacks=["row-change"])

    none, few, default, many = est(0), est(40), est(None), est(DEFAULT_CANARIES * 4)
    assert none < few < default < many
    assert default == est(DEFAULT_CANARIES)
    # The audit's own estimate, on the split with its 40 canaries planted, says the same.
    p_users, p_items = replayed_shape(cfg, users, items, 40)
    assert (p_users, p_items) == ((users + 40, items + 40) if unit == "user" else (users, 540))
    replay = t * p_users / users
    planted = estimate_audit_seconds(
        cfg, p_users, p_items, replay, canaries=40, canaries_included=True, attacks=["row-change"]
    )
    assert planted == pytest.approx(few)


def test_a_report_estimates_each_audit_as_the_audit_prepares_the_run():
    """A private fedals cell's audit puts its canaries' items in the co-occurrence set: the
    sweep estimated it without them (29 s at probe x1.0 for a MovieLens 100K cell measured at
    55 s; 54 s with them)."""
    import math

    from attacks.audit import DEFAULT_CANARIES, estimate_audit_seconds, prepare_audit_config
    from securefed.report import ReportConfig, estimate_sweep, plan_cells

    cfg = ReportConfig(
        models=("fedals",), references=(), epsilons=(2.0,), defenses=("dp",), seeds=1,
        dataset="synthetic", synthetic_users=300, synthetic_items=500,
    )  # fmt: skip
    cells, _ = plan_cells(cfg)
    ((name, train_cfg, audited),) = [(c.name, c.train_config(cfg), c.audited) for c in cells]
    assert audited and train_cfg.privacy.dp and not math.isinf(train_cfg.privacy.epsilon)
    sweep = estimate_sweep(cfg, [(name, train_cfg, True)], speed=1.0, check=False)
    prepared = prepare_audit_config(train_cfg, DEFAULT_CANARIES)
    assert prepared.params.gram_audit_items == DEFAULT_CANARIES * 2  # a pair per canary
    run = estimate_run(train_cfg, sweep_shape := _shape_of(train_cfg), speed=1.0)
    want = run.seconds + estimate_audit_seconds(
        prepared,
        sweep_shape.users,
        sweep_shape.items,
        run.seconds,
        full_eval_seconds=run.full_eval_seconds,
    )
    unprepared = run.seconds + estimate_audit_seconds(
        train_cfg,
        sweep_shape.users,
        sweep_shape.items,
        run.seconds,
        full_eval_seconds=run.full_eval_seconds,
    )
    assert sweep.cells[name] == pytest.approx(want)
    assert want > unprepared


def _shape_of(cfg):
    from securefed.training import load_split

    return RunShape.of(load_split(cfg))


def test_every_registered_model_has_a_state_formula(small_split):
    shape = RunShape.of(small_split)
    for model in model_names():
        assert state_bytes(model, get_spec(model).params(), shape), model


def test_fedrap_state_is_users_x_items_x_dim_floats():
    shape = RunShape(users=29_858, items=40_981, train_interactions=860_000)
    cfg = _config("fedrap", views="dense")  # "auto" holds Gowalla's views sparsely
    est = estimate_run(cfg, shape, speed=1.0)
    assert est.state["D"] == 29_858 * 40_981 * 32 * 4
    assert est.peak_memory > est.state["D"]
    # The checkpoint is the state as written, plus a small fixed overhead.
    assert 0 < est.checkpoint_bytes - sum(est.state.values()) <= 64 * 1024


def test_gowalla_fedrap_is_refused_with_a_dim_that_fits():
    shape = RunShape(users=29_858, items=40_981, train_interactions=860_000)
    # Interaction-level DP-SGD keeps the private views dense (tests/test_fedrap_sparse.py:
    # the sparse views' estimates and suggestions).
    cfg = dataclasses.replace(
        _config("fedrap"), privacy=PrivacyConfig(epsilon=2.0, privacy_unit="interaction")
    )
    est = estimate_run(cfg, shape, speed=1.0)
    with pytest.raises(InsufficientMemory) as info:
        check_memory(cfg, est, available=16 * 10**9)
    text = str(info.value)
    assert "\n" not in text
    assert "this run needs about" in text and est.state["D"] == 29_858 * 40_981 * 32 * 4
    dim = int(text.split("--param dim=")[1].split()[0])
    smaller = dataclasses.replace(cfg, params=dataclasses.replace(cfg.params, dim=dim))
    assert estimate_run(smaller, shape, speed=1.0).peak_memory <= 16 * 10**9
    twice = dataclasses.replace(cfg, params=dataclasses.replace(cfg.params, dim=2 * dim))
    assert estimate_run(twice, shape, speed=1.0).peak_memory > 16 * 10**9


def test_secure_aggregation_over_a_large_cohort_suggests_a_client_fraction():
    shape = RunShape(users=29_858, items=40_981, train_interactions=860_000)
    cfg = TrainConfig(model="fedrecgel", client_fraction=1.0, privacy=PrivacyConfig(secagg=True))
    est = estimate_run(cfg, shape, speed=1.0)
    assert est.memory["aggregation"] > est.memory["state"]
    available = est.peak_memory // 4
    with pytest.raises(InsufficientMemory, match=r"--client-fraction (\S+) would fit") as info:
        check_memory(cfg, est, available=available)
    fraction = float(str(info.value).split("--client-fraction ")[1].split()[0])
    fits = dataclasses.replace(cfg, client_fraction=fraction)
    assert estimate_run(fits, shape, speed=1.0).peak_memory <= available


def test_fedrap_secure_rounds_at_gowalla_stream_with_and_without_distributed_dp():
    """FedRAP's uploads stream: a 10 % Gowalla cohort's secure round holds the engine's blocks,
    not the 2,986 x 1.31 M table; with distributed DP also one rounding bit per coordinate;
    fedals streams too; for a model whose uploads do not stream (MostPop) the table is
    counted."""
    from protocols.secagg.batched import STREAM_BLOCK_BYTES

    shape = RunShape(users=29_858, items=40_981, train_interactions=860_000)
    secure = PrivacyConfig(secagg=True)
    cfg = dataclasses.replace(_config("fedrap"), client_fraction=0.1, privacy=secure)
    m, dim = 2_986, 40_981 * 32
    assert streamed_secagg(cfg, m, dim) and not streamed_secagg(cfg, 943, 1682 * 32)
    est = estimate_run(cfg, shape, speed=1.0)
    assert est.memory["aggregation"] <= 4 * 4 * STREAM_BLOCK_BYTES < m * dim * 8
    assert any("streams its 2,986 x 1,311,392 ring inputs" in n for n in est.notes)
    check_memory(cfg, est, available=16 * 10**9)
    ddg = dataclasses.replace(cfg, privacy=PrivacyConfig(secagg=True, epsilon=2.0))
    assert streamed_secagg(ddg, m, dim)
    bits = estimate_run(ddg, shape, speed=1.0).memory["aggregation"] - est.memory["aggregation"]
    assert bits == m * dim // 8
    fedals = TrainConfig(model="fedals", client_fraction=0.1, privacy=secure)
    assert streamed_secagg(fedals, m, 2_667_861)
    mostpop = TrainConfig(model="mostpop", client_fraction=0.1, privacy=secure)
    assert not streamed_secagg(mostpop, m, 2_667_861)


def test_a_run_that_fits_is_not_refused():
    shape = RunShape(users=943, items=1682, train_interactions=98_114)
    cfg = _config("fedrap")
    est = estimate_run(cfg, shape, speed=1.0)
    check_memory(cfg, est, available=est.peak_memory)
    with pytest.raises(InsufficientMemory):
        check_memory(cfg, est, available=est.peak_memory - 1)


def test_checkpoints_and_evaluations_are_counted_like_the_round_loop():
    shape = RunShape(users=943, items=1682, train_interactions=98_114)
    cfg = TrainConfig(model="fedrecgel", rounds=25, checkpoint_every=10, eval_every=2)
    est = estimate_run(cfg, shape, speed=1.0)
    assert est.checkpoints == 3  # rounds 10, 20 and the last (25)
    assert est.evaluations == 13  # 2, 4, ..., 24 and 25
    assert est.full_evaluations == 3  # 10, 20 (evaluated and full) and 25
    resumed = estimate_run(cfg, shape, speed=1.0, start_round=20)
    assert (resumed.rounds, resumed.checkpoints, resumed.evaluations) == (5, 1, 3)


def test_round_counts_are_closed_form_and_equal_the_round_loop():
    """The evaluation, full-ranking and checkpoint counts equal the round loop's on every
    small case, and ``--rounds 1000000000`` is estimated at once (a loop over the rounds hung
    ``securefed train`` before it printed anything)."""
    import time

    from securefed.costs import _count, _count_both

    def loop(start: int, rounds: int, every: int, other: int) -> tuple[int, int]:
        hit = [r for r in range(start + 1, rounds + 1) if r % every == 0 or r == rounds]
        both = [r for r in hit if r % other == 0 or r == rounds]
        return len(hit), len(both)

    for rounds in range(0, 40):
        for start in range(0, rounds + 2):
            for every in range(1, 9):
                for other in range(1, 9):
                    want = loop(start, rounds, every, other)
                    got = (_count(start, rounds, every), _count_both(start, rounds, every, other))
                    assert got == want, (start, rounds, every, other)
    shape = RunShape(users=943, items=1682, train_interactions=98_114)
    cfg = TrainConfig(model="fedrecgel", rounds=1_000_000_000, eval_every=3)
    t0 = time.perf_counter()
    est = estimate_run(cfg, shape, speed=1.0)
    assert time.perf_counter() - t0 < 5.0
    # Evaluated every 3rd round, full ranking every 10th (FedRecGEL): every 30th, and the last.
    assert est.evaluations == 333_333_334
    assert est.full_evaluations == 33_333_334
    assert est.checkpoints == 100_000_000


def test_the_estimate_after_round_one_uses_the_measured_rounds():
    shape = RunShape(users=943, items=1682, train_interactions=98_114)
    cfg = TrainConfig(model="fedrap", rounds=10, eval_every=1)
    est = estimate_run(cfg, shape, speed=1.0)
    rec = {"train_seconds": 6.0, "eval_seconds": 0.5, "test_full_hr@10": 0.1}
    one = est.after_rounds([rec], done=1)
    assert one.rounds == 9 and one.round_seconds == 6.0
    assert one.seconds == pytest.approx(9 * 6.0 + 9 * 0.5)
    # Round 1 carried torch.compile: from round 2 on, the warm rounds set the rate.
    two = est.after_rounds([rec, {**rec, "train_seconds": 1.0}], done=2)
    assert two.round_seconds == 1.0
    assert two.seconds == pytest.approx(8 * 1.0 + 8 * 0.5)
    assert isinstance(two, CostEstimate)


def test_a_run_that_cannot_fit_is_refused_in_one_line_with_nothing_written(tmp_path):
    run = tmp_path / "run"
    res = runner.invoke(
        app,
        [
            "train",
            "--model",
            "fedrap",
            "--synthetic-users",
            "200",
            "--synthetic-items",
            "500",
            "--param",
            "dim=1000000",
            "--rounds",
            "1",
            "--out",
            str(run),
        ],
    )
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1, res.output
    assert lines[0].startswith("error: this run needs about ")
    assert "available" in lines[0] and "--param dim=" in lines[0]
    assert "Traceback" not in res.output
    assert not run.exists()


def test_a_refusal_prints_its_brackets(monkeypatch):
    """Refusals are text, not console markup: "[clients x d]" was printed as nothing."""
    # The streamed secure round's blocks (2.1 GB) dominate; 1.5 GB is available.
    monkeypatch.setattr("securefed.costs._available_for", lambda device: 1_500_000_000)
    res = runner.invoke(
        app,
        [
            "train",
            "--model",
            "fedals",
            "--synthetic-users",
            "3000",
            "--synthetic-items",
            "20000",
            "--secagg",
            "--client-fraction",
            "1",
            "--rounds",
            "1",
        ],
    )
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert "secure aggregation's [clients x d] inputs" in text
    # fedals's dim is resolved from the catalogue (it used to crash on dim=None here), and a
    # fedals user is not told to choose fedals.
    assert "run without --secagg" in text and "fedals or fedrecgel" not in text


def test_a_loaded_dataset_too_large_for_memory_is_refused_before_the_model(tmp_path, monkeypatch):
    # A real file (not synthetic): the check runs after loading, before the model is built.
    rows = [(u, (u * 7 + k) % 200) for u in range(30) for k in range(8)]
    csv = tmp_path / "plays.csv"
    csv.write_text("user,item\n" + "".join(f"{u},{i}\n" for u, i in rows))
    monkeypatch.setattr("securefed.costs.available_memory", lambda: 100 * 2**20)
    built = []
    monkeypatch.setattr("securefed.training.build_model", lambda *a, **k: built.append(1))
    run = tmp_path / "run"
    res = runner.invoke(
        app, ["train", "--model", "fedrap", "--dataset", str(csv), "--out", str(run)]
    )
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "104.9 MB is available" in errors[0], res.output
    assert not built and not run.exists()


def _plays_csv(tmp_path):
    rows = [(u, (u * 7 + k) % 200) for u in range(30) for k in range(8)]
    csv = tmp_path / "plays.csv"
    csv.write_text("user,item\n" + "".join(f"{u},{i}\n" for u, i in rows))
    return csv


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_run_whose_disk_does_not_fit_is_refused_in_one_line_with_nothing_written(
    tmp_path, monkeypatch, dry_run
):
    """--rounds 300000000 printed "disk 307.2 GB" with 71 GB free and started training."""
    csv = _plays_csv(tmp_path)
    asked = []

    def free(directory):
        asked.append(directory)
        return 70 * 10**9

    monkeypatch.setattr("securefed.costs._free_disk_for", free)
    built = []
    monkeypatch.setattr("securefed.training.build_model", lambda *a, **k: built.append(1))
    run = tmp_path / "deep" / "run"
    args = ["train", "--dataset", str(csv), "--rounds", "300000000", "--out", str(run)]
    res = runner.invoke(app, args + (["--dry-run"] if dry_run else []))
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.output
    text = errors[0]
    assert "this run needs about 307.2 GB of disk at its largest" in text
    assert f"70.0 GB is free on the file system holding {tmp_path}" in text
    # The suggestion fits: the metrics of fewer rounds.
    rounds = int(text.split("--rounds ")[1].split()[0])
    assert 0 < rounds < 300_000_000
    shape = RunShape(users=30, items=200, train_interactions=1)
    cfg = TrainConfig(model="fedals", rounds=rounds)
    assert estimate_run(cfg, shape, speed=1.0).disk_peak <= 70 * 10**9
    assert asked == [tmp_path]  # the nearest existing folder of --out
    assert not built and not run.exists() and not (tmp_path / "deep").exists()
    assert "Traceback" not in res.output


def test_a_run_that_fits_the_free_disk_is_not_refused(monkeypatch):
    from securefed.costs import InsufficientDisk, check_disk

    shape = RunShape(users=943, items=1682, train_interactions=98_114)
    cfg = TrainConfig(model="fedals", rounds=20)
    est = estimate_run(cfg, shape, speed=1.0)
    check_disk(cfg, est, "runs", free=est.disk_peak)
    with pytest.raises(InsufficientDisk, match="choose an --out on a file system"):
        # Its checkpoint, not its metrics, dominates: fewer rounds would not fit.
        check_disk(cfg, est, "runs", free=est.checkpoint_bytes)


def test_a_resumed_run_is_not_told_to_use_flags_it_cannot_take(tmp_path):
    """The disk refusal of ``--resume`` advised "--rounds N" or "choose an --out", both
    refused with --resume (found in review): a resumed run is told config.toml's rounds or to
    free space."""
    from securefed.costs import InsufficientDisk, check_disk

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('model = "fedals"\n')
    shape = RunShape(users=30, items=200, train_interactions=1)
    cfg = TrainConfig(model="fedals", rounds=300_000_000)
    est = estimate_run(cfg, shape, speed=1.0)
    with pytest.raises(InsufficientDisk) as err:
        check_disk(cfg, est, run, free=70 * 10**9)
    text = str(err.value)
    assert f"in {run / 'config.toml'} would fit" in text and "rounds = " in text
    assert "--rounds" not in text and "--out" not in text
    big = TrainConfig(model="fedals", rounds=20)
    est = estimate_run(big, RunShape(users=943, items=1682, train_interactions=98_114), speed=1.0)
    with pytest.raises(InsufficientDisk, match="free space on that file system, then resume"):
        check_disk(big, est, run, free=est.checkpoint_bytes - 40)


def test_python_callers_get_the_disk_refusal_before_the_model(
    small_split, small_split_data, tmp_path, monkeypatch
):
    import functools

    from securefed.costs import InsufficientDisk, refuse_if_too_large
    from securefed.training import train

    monkeypatch.setattr("securefed.costs._free_disk_for", lambda directory: 1000)
    run = tmp_path / "run"
    with pytest.raises(InsufficientDisk, match="1.0 kB is free on the file system holding"):
        train(
            TrainConfig(model="fedals", rounds=1, **small_split_data),
            out=run,
            split=small_split,
            before_build=functools.partial(refuse_if_too_large, run_dir=run),
        )
    assert not run.exists()


def test_the_estimate_is_printed_before_round_one_and_recorded(tmp_path):
    run = tmp_path / "run"
    res = runner.invoke(
        app,
        [
            "train",
            "--model",
            "fedals",
            "--synthetic-users",
            "60",
            "--synthetic-items",
            "400",
            "--rounds",
            "3",
            "--out",
            str(run),
        ],
    )
    assert res.exit_code == 0, res.output
    text = res.output
    assert text.index("estimate: peak memory") < text.index("round 1/3")
    assert text.index("round 1/3") < text.index("estimate after round 1:") < text.index("round 2/3")
    record = json.loads((run / "estimate.json").read_text())
    before = record["before_run"]
    assert before["model"] == "fedals" and before["rounds"] == 3
    assert before["shape"]["users"] == 60
    items = before["shape"]["items"]
    assert before["state"] == {"V": items * 32 * 4, "prior": items * 4, "head": items}
    assert record["after_round_1"]["rounds"] == 2
    measured = record["measured"]
    assert measured["rounds"] == 3 and measured["peak_rss_bytes"] > 0
    # The checkpoint as written while the run trained; the finished run has removed it.
    assert 0 < measured["checkpoint_bytes"] - sum(before["state"].values()) <= 64 * 1024
    assert not (run / "checkpoint.pt").exists()


def test_report_states_its_cost_and_prints_a_line_per_cell_when_not_a_terminal(tmp_path):
    res = runner.invoke(
        app,
        [
            "report",
            "--models",
            "fedrecgel",
            "--references",
            "ials",
            "--epsilons",
            "inf",
            "--defenses",
            "none",
            "--seeds",
            "1",
            "--rounds",
            "1",
            "--no-audit",
            "--dataset",
            "synthetic",
            "--synthetic-users",
            "60",
            "--synthetic-items",
            "400",
            "--out",
            str(tmp_path / "rep"),
        ],
    )
    assert res.exit_code == 0, res.output
    text = res.output
    assert "report: 2 cells" in text
    estimate = text.index("estimate: 2 cells to run, about ")
    first = text.index("cell 1/2 fedrecgel-none-epsinf-s0 done in ")
    second = text.index("cell 2/2 ials-centralized-s0 done in ")
    assert estimate < first < second
    assert "left)" in text[first:second]  # the time left after the first cell


def test_a_report_whose_cells_cannot_fit_is_refused_before_any_cell(tmp_path, monkeypatch):
    from securefed.report import ReportConfig, run_report

    monkeypatch.setattr("securefed.costs.available_memory", lambda: 50 * 2**20)
    cfg = ReportConfig(
        models=("fedrecgel",),
        references=(),
        dataset="synthetic",
        synthetic_users=60,
        synthetic_items=400,
        epsilons=(math.inf,),
        defenses=("none",),
        seeds=1,
        rounds=1,
        audit=False,
    )
    with pytest.raises(InsufficientMemory, match="52.4 MB is available"):
        run_report(cfg, out=tmp_path / "rep")
    assert not (tmp_path / "rep" / "cells").exists()


def test_audit_states_its_replay_cost_and_prints_a_line_per_round(tmp_path):
    res = runner.invoke(
        app,
        [
            "audit",
            "--model",
            "fedrap",
            "--synthetic-users",
            "60",
            "--synthetic-items",
            "400",
            "--rounds",
            "2",
            "--attacks",
            "row-change",
            "--canaries",
            "0",
            "--out",
            str(tmp_path / "a"),
        ],
    )
    assert res.exit_code == 0, res.output
    text = res.output
    estimate = text.index("estimate: the audit's replay training ")
    assert estimate < text.index("audit replay round 1/2") < text.index("audit replay round 2/2")


def test_python_callers_get_the_same_refusal_before_the_model(
    small_split, small_split_data, tmp_path, monkeypatch
):
    from securefed.costs import refuse_if_too_large
    from securefed.training import train

    monkeypatch.setattr("securefed.costs.available_memory", lambda: 1)
    with pytest.raises(InsufficientMemory, match="1 B is available"):
        train(
            TrainConfig(model="fedals", rounds=1, **small_split_data),
            out=tmp_path / "run",
            split=small_split,
            before_build=refuse_if_too_large,
        )
    assert not (tmp_path / "run").exists()


def test_available_memory_reads_this_process_cgroup_and_its_ancestors(tmp_path, monkeypatch):
    """The tightest limit from the process's cgroup up to the root counts, less usage beyond
    the reclaimable file cache (a paged run's written-back pages)."""
    from securefed import costs

    def group(name: str, limit: str, usage: int, inactive: int) -> str:
        d = tmp_path / name
        d.mkdir()
        (d / "memory.limit_in_bytes").write_text(limit + "\n")
        (d / "memory.usage_in_bytes").write_text(f"{usage}\n")
        (d / "memory.stat").write_text(f"cache 5\ntotal_inactive_file {inactive}\nrss 7\n")
        return str(d)

    files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    child = group("child", str(4 * 2**30), 3 * 2**30, 2**30)  # 1 GiB free + 1 GiB cache
    root = group("root", str(2**63 - 4096), 2**30, 0)  # no limit
    monkeypatch.setattr(costs, "_cgroup_dirs", lambda: [(child, *files), (root, *files)])
    got = costs.available_memory()
    assert got is not None and got <= 2 * 2**30
    parent = group("parent", str(3 * 2**30), int(2.5 * 2**30), 0)  # tighter: 0.5 GiB
    monkeypatch.setattr(costs, "_cgroup_dirs", lambda: [(child, *files), (parent, *files)])
    assert costs.available_memory() == 2**29
