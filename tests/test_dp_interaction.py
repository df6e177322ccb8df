"""Interaction-level DP: client-side DP-SGD in FedRAP, its accounting, wiring and errors."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from protocols.dp import PrivacyLedger
from protocols.dp.dpsgd import (
    DPSGDConfig,
    calibrate_dpsgd_noise,
    check_interaction_delta,
    clip_factors,
    dpsgd_epsilon,
    dpsgd_event,
    dpsgd_steps,
    embedding_example_sq_norms,
)
from protocols.errors import ConfigError
from protocols.seeding import torch_generator
from securefed.cli import app
from securefed.models.fedrap import SPEC as FEDRAP_SPEC
from securefed.models.fedrap import FedRAP, FedRAPConfig, dpsgd_clipped_sums, uniform_negatives
from securefed.training import PrivacyConfig, TrainConfig, train

DEFAULT_EXAMPLE_CLIP = FEDRAP_SPEC.example_clip

runner = CliRunner()
SMALL = dict(model="fedrap", synthetic_users=60, synthetic_items=400, checkpoint_every=1)


def _interaction(**kwargs) -> PrivacyConfig:
    return PrivacyConfig(privacy_unit="interaction", **kwargs)


# ---------------------------------------------------------------- per-example gradients
class _OneClient(torch.nn.Module):
    """FedRAP's scorer for one user as plain modules: sigmoid(w . (D[i] + C[i]) + b)."""

    def __init__(self, n_items: int, dim: int, gen: torch.Generator) -> None:
        super().__init__()
        self.D = torch.nn.Embedding(n_items, dim)
        self.C = torch.nn.Embedding(n_items, dim)
        self.scorer = torch.nn.Linear(dim, 1)
        with torch.no_grad():
            self.D.weight.copy_(torch.randn(n_items, dim, generator=gen))
            self.C.weight.copy_(torch.randn(n_items, dim, generator=gen))
            self.scorer.weight.copy_(torch.randn(1, dim, generator=gen))
            self.scorer.bias.copy_(torch.randn(1, generator=gen))

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        return self.scorer(self.D(items) + self.C(items)).squeeze(-1)


def test_per_example_norms_and_clipped_sums_match_opacus():
    """Closed-form norms and clipped sums == Opacus's GradSampleModule per-sample gradients."""
    from opacus import GradSampleModule

    gen = torch.Generator().manual_seed(7)
    n_items, dim, k1 = 12, 4, 4
    model = _OneClient(n_items, dim, gen)
    items = torch.randint(0, n_items, (9, k1), generator=gen)
    items[0, 2] = items[0, 0]  # a negative equal to its positive
    items[1, 3] = items[1, 1] = 5  # a repeated negative
    labels = torch.zeros(9, k1)
    labels[:, 0] = 1.0

    gsm = GradSampleModule(model, loss_reduction="sum")
    prob = torch.sigmoid(gsm(items))
    loss = torch.nn.functional.binary_cross_entropy(prob, labels, reduction="none").mean(1)
    loss.sum().backward()
    per_ex = [p.grad_sample.reshape(9, -1) for p in model.parameters()]
    opacus_sq = sum((g.double() ** 2).sum(1) for g in per_ex)

    d = model.D.weight.detach().unsqueeze(0).clone()
    c = model.C.weight.detach().unsqueeze(0).clone()
    w = model.scorer.weight.detach().clone()
    b = model.scorer.bias.detach().clone()
    clip = float(opacus_sq.sqrt().median())  # about half the examples are clipped
    rows, sum_w, sum_b, sq, _ = dpsgd_clipped_sums(
        d, c, w, b, torch.zeros(9, dtype=torch.long), items, clip
    )
    torch.testing.assert_close(sq, opacus_sq, rtol=1e-5, atol=1e-9)

    factor = torch.clamp(clip / opacus_sq.sqrt(), max=1.0).float()
    expected = [(g * factor.unsqueeze(1)).sum(0) for g in per_ex]
    ours = {
        "D": rows.view(n_items, 1) * w,
        "C": rows.view(n_items, 1) * w,
        "w": sum_w[0],
        "b": sum_b,
    }
    for name, exp in zip(("D", "C", "w", "b"), expected, strict=True):
        torch.testing.assert_close(ours[name].reshape(-1), exp, rtol=1e-4, atol=1e-6)
    assert bool((factor < 1).any()) and bool((factor == 1).any())


