"""Issue 14: the private popularity prior (securefed.prior) for FedRAP and FedRecGEL.

The prior is one accounted release before any model release, never released twice across a
resume, added to the model's scores exactly as stated, equal under secure aggregation to its
plain sum, and reachable from the CLI."""

from __future__ import annotations

import json
import math
import tomllib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from protocols.dp import PrivacyLedger, calibrate_noise_multiplier
from securefed.cli import app
from securefed.config import PrivacyConfig, TrainConfig
from securefed.errors import ConfigError
from securefed.models.fedrap import FedRAP, FedRAPConfig
from securefed.models.fedrecgel import FedRecGELConfig
from securefed.models.mostpop import MostPopUpdates
from securefed.prior import (
    PopularityPrior,
    PriorScored,
    capped_weights,
    prior_updates,
    sqrt_weights,
)
from securefed.privacy import PrivateAggregator
from securefed.training import train

SMALL = dict(synthetic_users=60, synthetic_items=200, checkpoint_every=1)
FAST_RAP = FedRAPConfig(dim=4, local_epochs=1, compile=False)
FAST_GEL = FedRecGELConfig(gmf_dim=4, mlp_dim=8, layers=(16, 8))
PRIOR_CLIP = math.sqrt(20)
#: Probability that a correct sampler fails the statistical test below.
FALSE_FAILURE = 1e-6
runner = CliRunner()


def _dp(**kw) -> PrivacyConfig:
    # RDP: the PRV accountant takes seconds per sampled ledger, several times a round.
    return PrivacyConfig(
        **{"epsilon": 2.0, "replay": True, "prior_share": 0.8, "accountant": "rdp", **kw}
    )


def _ledger(run) -> list[dict]:
    return json.loads((run / "privacy_ledger.json").read_text())["events"]


def _prior_events(events: list[dict]) -> list[dict]:
    return [e for e in events if math.isclose(e["clip"], PRIOR_CLIP)]


@pytest.mark.slow
def test_prior_is_on_disk_in_the_ledger_before_any_noisy_sum(tmp_path, monkeypatch):
    from protocols.dp import mechanisms

    seen: list[list[float]] = []
    original = mechanisms.CentralGaussian.noise_for_sum

    def spy(self, dim, **kw):
        seen.append([e["clip"] for e in _ledger(tmp_path / "r")])
        return original(self, dim, **kw)

    monkeypatch.setattr(mechanisms.CentralGaussian, "noise_for_sum", spy)
    res = train(
        TrainConfig(
            model="fedrap", params=FAST_RAP, rounds=2, client_fraction=0.5, privacy=_dp(), **SMALL
        ),
        out=tmp_path / "r",
    )
    # The first noisy sum is the prior's, its event alone on disk; each model round's event is
    # on disk before its own noise is drawn.
    assert seen[0] == pytest.approx([PRIOR_CLIP])
    assert seen[1] == pytest.approx([PRIOR_CLIP, 10.0])
    assert seen[2] == pytest.approx([PRIOR_CLIP, 10.0, 10.0])
    events = _ledger(tmp_path / "r")
    assert events[0]["sample_rate"] == 1.0 and events[0]["round"] == 0
    assert events[0]["noise_multiplier"] == res.summary["prior_noise_multiplier"]
    assert [e["sample_rate"] for e in events[1:]] == [0.5, 0.5]
    assert "claimed: Poisson cohorts at rate 0.5" in res.summary["amplification"] or (
        "LABELLED: Poisson cohorts at rate 0.5" in res.summary["amplification"]
    )


