"""MostPop (federated, secure, DP), the centralized references and the baselines in summaries."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from typer.testing import CliRunner

from securefed.baselines import baseline_metrics, random_metrics, verdict
from securefed.cli import app
from securefed.config import PrivacyConfig, TrainConfig
from securefed.errors import ConfigError
from securefed.evaluation import evaluate_splits
from securefed.models.mostpop import (
    CountScorer,
    MostPop,
    MostPopConfig,
    bounded_pairs,
    dp_popularity_counts,
    popularity_counts,
)
from securefed.training import load_split, train

runner = CliRunner()
SMALL = dict(synthetic_users=60, synthetic_items=400)


def test_federated_count_equals_the_training_counts(small_split):
    m = MostPop(small_split, MostPopConfig(), generator=torch.Generator())
    up, _ = m.client_round(torch.arange(small_split.n_users), 0, torch.Generator())
    total = up.weighted_sum(torch.ones(len(up)))
    assert torch.equal(total, popularity_counts(small_split))
    torch.testing.assert_close(up.dense().sum(0), total)
    torch.testing.assert_close(up.norms() ** 2, up.dense().double().square().sum(1))


def test_secagg_count_equals_the_plain_count_exactly(tmp_path):
    plain = train(TrainConfig(model="mostpop", **SMALL), out=tmp_path / "p")
    sec = train(
        TrainConfig(model="mostpop", privacy=PrivacyConfig(secagg=True), **SMALL),
        out=tmp_path / "s",
    )
    assert sec.summary["secagg"] is True
    assert torch.equal(sec.model.counts, plain.model.counts)
    assert torch.equal(plain.model.counts, popularity_counts(plain.split))


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 30), min_size=1, max_size=12),
    k=st.integers(1, 10),
    seed=st.integers(0, 2**31),
)
def test_contribution_bound_never_exceeds_k(sizes, k, seed):
    local = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    items = torch.cat([torch.randperm(40)[:s] for s in sizes]) if sum(sizes) else local
    kept_local, kept_items = bounded_pairs(
        local, items, len(sizes), k, torch.Generator().manual_seed(seed)
    )
    per_client = torch.bincount(kept_local, minlength=len(sizes))
    assert torch.all(per_client == torch.clamp(torch.tensor(sizes), max=k))
    for c in range(len(sizes)):  # kept items are the client's own, without repeats
        mine = set(items[local == c].tolist())
        kept = kept_items[kept_local == c].tolist()
        assert set(kept) <= mine and len(set(kept)) == len(kept)


def test_dp_run_bounds_items_and_records_the_release(tmp_path):
    res = train(
        TrainConfig(model="mostpop", privacy=PrivacyConfig(epsilon=2.0), **SMALL),
        out=tmp_path / "r",
    )
    cfg = res.run_dir / "config.toml"
    assert "max_items = 20" in cfg.read_text()
    ledger = json.loads((res.run_dir / "privacy_ledger.json").read_text())
    assert len(ledger["events"]) == 1 and res.summary["epsilon"] <= 2.0
    assert res.summary["clip"] == pytest.approx(math.sqrt(20))


@pytest.mark.statistical
def test_dp_count_noise_has_the_calibrated_variance(small_split):
    """Noise = released - bounded count; its variance is (sigma sqrt(k))^2. Chi-square test on
    n = 60 items x 40 draws at false-failure rate 1e-6; the same test rejects a std off by 10%."""
    sigma, k = 1.7, 3
    std = sigma * math.sqrt(k)
    residuals = []
    for s in range(40):
        gen = torch.Generator().manual_seed(s)
        released = dp_popularity_counts(
            small_split, noise_multiplier=sigma, max_items=k, generator=gen
        )
        gen = torch.Generator().manual_seed(s)  # the same sample of items, drawn first
        users = torch.arange(small_split.n_users)
        from securefed.models.mostpop import _train_pairs

        local, items = _train_pairs(small_split, users)
        _, kept = bounded_pairs(local, items, small_split.n_users, k, gen)
        exact = torch.bincount(kept, minlength=small_split.n_items).double()
        residuals.append(released.double() - exact)
    r = torch.cat(residuals).numpy()
    dof = r.size
    alpha = 1e-6
    lo, hi = stats.chi2.ppf(alpha / 2, dof), stats.chi2.ppf(1 - alpha / 2, dof)

    def accepts(assumed_std: float) -> bool:
        stat = float(np.sum((r / assumed_std) ** 2))
        return lo <= stat <= hi

    assert accepts(std)
    assert not accepts(std * 1.1) and not accepts(std / 1.1)  # power


def test_random_baseline_is_exact(small_split):
    r = random_metrics(small_split)
    assert r["test_hr@10"] == pytest.approx(10 / 21)  # 20 negatives + the target
    # Full ranking against a uniformly random scorer, averaged over many draws.
    gen = torch.Generator().manual_seed(0)

    class Random:
        def score(self, users, items):
            return torch.rand(items.shape, generator=gen)

        def score_all(self, users):
            return torch.rand(users.shape[0], small_split.n_items, generator=gen)

    hits = [
        evaluate_splits(Random(), small_split, which=("test",))["test"].full_hr for _ in range(300)
    ]
    assert np.mean(hits) == pytest.approx(r["test_full_hr@10"], abs=0.01)


def test_summary_has_baselines_and_says_when_a_run_is_below(tmp_path):
    res = train(TrainConfig(model="mostpop", **SMALL), out=tmp_path / "m")
    s = json.loads((tmp_path / "m" / "summary.json").read_text())
    for key in (
        "baseline_random_test_hr@10",
        "baseline_mostpop_test_hr@10",
        "baseline_mostpop_test_full_hr@10",
        "lift_over_mostpop_test_hr@10",
    ):
        assert key in s
    assert s["lift_over_mostpop_test_hr@10"] == pytest.approx(1.0)  # it is MostPop
    assert "baseline_dp_mostpop_test_hr@10" not in s
    below = verdict(
        {"test_hr@10": 0.05, "test_full_hr@10": 0.001, **baseline_metrics(res.split, seed=0)}
    )
    assert any(line.startswith("BELOW random") for line in below)
    assert any(line.startswith("BELOW MostPop") for line in below)


def test_dp_summary_carries_dp_mostpop_at_the_runs_epsilon(tmp_path):
    res = train(
        TrainConfig(model="fedals", rounds=1, privacy=PrivacyConfig(epsilon=3.0), **SMALL),
        out=tmp_path / "d",
    )
    s = res.summary
    assert s["baseline_dp_mostpop_epsilon"] == 3.0
    assert s["baseline_dp_mostpop_max_items"] == 20
    assert 0 <= s["baseline_dp_mostpop_test_hr@10"] <= 1


@pytest.mark.parametrize("model", ["ease", "ials"])
@pytest.mark.parametrize("flag", [["--epsilon", "2"], ["--secagg"], ["--client-fraction", "0.5"]])
def test_centralized_references_refuse_federated_defenses(tmp_path, model, flag):
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--model", model, *flag, "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert "centralized" in res.output.lower() and "Traceback" not in res.output
    assert not out.exists()
    with pytest.raises(ConfigError, match="CENTRALIZED|centralized"):
        TrainConfig(model=model, privacy=PrivacyConfig(secagg=True))


def test_centralized_references_are_labelled_and_reproduce_the_issue_table(shared_data, tmp_path):
    """The issue's table on ML-100K (seed 0): MostPop 0.404 / 0.084, EASE 0.649 / 0.138,
    iALS 0.666 / 0.139 (sampled / full test HR@10), each within 0.01."""
    want = {"mostpop": (0.404, 0.084), "ease": (0.649, 0.138), "ials": (0.666, 0.139)}
    for model, (hr, full) in want.items():
        res = train(
            TrainConfig(model=model, dataset="ml-100k", data_dir=str(shared_data)),
            out=tmp_path / model,
        )
        s = res.summary
        assert s["role"] == {"mostpop": "baseline"}.get(model, "centralized")
        assert abs(s["test_hr@10"] - hr) <= 0.01 and abs(s["test_full_hr@10"] - full) <= 0.01
    out = runner.invoke(
        app,
        [
            "train",
            "--model",
            "ease",
            "--dataset",
            "ml-100k",
            "--data-dir",
            str(shared_data),
            "--out",
            str(tmp_path / "cli"),
        ],
    )
    assert out.exit_code == 0 and "CENTRALIZED reference" in out.output


def test_every_model_sees_the_same_split(shared_data):
    """FilmTrust has users with 3-4 ratings: one minimum for every model."""
    splits = [
        load_split(TrainConfig(model=m, dataset="filmtrust", data_dir=str(shared_data)))
        for m in ("fedrap", "fedrecgel", "fedals", "mostpop")
    ]
    for other in splits[1:]:
        assert other.n_users == splits[0].n_users
        assert np.array_equal(other.test_items, splits[0].test_items)
        assert np.array_equal(other.test_negatives, splits[0].test_negatives)


def test_count_scorer_ranks_by_count(small_split):
    counts = popularity_counts(small_split)
    res = evaluate_splits(CountScorer(counts), small_split, which=("test",))["test"]
    assert 0 <= res.hr <= 1


def _sample(model, users, seed=0):
    plan = model.plan_round(users, torch.Generator().manual_seed(seed))
    return plan.pair_client, plan.pair_item


@pytest.mark.parametrize("replay", [False, True])
def test_a_private_count_samples_its_items_from_the_os_unless_it_replays(small_split, replay):
    """Found in review (2026-12-06): the k items each user counts were drawn from one stream
    derived from the recorded run seed, in user order, so removing a user shifted every later
    user's sample; for a known seed the count's sensitivity was ~13 sqrt(k). Under DP without
    replay the sample now comes from the OS (two plans with the same generator differ; the
    sampling is still k of the user's own items), with replay from the generator as before."""
    from securefed.models.registry import get_spec

    privacy = PrivacyConfig(epsilon=2.0, replay=replay)
    spec = get_spec("mostpop")
    params = spec.resolve_params(MostPopConfig(max_items=3, os_sampling=replay), privacy)
    assert params.os_sampling is (not replay)  # set by the run, whatever was given
    model = MostPop(small_split, params, generator=torch.Generator())
    users = torch.arange(small_split.n_users)
    (c1, i1), (c2, i2) = _sample(model, users), _sample(model, users)
    sizes = torch.from_numpy(small_split.train_indptr).diff()
    for c in (c1, c2):
        assert torch.equal(torch.bincount(c, minlength=small_split.n_users), sizes.clamp(max=3))
    same = torch.equal(c1, c2) and torch.equal(i1, i2)
    assert same is replay
    # without replay, one user's sample no longer depends on the users before it: the
    # second half of the users drawn alone is distributed as in the whole run (OS keys)
    if replay:
        half = users[users.shape[0] // 2 :]
        alone = _sample(model, half)[1]
        whole = i1[torch.isin(c1, torch.arange(users.shape[0] // 2, users.shape[0]))]
        assert not torch.equal(alone, whole)  # the seeded stream shifts: why replay is no DP


def test_fedals_count_items_and_the_sampled_prior_follow_the_run(small_split):
    from securefed.models.fedals import FedALSConfig
    from securefed.models.registry import get_spec
    from securefed.prior import prior_updates

    spec = get_spec("fedals")
    dp = PrivacyConfig(epsilon=2.0)
    assert spec.resolve_params(FedALSConfig(count_items=3), dp).os_sampling is True
    replay = PrivacyConfig(epsilon=2.0, replay=True)
    assert spec.resolve_params(FedALSConfig(count_items=3), replay).os_sampling is False
    a = prior_updates(small_split, max_items=3, seed=0, weighting="sample")
    b = prior_updates(small_split, max_items=3, seed=0, weighting="sample")
    assert not torch.equal(a.pair_item, b.pair_item)  # secure by default
    a = prior_updates(small_split, max_items=3, seed=0, weighting="sample", secure=False)
    b = prior_updates(small_split, max_items=3, seed=0, weighting="sample", secure=False)
    assert torch.equal(a.pair_item, b.pair_item)


def test_under_user_level_dp_a_cohort_is_poisson_or_everyone(tmp_path):
    """Found in review (2026-12-06): a fixed-size cohort was accounted as full participation
    at sensitivity one clip, but adding a user can push another out of it (two clips; one
    release at p = B / N = 0.5 is epsilon 3.5 where 2 was printed). Under user-level DP an
    explicit fixed-size cohort is refused with one line, and FedRecGEL's fixed 10 % default
    becomes Poisson at the same expected size; without DP both stay fixed."""
    dp = PrivacyConfig(epsilon=2.0, accountant="rdp")
    with pytest.raises(ConfigError, match="--client-fraction 0.333"):
        TrainConfig(model="mostpop", privacy=dp, clients_per_round=20).cohort(60)
    res = runner.invoke(
        app,
        [
            "train",
            "--model",
            "mostpop",
            "--epsilon",
            "2",
            "--clients-per-round",
            "20",
            "--synthetic-users",
            "60",
            "--synthetic-items",
            "400",
            "--out",
            str(tmp_path / "r"),
        ],
    )
    assert res.exit_code == 2 and "fixed-size cohort" in res.output
    assert not (tmp_path / "r" / "summary.json").exists()
    default = TrainConfig(model="fedrecgel", privacy=dp).cohort(943)
    assert default.kind == "poisson" and default.fraction == pytest.approx(94 / 943)
    assert TrainConfig(model="fedrecgel").cohort(943).kind == "fixed"
    assert TrainConfig(model="mostpop", clients_per_round=20).cohort(60).kind == "fixed"
    interaction = PrivacyConfig(epsilon=2.0, privacy_unit="interaction")
    assert TrainConfig(model="fedrecgel", privacy=interaction).cohort(943).kind == "fixed"


def test_a_below_verdict_never_prints_two_equal_numbers() -> None:
    """Found in a walkthrough: 'BELOW random scores: full HR@10 0.0064 < 0.0064'."""
    from securefed.baselines import verdict

    summary = {
        "test_hr@10": 0.5,
        "test_full_hr@10": 0.00636,
        "baseline_random_test_hr@10": 0.1,
        "baseline_random_test_full_hr@10": 0.00644,
        "baseline_mostpop_test_hr@10": 0.51234,
        "baseline_mostpop_test_full_hr@10": 0.001,
    }
    assert verdict(summary) == [
        "BELOW random scores: full HR@10 0.00636 < 0.00644",
        "BELOW MostPop (an item count): sampled HR@10 0.5000 < 0.5123",
    ]


def test_the_model_a_run_keeps_is_compared_when_another_round_is_reported(capfd):
    """FedRAP, 40 rounds on MovieLens 100K, reported round 7 (sampled HR@10 0.175) and kept
    round 40 in model.pt at 0.018, below random scores, with nothing said but the number
    (found in a walkthrough): the summary and the printed result say it."""
    import types

    from securefed.cli.common import _print_summary
    from securefed.training import _note_released

    summary = {
        "model": "fedrap",
        "dataset": "ml-100k",
        "rounds": 40,
        "seconds": 1.0,
        "selected_round": 7,
        "select_on": "sampled",
        "test_hr@10": 0.175,
        "final_test_hr@10": 0.018,
        "final_test_full_hr@10": 0.001,
        "baseline_random_test_hr@10": 0.1,
        "baseline_random_test_full_hr@10": 0.006,
        "baseline_mostpop_test_hr@10": 0.4,
        "baseline_mostpop_test_full_hr@10": 0.084,
        "verdict": ["BELOW MostPop (an item count): sampled HR@10 0.175 < 0.400"],
    }
    kept = dict(summary)
    _note_released(kept, kept=True)
    [below_random, below_mostpop] = kept["released_verdict"]
    assert below_random.startswith("the last round (40), which model.pt keeps, is BELOW random")
    assert "sampled HR@10 0.0180 < 0.1000" in below_random and "MostPop" in below_mostpop
    _print_summary(types.SimpleNamespace(summary=kept, run_dir="runs/x"))
    assert "which model.pt keeps, is BELOW random" in " ".join(capfd.readouterr().err.split())
    for changed, why in (
        ({}, "no model.pt"),
        ({"selected_round": 40}, "the last round is reported"),
        ({"final_test_hr@10": 0.5, "final_test_full_hr@10": 0.2}, "above the yardsticks"),
        ({"verdict": ["NOT COMPARED with the yardsticks: ..."]}, "not compared"),
        ({"final_round": 39}, "the last round was not evaluated (found in review)"),
    ):
        other = {**summary, **changed}
        _note_released(other, kept=bool(changed))
        assert "released_verdict" not in other, why


def test_a_one_round_run_reports_no_choice(capfd):
    """MostPop's one round was 'reported round 1 (best validation HR@10) ... a choice made on
    the clear validation data, outside the epsilon' (found in a walkthrough): one round is
    no choice."""
    import types

    from securefed.cli.common import _print_summary

    summary = {"model": "mostpop", "dataset": "ml-100k", "rounds": 1, "seconds": 1.0}
    summary |= {"selected_round": 1, "select_on": "sampled", "epsilon": 2.0, "delta": 1e-5}
    summary |= {"noise_multiplier": 2.0, "privacy_unit": "user", "test_hr@10": 0.4, "clip": 4.5}
    _print_summary(types.SimpleNamespace(summary=summary, run_dir="runs/x"))
    out = " ".join(capfd.readouterr().out.split())
    assert "reported round 1 (the only round: no choice)" in out
    assert "a choice made on the clear validation data" not in out