def test_embedding_norm_counts_collisions_exactly():
    rows = torch.tensor([[3, 3, 1], [0, 1, 2]])
    coef = torch.tensor([[1.0, 2.0, -1.0], [1.0, 1.0, 1.0]])
    assert embedding_example_sq_norms(rows, coef).tolist() == [9.0 + 1.0, 3.0]


def test_clip_factors_bound_and_keep_short_examples():
    sq = torch.tensor([0.0, 0.25, 1.0, 4.0, 1e6], dtype=torch.float64)
    f = clip_factors(sq, 1.0)
    assert f[:3].tolist() == [1.0, 1.0, 1.0]
    assert bool((f.double() * sq.sqrt() <= 1.0).all())
    with pytest.raises(ConfigError, match="example clip must be a finite number > 0"):
        clip_factors(sq, 0.0)


# ---------------------------------------------------------------- FedRAP local DP-SGD
def _dp_fedrap(small_split, sigma: float, **cfg) -> FedRAP:
    config = FedRAPConfig(**{"dim": 8, "lam": 0.0, "mu": 0.0, "l2": 0.0, "local_epochs": 1, **cfg})
    return FedRAP(
        small_split,
        config,
        generator=torch_generator(0, "init"),
        dpsgd=DPSGDConfig(noise_multiplier=sigma, example_clip=0.5),
    )


def _untouched_change(small_split, sigma: float) -> torch.Tensor:
    """Coordinates of D_u and C_u (uploads) on items none of u's examples touched, scaled by
    -B/lr so that they are exactly the noise of one DP-SGD step (no regularisers, no decay)."""
    model = _dp_fedrap(small_split, sigma)
    d_before = model.D.clone()
    participants = torch.arange(small_split.n_users)
    plan = model.plan_dpsgd_round(participants, torch_generator(0, "plan"))
    assert bool((plan.batches_per_user == 1).all())  # one step per client
    updates, _ = model.train_dpsgd(plan, 0, torch_generator(0, "noise"))
    n_items = small_split.n_items
    touched = torch.zeros(plan.participants.shape[0], n_items, dtype=torch.bool)
    touched[
        plan.example_user.repeat_interleave(plan.example_items.shape[1]),
        plan.example_items.reshape(-1),
    ] = True
    size = torch.bincount(plan.example_user).float()
    scale = (-size / model.config.lr_args).view(-1, 1, 1)
    glob = plan.participants
    d_change = (model.D[glob] - d_before[glob]) * scale
    c_change = updates.dense().view(-1, n_items, 8) * scale
    free = ~touched
    assert int(free.sum()) > 1000
    return torch.cat([d_change[free].reshape(-1), c_change[free].reshape(-1)])


@pytest.mark.statistical
def test_noise_reaches_every_row_not_only_touched_ones(small_split):
    """Untouched rows of D_u and of the upload C_u - C carry noise of std sigma * clip.

    False failure: over n > 15,000 coordinates the sample std has relative sd 1/sqrt(2n) <
    0.58%, so a 3% band is a 5.2-sigma event (< 1e-6); a 10% wrong std fails (power check).
    """
    noise = _untouched_change(small_split, sigma=2.0).double()
    assert noise.numel() > 15_000
    std = float(noise.std())
    assert abs(std / (2.0 * 0.5) - 1) < 0.03
    assert abs(std / (1.1 * 2.0 * 0.5) - 1) > 0.03
    assert abs(float(noise.mean())) < 0.05
    # Positive control: without noise those rows do not move at all.
    assert float(_untouched_change(small_split, sigma=0.0).abs().max()) == 0.0