def test_budget_split_follows_the_stated_rule_and_never_overspends(tmp_path):
    res = train(
        TrainConfig(model="fedrap", params=FAST_RAP, rounds=3, privacy=_dp(), **SMALL),
        out=tmp_path / "r",
    )
    s = res.summary
    one = calibrate_noise_multiplier(
        epsilon=2.0, delta=1e-5, sample_rate=1.0, steps=1, accountant="rdp"
    )
    assert s["prior_noise_multiplier"] == pytest.approx(one / math.sqrt(0.8))
    assert 2.0 - 0.02 <= s["epsilon"] <= 2.0
    # Without the prior the model's sigma is smaller: the prior took part of the budget.
    alone = train(
        TrainConfig(
            model="fedrap",
            params=FAST_RAP,
            rounds=3,
            privacy=PrivacyConfig(epsilon=2.0, replay=True, accountant="rdp"),
            **SMALL,
        ),
        out=tmp_path / "a",
    )
    assert alone.summary["noise_multiplier"] < s["noise_multiplier"]
    ledger = PrivacyLedger.from_dicts(_ledger(tmp_path / "r"))
    assert ledger.epsilon(1e-5, "rdp") == pytest.approx(s["epsilon"])


@pytest.mark.parametrize("keep_checkpoint", [True, False])
def test_resume_keeps_the_released_prior_and_never_releases_it_again(tmp_path, keep_checkpoint):
    run = tmp_path / "r"
    cfg = TrainConfig(
        model="fedrap",
        params=FAST_RAP,
        rounds=2,
        privacy=_dp(),
        keep_private_state=True,  # to extend the finished run
        **SMALL,
    )
    first = train(cfg, out=run)
    counts = first.model.prior.counts.clone()
    path = run / "config.toml"
    path.write_text(path.read_text().replace("rounds = 2", "rounds = 3"))
    if not keep_checkpoint:  # as if it stopped before its first checkpoint
        (run / "checkpoint.pt").unlink()
        (run / "model.pt").unlink()  # written only by a run that completed
    resumed = train(resume=run)
    assert len(_prior_events(_ledger(run))) == 1
    assert torch.equal(resumed.model.prior.counts, counts)
    assert resumed.model.prior.released


def test_prior_scales_and_the_models_that_use_them(small_split):
    """``linear``: ``max(c, 0) / max c``; ``noise``: ``max(c, 0)`` over the release's noise
    std per count, ``sigma_p sqrt(k)``. Both models' prior modes use ``noise`` (FedRAP's
    log-scale weight reached items of half the top count; FedRecGEL's log scale was below
    the count in FilmTrust's full ranking: docs/privacy.md, "The prior's scale")."""
    from securefed.prior import prior_noise_multiplier, with_prior

    counts = torch.tensor([-2.0, 0.0, 10.0, 20.0, 40.0])
    prior = PopularityPrior(5, weight=1.0, max_items=20, scale="linear")
    prior.install(counts)
    torch.testing.assert_close(prior.scores(), torch.tensor([0.0, 0.0, 0.25, 0.5, 1.0]))
    prior.scale, prior.noise_std = "noise", 4.0
    torch.testing.assert_close(prior.scores(), torch.tensor([0.0, 0.0, 2.5, 5.0, 10.0]))
    with pytest.raises(ConfigError, match="log, linear or noise"):
        PopularityPrior(5, weight=1.0, max_items=20, scale="sqrt")
    scales = {}
    for name in ("fedrap", "fedrecgel"):
        cfg = TrainConfig(model=name, rounds=1, privacy=_dp())
        wrapped = with_prior(cfg, small_split, object())
        scales[name] = (wrapped.prior.scale, wrapped.prior.weight)
        p = cfg.privacy
        sigma_p = prior_noise_multiplier(
            epsilon=p.epsilon, delta=p.delta, share=p.prior_share, accountant=p.accountant
        )
        assert wrapped.prior.noise_std == pytest.approx(sigma_p * math.sqrt(p.prior_items))
    assert scales == {"fedrap": ("noise", 0.3), "fedrecgel": ("noise", 0.3)}