def test_negatives_are_uniform_and_ignore_the_positives(small_split):
    model = _dp_fedrap(small_split, 1.0, num_negatives=4)
    participants = torch.arange(small_split.n_users)
    plan = model.plan_dpsgd_round(participants, torch_generator(0, "plan"))
    n_examples = plan.example_items.shape[0]
    # The negatives are exactly the first draw of the round's generator: they depend on the
    # number of examples only, never on which items are positive.
    again = uniform_negatives(n_examples, 4, small_split.n_items, torch_generator(0, "plan"))
    assert torch.equal(plan.example_items[:, 1:], again)
    # Positives are not excluded: negatives hit the user's training positives about as often
    # as their share of the catalogue (the leak-free sampler would give exactly 0).
    indptr = torch.as_tensor(small_split.train_indptr)
    items = torch.as_tensor(small_split.train_items)
    is_pos = torch.zeros(small_split.n_users, small_split.n_items, dtype=torch.bool)
    owner = torch.repeat_interleave(torch.arange(small_split.n_users), indptr.diff())
    is_pos[owner, items] = True
    users = plan.participants[plan.example_user]
    hits = is_pos[users.unsqueeze(1), plan.example_items[:, 1:]].float().mean()
    share = is_pos[users].float().mean()
    assert 0.5 * share < hits < 1.5 * share and float(share) > 0.05


def test_batches_partition_each_clients_examples_every_epoch(small_split):
    model = _dp_fedrap(small_split, 1.0, batch_size=20, local_epochs=3)
    plan = model.plan_dpsgd_round(torch.arange(small_split.n_users), torch_generator(1, "p"))
    per_batch = 20 // 5
    counts = torch.bincount(plan.example_user)
    for epoch in range(3):
        eb = plan.example_batch[epoch]
        assert int(eb.min()) == 0
        assert bool((eb < plan.batches_per_user[plan.example_user]).all())
        sizes = torch.zeros(counts.shape[0], int(eb.max()) + 1, dtype=torch.long)
        sizes.index_put_((plan.example_user, eb), torch.ones_like(eb), accumulate=True)
        assert bool((sizes <= per_batch).all()) and torch.equal(sizes.sum(1), counts)
    assert not torch.equal(plan.example_batch[0], plan.example_batch[1])  # reshuffled


# ---------------------------------------------------------------- accounting and wiring
@pytest.mark.slow
def test_accounting_counts_local_epochs_times_rounds(tmp_path):
    cfg = TrainConfig(
        rounds=2,
        params=FedRAPConfig(local_epochs=3),
        privacy=_interaction(noise_multiplier=3.0, example_clip=0.2),
        **SMALL,
    )
    res = train(cfg, out=tmp_path / "r")
    s = res.summary
    assert dpsgd_steps(local_epochs=3, rounds=2) == 6
    assert s["privacy_unit"] == "interaction" and s["placement"] == "local"
    assert s["dpsgd_steps"] == 6 and s["rounds"] == 2 and s["sample_rate"] == 1.0
    assert s["epsilon"] == pytest.approx(
        dpsgd_epsilon(noise_multiplier=3.0, delta=1e-5, steps=6, accountant="prv")
    )
    ledger = json.loads((tmp_path / "r" / "privacy_ledger.json").read_text())
    events = ledger["events"]
    assert [e["round"] for e in events] == [0, 0, 0, 1, 1, 1]
    assert {(e["privacy_unit"], e["placement"], e["clip"]) for e in events} == {
        ("interaction", "local", 0.2)
    }
    eps = [m["epsilon"] for m in res.metrics]
    assert eps[0] < eps[1] == pytest.approx(s["epsilon"])


def test_calibrated_sigma_never_overshoots_and_is_tight():
    sigma = calibrate_dpsgd_noise(epsilon=2.0, delta=1e-5, steps=20, accountant="prv")
    eps = dpsgd_epsilon(noise_multiplier=sigma, delta=1e-5, steps=20, accountant="prv")
    assert 1.9 < eps <= 2.0
    assert dpsgd_epsilon(noise_multiplier=sigma, delta=1e-5, steps=21, accountant="prv") > eps


def test_budget_cap_stops_before_local_training(tmp_path):
    after = [
        dpsgd_epsilon(noise_multiplier=4.0, delta=1e-5, steps=2 * r, accountant="prv")
        for r in (2, 3)
    ]
    cap = sum(after) / 2
    cfg = TrainConfig(
        rounds=5,
        params=FedRAPConfig(local_epochs=2),
        privacy=_interaction(noise_multiplier=4.0, epsilon=cap),
        **SMALL,
    )
    res = train(cfg, out=tmp_path / "r")
    assert res.summary["rounds"] == 2 and "interaction-level epsilon" in res.summary["stopped"]
    assert after[0] - 1e-9 <= res.summary["epsilon"] <= cap
    assert len(json.loads((tmp_path / "r" / "privacy_ledger.json").read_text())["events"]) == 4