@pytest.mark.parametrize("noise", ["central", "distributed"])
def test_the_scores_read_the_prior_noise_the_aggregator_releases(small_split, noise):
    """The prior's scores divide the counts by the noise std the aggregator releases them
    with: with distributed noise (accounted with RDP) the scores used the PRV sigma instead
    (found in review)."""
    from securefed.prior import with_prior

    privacy = PrivacyConfig(epsilon=2.0, prior_share=0.9, noise=noise)
    cfg = TrainConfig(model="fedrap", rounds=3, privacy=privacy)
    wrapped = with_prior(cfg, small_split, object())
    agg = PrivateAggregator(cfg, small_split, dim=small_split.n_items * 4)
    assert agg.dp is not None and agg.dp.accountant == ("rdp" if noise == "distributed" else "prv")
    assert wrapped.prior.noise_std == pytest.approx(
        agg.prior_noise_multiplier * math.sqrt(privacy.prior_items), rel=1e-9
    )


def test_a_new_run_refuses_a_folder_holding_a_prior_file(tmp_path):
    """A stray ``popularity_prior.pt`` in a new run's folder was loaded as the run's released
    prior with no ledger event (found in review): the folder is refused, untouched."""
    run = tmp_path / "r"
    run.mkdir()
    stray = run / "popularity_prior.pt"
    torch.save({"counts": torch.arange(200.0), "released": True}, stray)
    before = stray.read_bytes()
    cfg = TrainConfig(model="fedrap", params=FAST_RAP, rounds=1, privacy=_dp(), **SMALL)
    with pytest.raises(ConfigError, match="holds popularity_prior.pt, a file a run would read"):
        train(cfg, out=run)
    assert [p.name for p in run.iterdir()] == ["popularity_prior.pt"]
    assert stray.read_bytes() == before


def test_scores_are_model_scores_plus_weight_times_the_prior(small_split):
    model = FedRAP(small_split, FedRAPConfig(dim=4), generator=torch.Generator().manual_seed(0))
    prior = PopularityPrior(small_split.n_items, weight=0.7, max_items=20)
    counts = torch.linspace(-3.0, 40.0, small_split.n_items, dtype=torch.float64)
    prior.install(counts.float())
    wrapped = PriorScored(model, prior)
    expected_p = torch.log1p(counts.float().clamp_min(0)) / math.log1p(40.0)
    users = torch.arange(small_split.n_users)
    items = torch.randint(0, small_split.n_items, (small_split.n_users, 7))
    torch.testing.assert_close(
        wrapped.score(users, items), model.score(users, items) + 0.7 * expected_p[items]
    )
    torch.testing.assert_close(
        wrapped.score_all(users), model.score_all(users) + 0.7 * expected_p.unsqueeze(0)
    )
    # The state carries the prior, and a fresh wrapper scores the same after loading it.
    fresh = PriorScored(
        FedRAP(small_split, FedRAPConfig(dim=4), generator=torch.Generator().manual_seed(5)),
        PopularityPrior(small_split.n_items, weight=0.7, max_items=20),
    )
    fresh.load_state_dict(wrapped.state_dict())
    assert torch.equal(fresh.score_all(users), wrapped.score_all(users))