def test_ledger_keeps_one_unit():
    from protocols.dp import CentralGaussian

    ledger = PrivacyLedger([dpsgd_event(0, noise_multiplier=1.0, example_clip=1.0)])
    with pytest.raises(ConfigError, match="cannot join a ledger of interaction-level events"):
        ledger.record(CentralGaussian(clip=1.0, noise_multiplier=1.0).event(1, sample_rate=1.0))
    with pytest.raises(ConfigError, match="local placement"):
        PrivacyLedger.from_dicts([{**ledger.to_dicts()[0], "privacy_unit": "user"}])


def test_cli_train_interaction_epsilon_2(tmp_path):
    res = runner.invoke(
        app,
        [
            "train",
            "--model",
            "fedrap",
            "--privacy-unit",
            "interaction",
            "--epsilon",
            "2",
            "--rounds",
            "2",
            "--local-epochs",
            "2",
            "--synthetic-users",
            "60",
            "--synthetic-items",
            "400",
            "--out",
            str(tmp_path / "dp"),
        ],
    )
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "dp" / "summary.json").read_text())
    assert 1.9 < s["epsilon"] <= 2.0 and s["target_epsilon"] == 2.0
    assert s["privacy_unit"] == "interaction" and s["example_clip"] == DEFAULT_EXAMPLE_CLIP
    assert s["noise_multiplier"] == pytest.approx(
        calibrate_dpsgd_noise(epsilon=2.0, delta=1e-5, steps=4, accountant="prv")
    )
    assert "interaction-level" in res.output
    assert 0 <= s["test_hr@10"] <= 1


def test_secure_aggregation_masks_dp_sgd_uploads(tmp_path):
    """Secure aggregation composes: it sums the already-private uploads (no extra noise)."""
    cfg = TrainConfig(
        model="fedrap",
        rounds=1,
        synthetic_users=20,
        synthetic_items=200,
        params=FedRAPConfig(dim=4, local_epochs=1),
        privacy=_interaction(noise_multiplier=2.0, secagg=True, clip=1e4),
    )
    res = train(cfg, out=tmp_path / "r")
    s = res.summary
    assert s["secagg"] and s["privacy_unit"] == "interaction" and s["secagg_bound"] == 1e4
    assert res.metrics[0]["contributors"] == 20 and res.metrics[0]["secagg_survivors"] == 20


@pytest.mark.parametrize(
    ("model", "privacy", "message"),
    [
        ("fedrap", {}, "give --epsilon or --noise-multiplier"),
        ("fedrap", {"epsilon": 2.0, "clip": 1.0}, "use --example-clip"),
        ("fedrap", {"epsilon": 2.0, "noise": "distributed"}, "drop --noise"),
        ("fedrap", {"epsilon": 2.0, "example_clip": -1.0}, "example clip must be"),
    ],
)
def test_config_errors(model, privacy, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(model=model, privacy=_interaction(**privacy))


def test_example_clip_needs_the_interaction_unit():
    with pytest.raises(ConfigError, match="--example-clip is the DP-SGD clip"):
        PrivacyConfig(epsilon=2.0, example_clip=0.5)


def test_delta_must_be_below_one_over_interactions(tmp_path):
    with pytest.raises(ConfigError, match=r"delta must be below 1/interactions = 0.01 for 100"):
        check_interaction_delta(0.01, n_interactions=100)
    check_interaction_delta(0.009, n_interactions=100)
    res = runner.invoke(
        app,
        [
            "train",
            "--model",
            "fedrap",
            "--privacy-unit",
            "interaction",
            "--epsilon",
            "2",
            "--delta",
            "1e-3",
            "--rounds",
            "1",
            "--synthetic-users",
            "60",
            "--synthetic-items",
            "400",
            "--out",
            str(tmp_path / "bad"),
        ],
    )
    assert res.exit_code == 2 and "delta must be below 1/interactions" in res.output