def test_a_block_scoring_model_keeps_the_prior_in_its_blocks(small_split):
    """FedRecGEL ranks in item blocks; wrapped, its blocks carry the prior too (attribute
    fall-through would hand evaluation the bare model's blocks), and a model without blocks
    stays without them."""
    from securefed.evaluation import evaluate_splits
    from securefed.models.fedrecgel import FedRecGEL, FedRecGELConfig

    config = FedRecGELConfig(gmf_dim=4, mlp_dim=4, layers=(8, 4))
    model = FedRecGEL(small_split, config, generator=torch.Generator().manual_seed(0))
    prior = PopularityPrior(small_split.n_items, weight=5.0, max_items=20)
    prior.install(torch.linspace(-3.0, 40.0, small_split.n_items))
    wrapped = PriorScored(model, prior)
    users = torch.arange(small_split.n_users)
    items = torch.arange(small_split.n_items)
    torch.testing.assert_close(
        wrapped.score_block(users, items), wrapped.score_all(users), rtol=1e-5, atol=1e-5
    )

    class Dense:
        score = wrapped.score
        score_all = wrapped.score_all

    block = evaluate_splits(wrapped, small_split)
    dense = evaluate_splits(Dense(), small_split)
    for w in ("val", "test"):
        assert block[w].full_hr == dense[w].full_hr
        assert block[w].full_ndcg == pytest.approx(dense[w].full_ndcg)
    bare = PriorScored(
        FedRAP(small_split, FedRAPConfig(dim=4), generator=torch.Generator().manual_seed(0)),
        prior,
    )
    assert not hasattr(bare, "score_block")


def test_sampled_prior_updates_bound_every_user_to_k_items(small_split):
    up = prior_updates(small_split, max_items=3, seed=0, weighting="sample")
    per_user = torch.bincount(up.pair_client, minlength=small_split.n_users)
    train_sizes = torch.from_numpy(small_split.train_indptr).diff()
    assert torch.equal(per_user, train_sizes.clamp(max=3))
    assert float(up.norms().max()) <= math.sqrt(3) + 1e-12


def test_sqrt_prior_updates_count_every_item_at_norm_exactly_sqrt_k(small_split):
    k = 3
    up = prior_updates(small_split, max_items=k, seed=0)
    assert isinstance(up, MostPopUpdates) and up.weight is not None
    train_sizes = torch.from_numpy(small_split.train_indptr).diff()
    # Every training item of every user is in its upload, weighted sqrt(k / n_u) ...
    assert torch.equal(torch.bincount(up.pair_client, minlength=small_split.n_users), train_sizes)
    torch.testing.assert_close(
        up.weight, torch.sqrt(k / train_sizes.double())[up.pair_client], rtol=0, atol=1e-15
    )
    # ... so each upload's L2 norm is sqrt(k) (the sensitivity the release is noised for),
    # whether the user has fewer or more than k items.
    assert (train_sizes < k).any() or (train_sizes > k).any()
    torch.testing.assert_close(
        up.norms(), torch.full((small_split.n_users,), math.sqrt(k), dtype=torch.float64)
    )
    dense = up.dense()
    torch.testing.assert_close(dense.double().norm(dim=1), up.norms(), rtol=1e-6, atol=0)
    torch.testing.assert_close(up.weighted_sum(torch.ones(len(up))), dense.sum(0))


@settings(max_examples=50, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=30),
    k=st.integers(min_value=1, max_value=50),
)
def test_sqrt_weights_never_let_a_client_exceed_sqrt_k(sizes, k):
    pair_client = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    w = sqrt_weights(pair_client, len(sizes), k)
    norms = torch.zeros(len(sizes), dtype=torch.float64).index_add_(0, pair_client, w * w).sqrt()
    for n, norm in zip(sizes, norms.tolist(), strict=True):
        assert norm == pytest.approx(math.sqrt(k) if n else 0.0, rel=1e-12, abs=1e-12)
        assert norm <= math.sqrt(k) * (1 + 1e-12)


@pytest.mark.statistical
def test_sqrt_prior_release_is_accounted_then_noised_at_sigma_p_sqrt_k(small_split):
    """One release over 200,000 item coordinates: its noise (released minus the exact weighted
    sum, which no clipping changed) has variance (sigma_p sqrt(k))^2 by a chi-square test with
    false-failure rate 1e-6 (FALSE_FAILURE), and the same test rejects sigma off by 10 %."""
    from scipy import stats

    from securefed.federation.base import UpdateLayout

    n_items, k = 200_000, 20
    cfg = TrainConfig(model="fedrap", rounds=1, privacy=_dp())
    agg = PrivateAggregator(cfg, small_split, dim=small_split.n_items * 4)
    pair_client = torch.tensor([0, 0, 0, 1, 2, 2])
    pair_item = torch.tensor([5, 17, 199_999, 17, 3, 5])
    up = MostPopUpdates(
        clients=torch.arange(3),
        layout=UpdateLayout(names=("counts",), shapes=((n_items,),)),
        pair_client=pair_client,
        pair_item=pair_item,
        weight=sqrt_weights(pair_client, 3, k),
    )
    exact = up.weighted_sum(torch.ones(3)).double()
    released = agg.release_prior(up).double()
    [event] = agg.ledger.to_dicts()
    assert event["clip"] == pytest.approx(math.sqrt(k))
    assert event["noise_multiplier"] == agg.prior_noise_multiplier
    noise = released - exact
    std = agg.prior_noise_multiplier * math.sqrt(k)

    def matches(var: float) -> bool:
        stat = float((noise * noise).sum()) / var
        return bool(
            stats.chi2.ppf(FALSE_FAILURE / 2, n_items)
            <= stat
            <= stats.chi2.isf(FALSE_FAILURE / 2, n_items)
        )

    assert matches(std**2)
    assert not matches((1.1 * std) ** 2) and not matches((0.9 * std) ** 2)


@pytest.mark.parametrize("weighting", ["sample", "sqrt"])
def test_prior_under_secagg_equals_its_plain_sum(small_split, weighting):
    """The secure sum equals the plain one within the fixed-point step, and the server's
    noise (the same replayed draw) is sized for the rounded inputs' bound ``sqrt(k) +
    sqrt(d) / scale`` instead of ``sqrt(k)``."""
    # the same sample in both (a seeded one: this compares the aggregation paths)
    up = prior_updates(small_split, max_items=20, seed=0, weighting=weighting, secure=False)
    exact = up.weighted_sum(torch.ones(len(up))).double()

    def released(secagg: bool) -> tuple[torch.Tensor, list, float]:
        cfg = TrainConfig(
            model="fedrap",
            rounds=1,
            privacy=_dp(secagg=secagg, noise="central" if secagg else None),
        )
        agg = PrivateAggregator(cfg, small_split, dim=small_split.n_items * 4)
        bound = agg.rounded_sensitivity(agg.prior_clip, small_split.n_items)
        return agg.release_prior(up).double(), agg.ledger.to_dicts(), bound / agg.prior_clip

    plain, plain_events, _ = released(False)
    secure, secure_events, ratio = released(True)
    assert ratio > 1
    noise = plain - exact
    # each client's weights are rounded to 2^-16 (16 scale bits), at most 1 step each
    step = 0.0 if weighting == "sample" else small_split.n_users * 2.0**-16
    torch.testing.assert_close(secure - exact, noise * ratio, rtol=0, atol=step + 1e-4)
    assert not torch.equal(noise, torch.zeros_like(noise))
    assert plain_events == secure_events


def test_private_fedrecgel_with_the_prior_trains_end_to_end(tmp_path):
    res = train(
        TrainConfig(
            model="fedrecgel",
            params=FAST_GEL,
            rounds=1,
            privacy=_dp(epsilon=4.0),
            **SMALL,
        ),
        out=tmp_path / "g",
    )
    assert isinstance(res.model, PriorScored) and res.model.prior.released
    assert len(_prior_events(_ledger(tmp_path / "g"))) == 1
    assert res.summary["epsilon"] <= 4.0


def test_without_the_flag_the_model_is_not_wrapped(tmp_path):
    res = train(
        TrainConfig(
            model="fedrap",
            params=FAST_RAP,
            rounds=1,
            privacy=PrivacyConfig(epsilon=2.0, replay=True),
            **SMALL,
        ),
        out=tmp_path / "n",
    )
    assert isinstance(res.model, FedRAP) and "prior_share" not in res.summary
    assert not (tmp_path / "n" / "popularity_prior.pt").exists()


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(prior_share=0.5), "give --epsilon"),
        (dict(epsilon=2.0, prior_share=1.0), "in (0, 1)"),
        (dict(epsilon=2.0, prior_share=0.5, noise_multiplier=1.0), "no --noise-multiplier"),
        (dict(epsilon=2.0, prior_share=0.5, secagg=True), "--noise central"),
        (dict(epsilon=2.0, prior_share=0.5, prior_items=0), "prior items"),
        (dict(epsilon=2.0, prior_share=0.5, prior_weighting="top"), "prior weighting"),
    ],
)
def test_bad_prior_settings_are_one_config_error(kw, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PrivacyConfig(**kw)


def test_a_model_without_a_prior_mode_refuses_it():
    with pytest.raises(ConfigError, match="no popularity-prior mode"):
        TrainConfig(model="fedals", privacy=PrivacyConfig(epsilon=2.0, prior_share=0.5))


def test_cli_trains_fedrap_with_the_private_prior(tmp_path):
    out = tmp_path / "cli"
    res = runner.invoke(
        app,
        [
            "train",
            "--model",
            "fedrap",
            "--epsilon",
            "2",
            "--private-prior",
            "0.8",
            "--accountant",
            "rdp",
            "--prior-weight",
            "2",
            "--rounds",
            "1",
            "--local-epochs",
            "1",
            "--dim",
            "4",
            "--synthetic-users",
            "60",
            "--synthetic-items",
            "200",
            "--replay-from-seed",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["prior_share"] == 0.8 and summary["epsilon"] <= 2.0
    assert "prior_weight = 2.0" in (out / "config.toml").read_text()
    bad = runner.invoke(
        app, ["train", "--model", "fedals", "--epsilon", "2", "--private-prior", "0.5"]
    )
    assert bad.exit_code == 2 and "no popularity-prior mode" in bad.output


BELOW_DP = "BELOW DP-MostPop at the same epsilon: sampled HR@10 0.1000 < 0.4000"


USER = {"privacy_unit": "user", "target_epsilon": 2.0, "placement": "central"}


@pytest.mark.parametrize(
    ("summary", "flags"),
    [
        (
            {**USER, "model": "fedrap"},
            "--epsilon 2 --private-mode (--private-prior 0.9 --rounds 10 ",
        ),
        ({**USER, "model": "fedrecgel"}, "--client-fraction 0.1), no --noise-multiplier"),
        ({**USER, "model": "fedrap", "secagg": True}, "--client-fraction 0.1),"),
        ({**USER, "model": "fedrap", "placement": "distributed"}, "--client-fraction 0.1),"),
    ],
)
def test_a_run_below_dp_mostpop_without_the_prior_is_told_its_flags(summary, flags):
    from securefed.cli.common import private_mode_hint

    hint = private_mode_hint({**summary, "verdict": [BELOW_DP]})
    assert hint is not None and flags in hint


@pytest.mark.parametrize(
    "summary",
    [
        {**USER, "model": "fedrap", "verdict": ["BELOW MostPop (an item count)"]},
        {**USER, "model": "fedrap", "prior_share": 0.9, "verdict": [BELOW_DP]},
        {**USER, "model": "fedrap", "privacy_unit": "interaction", "verdict": [BELOW_DP]},
        {**USER, "model": "fedrap", "target_epsilon": None, "verdict": [BELOW_DP]},
        {**USER, "model": "fedrap", "engine": "flower", "verdict": [BELOW_DP]},
        {
            **USER,
            "model": "fedrap",
            "secagg": True,
            "placement": "distributed",
            "verdict": [BELOW_DP],
        },
        {**USER, "model": "fedals", "verdict": [BELOW_DP]},
        {**USER, "model": "nonesuch", "verdict": [BELOW_DP]},
    ],
)
def test_no_prior_hint_where_it_would_not_apply(summary):
    from securefed.cli.common import private_mode_hint

    assert private_mode_hint(summary) is None


@pytest.mark.parametrize(
    "noise", [[], ["--secagg", "--noise", "central"], ["--noise", "distributed"]]
)
def test_the_hinted_flags_train(tmp_path, noise):
    """The flags the hint gives a run (as if it had ended below the count) train: the private
    mode's settings, beside the noise placement the run had."""
    from securefed.cli.common import private_mode_hint

    base = ["train", "--model", "fedrap", "--local-epochs", "1", "--dim", "4", *noise]
    small = ["--synthetic-users", "200", "--synthetic-items", "200", "--replay-from-seed"]
    plain = runner.invoke(
        app, [*base, *small, "--epsilon", "2", "--rounds", "1", "--out", str(tmp_path / "a")]
    )
    assert plain.exit_code == 0, plain.output
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    hint = private_mode_hint({**summary, "verdict": [BELOW_DP]})
    assert hint is not None
    flags = hint.split("a new run: ", 1)[1].split(" (", 1)[0].split()
    assert flags == ["--epsilon", "2", "--private-mode"]
    res = runner.invoke(app, [*base, *small, *flags, "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    done = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert done["prior_share"] == 0.9 and done["rounds"] == 10 and done["epsilon"] <= 2.0
    assert private_mode_hint({**done, "verdict": [BELOW_DP]}) is None
    cfg = tomllib.loads((tmp_path / "b" / "config.toml").read_text())
    assert cfg["client_fraction"] == 0.1 and cfg["privacy"]["prior_share"] == 0.9


def test_private_mode_is_the_flags_it_stands_for_and_a_given_flag_wins():
    """--private-mode (the library's with_private_mode) sets the registry's private-mode
    fields (the flags it stands for) wherever a flag or the config file did not; a given one
    keeps its value (a cohort size keeps the fraction out, for the accounting's own refusal);
    the mapping it is given is not changed."""
    from securefed import ConfigError, with_private_mode
    from securefed.config import TrainConfig
    from securefed.models.registry import get_spec

    mode = get_spec("fedrap").private_mode
    raw = {"model": "fedrap", "privacy": {"epsilon": 2.0}}
    out = with_private_mode(raw)
    assert raw == {"model": "fedrap", "privacy": {"epsilon": 2.0}}
    fields, privacy_fields = mode.config_fields()
    assert out == {"model": "fedrap", **fields, "privacy": {"epsilon": 2.0, **privacy_fields}}
    cfg = TrainConfig.from_dict(out)
    assert (cfg.rounds, cfg.client_fraction, cfg.privacy.prior_share) == (10, 0.1, 0.9)
    given = {"model": "fedrap", "rounds": 2, "privacy": {"epsilon": 2.0, "prior_share": 0.5}}
    given = with_private_mode(given)
    assert given["rounds"] == 2 and given["privacy"]["prior_share"] == 0.5
    assert given["client_fraction"] == 0.1
    cohort = {"model": "fedrap", "clients_per_round": 30, "privacy": {"epsilon": 2.0}}
    cohort = with_private_mode(cohort)
    assert "client_fraction" not in cohort and cohort["rounds"] == 10
    every = {
        "model": "fedrap",
        "rounds": 3,
        "client_fraction": 0.2,
        "privacy": {"epsilon": 2.0, "prior_share": 0.5},
    }
    with pytest.raises(ConfigError, match="would change nothing"):
        with_private_mode(every)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model", "fedals", "--epsilon", "2"], "fedals's private mode needs no flag"),
        (["--model", "mostpop", "--epsilon", "2"], "mostpop has none (models with one: "),
        (["--model", "ials"], "ials has none (models with one: "),  # fedals's settings, found
        (["--model", "fedrap"], "give --epsilon and no --noise-multiplier"),
        (["--model", "fedrap", "--noise-multiplier", "1"], "give --epsilon and no --noise"),
        (
            ["--model", "fedrap", "--epsilon", "2", "--privacy-unit", "interaction"],
            "user-level mode",
        ),
        (["--epsilon", "2"], "fedals's private mode needs no flag"),
        (["--resume", "runs/none"], "--resume continues a run with its recorded settings"),
        (
            ["--model", "fedrap", "--epsilon", "2", "--secagg", "--noise", "distributed"],
            "with --secagg give --noise central, or drop --private-mode",
        ),
        (
            [
                "--model",
                "fedrap",
                "--epsilon",
                "2",
                "--rounds",
                "3",
                "--client-fraction",
                "0.2",
                "--private-prior",
                "0.5",
            ],
            "--private-mode would change nothing",
        ),
    ],
)
def test_private_mode_is_refused_where_it_does_not_apply(tmp_path, extra, message):
    res = runner.invoke(app, ["train", *extra, "--private-mode", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and message in " ".join(res.output.split())
    assert "Traceback" not in res.output and not (tmp_path / "r").exists()


def test_the_summary_prints_the_hint_below_the_count(capfd):
    import types

    from securefed.cli.common import _print_summary

    summary = {
        "model": "fedrecgel",
        "dataset": "ml-100k",
        "rounds": 3,
        "seconds": 1.0,
        **USER,
        "verdict": [BELOW_DP],
    }
    _print_summary(types.SimpleNamespace(summary=summary, run_dir="runs/x"))
    assert "--private-prior 0.9 --rounds 10" in " ".join(capfd.readouterr().err.split())
    _print_summary(types.SimpleNamespace(summary={**summary, "verdict": []}, run_dir="runs/x"))
    assert "--private-prior" not in capfd.readouterr().err


@settings(max_examples=50, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=200), min_size=1, max_size=30),
    k=st.integers(min_value=1, max_value=50),
    cap=st.integers(min_value=1, max_value=100),
)
def test_capped_weights_are_sqrt_up_to_the_cap_and_share_its_weight_beyond(sizes, k, cap):
    """Up to ``cap`` items a user's weights are sqrt's (norm sqrt(k)); beyond it the user's total
    weight is that of a user with ``cap`` items, sqrt(k cap), and the norm stays below sqrt(k)."""
    pair_client = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    w = capped_weights(pair_client, len(sizes), k, cap)
    zeros = torch.zeros(len(sizes), dtype=torch.float64)
    norms = zeros.clone().index_add_(0, pair_client, w * w).sqrt()
    totals = zeros.clone().index_add_(0, pair_client, w)
    plain = sqrt_weights(pair_client, len(sizes), k)
    for u, n in enumerate(sizes):
        assert norms[u] <= math.sqrt(k) * (1 + 1e-12)
        if 0 < n <= cap:
            torch.testing.assert_close(w[pair_client == u], plain[pair_client == u])
        elif n > cap:
            assert float(totals[u]) == pytest.approx(math.sqrt(k * cap), rel=1e-12)
            assert float(norms[u]) == pytest.approx(math.sqrt(k * cap / n), rel=1e-12)


def test_capped_prior_upload_and_a_bad_weighting_or_cap(small_split):
    up = prior_updates(small_split, max_items=20, seed=0, weighting="capped")
    assert float(up.norms().max()) <= math.sqrt(20) * (1 + 1e-9)
    with pytest.raises(ConfigError, match="one of sqrt, capped, sample"):
        prior_updates(small_split, max_items=20, seed=0, weighting="cap")
    with pytest.raises(ConfigError, match="positive integer"):
        capped_weights(torch.zeros(3, dtype=torch.long), 1, 20, 0)
    with pytest.raises(ConfigError, match="sqrt, capped or sample"):
        PrivacyConfig(epsilon=2, prior_share=0.9, prior_weighting="cap")  # type: ignore[arg-type]
