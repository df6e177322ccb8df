"""Interaction-level DP-SGD in FedRecGEL: closed-form per-example clipping against Opacus,
SAM releases, noise on every coordinate, accounting and wiring."""

from __future__ import annotations

import json

import pytest
import torch

from protocols.dp.dpsgd import (
    DPSGDConfig,
    dpsgd_epsilon,
    embedding_rows_sq_norms,
    linear_ghost_sq_norms,
    sam_releases,
)
from protocols.errors import ConfigError
from protocols.seeding import torch_generator
from securefed.models.fedrap import uniform_negatives
from securefed.models.fedrecgel import FedRecGEL, FedRecGELConfig
from securefed.training import PrivacyConfig, TrainConfig, train

TINY = dict(gmf_dim=3, mlp_dim=4, layers=(8, 5, 3))


def _model(split, sigma: float = 0.0, clip: float = 1.0, **cfg) -> FedRecGEL:
    return FedRecGEL(
        split,
        FedRecGELConfig(**{**TINY, **cfg}),
        generator=torch_generator(0, "init"),
        dpsgd=DPSGDConfig(noise_multiplier=sigma, example_clip=clip),
    )


# ---------------------------------------------------------------- per-example gradients
class _OneUserNCF(torch.nn.Module):
    """FedRecGEL's NCF for one user as plain modules (the user embeddings are 1-row tables)."""

    def __init__(self, model: FedRecGEL, user: int) -> None:
        super().__init__()
        sh, cfg = model.shared, model.config
        self.user_gmf = torch.nn.Embedding.from_pretrained(
            model.user_gmf[user : user + 1], freeze=False
        )
        self.user_mlp = torch.nn.Embedding.from_pretrained(
            model.user_mlp[user : user + 1], freeze=False
        )
        self.item_gmf = torch.nn.Embedding.from_pretrained(
            sh["embed_item_gmf"].clone(), freeze=False
        )
        self.item_mlp = torch.nn.Embedding.from_pretrained(
            sh["embed_item_mlp"].clone(), freeze=False
        )
        widths = cfg.layers
        self.mlp = torch.nn.ModuleList(
            torch.nn.Linear(widths[k], widths[k + 1]) for k in range(len(widths) - 1)
        )
        self.predict = torch.nn.Linear(cfg.gmf_dim + widths[-1], 1)
        with torch.no_grad():
            for k, layer in enumerate(self.mlp):
                layer.weight.copy_(sh[f"mlp.{k}.weight"])
                layer.bias.copy_(sh[f"mlp.{k}.bias"])
            self.predict.weight.copy_(sh["predict.weight"])
            self.predict.bias.copy_(sh["predict.bias"])

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        zero = torch.zeros_like(items)
        h = torch.cat([self.user_mlp(zero), self.item_mlp(items)], dim=-1)
        for layer in self.mlp:
            h = torch.relu(layer(h))
        gm = self.user_gmf(zero) * self.item_gmf(items)
        return self.predict(torch.cat([gm, h], dim=-1)).squeeze(-1)


def _opacus_per_example(model: FedRecGEL, items: torch.Tensor) -> dict[str, torch.Tensor]:
    from opacus import GradSampleModule

    net = _OneUserNCF(model, 0)
    gsm = GradSampleModule(net, loss_reduction="sum")
    labels = torch.zeros(items.shape)
    labels[:, 0] = 1.0
    logits = gsm(items)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    loss.mean(1).sum().backward()
    return {n: p.grad_sample.reshape(items.shape[0], -1) for n, p in net.named_parameters()}


def _randomise(model: FedRecGEL, gen: torch.Generator) -> None:
    """Larger-than-init values so that every term of the norm matters."""
    for t in model.shared.values():
        t.copy_(torch.randn(t.shape, generator=gen) * 0.7)
    model.user_gmf.copy_(torch.randn(model.user_gmf.shape, generator=gen))
    model.user_mlp.copy_(torch.randn(model.user_mlp.shape, generator=gen))


PRIVATE = ("user_gmf.weight", "user_mlp.weight")


@pytest.mark.parametrize("part", ["all", "shared", "private"])
def test_per_example_norms_and_clipped_sums_match_opacus(small_split, part):
    gen = torch.Generator().manual_seed(5)
    model = _model(small_split)
    _randomise(model, gen)
    n_ex, k1 = 17, 4
    items = torch.randint(0, small_split.n_items, (n_ex, k1), generator=gen)
    items[0, 2] = items[0, 0]  # a negative equal to its positive
    items[1, 3] = items[1, 1] = 5  # a repeated negative
    per_ex = _opacus_per_example(model, items)
    names = [n for n in per_ex if (part == "all") or ((n in PRIVATE) == (part == "private"))]
    opacus_sq = sum((per_ex[n].double() ** 2).sum(1) for n in names)

    b = model._dp_batch(torch.tensor([n_ex]), items)
    assert b.items.shape[1] < n_ex  # several rows, one padded
    clip = float(opacus_sq.sqrt().median())
    out = model._dp_pass(b, model.user_gmf[:1], model.user_mlp[:1], eps=None, part=part, clip=clip)
    real = b.mask.reshape(-1) > 0
    torch.testing.assert_close(out.sq_norms[real], opacus_sq, rtol=1e-5, atol=1e-10)
    assert float(out.sq_norms[~real].abs().max()) == 0.0

    factor = torch.clamp(clip / opacus_sq.sqrt(), max=1.0).float()
    assert bool((factor < 1).any()) and bool((factor == 1).any())
    expected = {n: (g * factor.unsqueeze(1)).sum(0) for n, g in per_ex.items()}
    ours: dict[str, torch.Tensor] = {}
    if part != "private":
        assert out.shared is not None
        ours |= {
            "item_gmf.weight": out.shared["embed_item_gmf"][0],
            "item_mlp.weight": out.shared["embed_item_mlp"][0],
            "predict.weight": out.shared["predict.weight"][0],
            "predict.bias": out.shared["predict.bias"][0],
        }
        for k in range(2):
            ours[f"mlp.{k}.weight"] = out.shared[f"mlp.{k}.weight"][0]
            ours[f"mlp.{k}.bias"] = out.shared[f"mlp.{k}.bias"][0]
    else:
        assert out.shared is None
    if part != "shared":
        ours |= {"user_gmf.weight": out.user_gmf[0], "user_mlp.weight": out.user_mlp[0]}
    else:
        assert out.user_gmf is None
    assert set(ours) == set(names)
    for name, got in ours.items():
        torch.testing.assert_close(got.reshape(-1), expected[name], rtol=1e-4, atol=1e-6)


def test_perturbed_pass_equals_pass_at_perturbed_parameters(small_split):
    """SAM pass 2 with per-client perturbations == a plain pass at theta + eps_c, per client."""
    gen = torch.Generator().manual_seed(2)
    model = _model(small_split)
    _randomise(model, gen)
    counts = torch.tensor([7, 13])
    items = torch.randint(0, small_split.n_items, (20, 5), generator=gen)
    eps = {k: 0.3 * torch.randn(2, *v.shape, generator=gen) for k, v in model.shared.items()}
    b = model._dp_batch(counts, items)
    ug, um = model.user_gmf[:2], model.user_mlp[:2]
    both = model._dp_pass(b, ug, um, eps=eps, part="shared", clip=0.05)
    original = {k: v.clone() for k, v in model.shared.items()}
    for c, (lo, hi) in enumerate(((0, 7), (7, 20))):
        model.shared = {k: original[k] + eps[k][c] for k in original}
        one = model._dp_pass(
            model._dp_batch(counts[c : c + 1], items[lo:hi]),
            ug[c : c + 1],
            um[c : c + 1],
            eps=None,
            part="shared",
            clip=0.05,
        )
        for k in original:
            torch.testing.assert_close(both.shared[k][c], one.shared[k][0], rtol=1e-4, atol=1e-6)
        assert bool((one.factor < 1).any())


def test_ghost_and_row_norm_helpers():
    x = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])
    d = torch.tensor([[[3.0], [1.0]]])
    # weight gradient: 3*[1,0] + 1*[0,2] = [3, 2] -> 13; bias (3+1)^2 = 16
    assert linear_ghost_sq_norms(torch.bmm(x, x.mT), d).tolist() == [29.0]
    rows = torch.tensor([[4, 4, 1]])
    g = torch.tensor([[[1.0, 0.0], [2.0, 1.0], [0.0, 5.0]]])
    assert embedding_rows_sq_norms(rows, g).tolist() == [9.0 + 1.0 + 25.0]
    with pytest.raises(ConfigError, match="rows must be"):
        embedding_rows_sq_norms(rows, g[0])


# ---------------------------------------------------------------- the DP-SGD round
def test_releases_per_step():
    assert sam_releases(sam=True, rho_shared=0.02, rho_private=0.02) == 3
    assert sam_releases(sam=True, rho_shared=0.0, rho_private=0.02) == 2
    assert sam_releases(sam=False, rho_shared=0.02, rho_private=0.02) == 1


def test_negatives_uniform_and_round_is_dense(small_split):
    model = _model(small_split, sigma=1.0, num_negatives=4)
    participants = torch.arange(0, small_split.n_users, 3)
    plan = model.plan_dpsgd_round(participants, torch_generator(0, "plan"))
    again = uniform_negatives(
        plan.example_items.shape[0], 4, small_split.n_items, torch_generator(0, "plan")
    )
    assert torch.equal(plan.example_items[:, 1:], again)
    counts = torch.bincount(plan.example_client, minlength=participants.shape[0])
    indptr = torch.as_tensor(small_split.train_indptr)
    assert torch.equal(counts, (indptr[participants + 1] - indptr[participants]))
    updates, stats = model.train_dpsgd(plan, 0, torch_generator(0, "noise"))
    assert updates.dense().shape == (participants.shape[0], model.layout.size)
    assert bool((updates.dense() != 0).all())  # noise everywhere, not only touched rows
    assert stats.samples == plan.example_items.numel()


def _untouched_noise(split, sigma: float, clip: float, sam: bool) -> torch.Tensor:
    """Upload coordinates of item rows the client never touched, in units of the noise."""
    model = _model(split, sigma=sigma, clip=clip, sam=sam, gmf_dim=8, mlp_dim=8, layers=(16, 5, 3))
    participants = torch.arange(split.n_users)
    plan = model.plan_dpsgd_round(participants, torch_generator(0, "plan"))
    updates, _ = model.train_dpsgd(plan, 0, torch_generator(0, "noise"))
    n_items = split.n_items
    touched = torch.zeros(participants.shape[0], n_items, dtype=torch.bool)
    k1 = plan.example_items.shape[1]
    touched[plan.example_client.repeat_interleave(k1), plan.example_items.reshape(-1)] = True
    views = model.layout.split(updates.dense())
    scale = model.config.chunk_size / k1  # undo the constant loss weight
    free = ~touched
    return (
        torch.cat([views[n][free].reshape(-1) for n in ("embed_item_gmf", "embed_item_mlp")])
        * scale
    )


@pytest.mark.statistical
@pytest.mark.parametrize("sam", [True, False])
def test_noise_reaches_untouched_item_rows(small_split, sam):
    """Untouched item rows of the upload are pure noise of std sigma * clip.

    False failure: n > 15,000 coordinates, relative sd of the sample std < 0.58%; a 4% band
    is a 6.9-sigma event (< 1e-11); a 10% wrong std fails (power check).
    """
    noise = _untouched_noise(small_split, sigma=2.0, clip=0.5, sam=sam).double()
    assert noise.numel() > 15_000
    std = float(noise.std())
    assert abs(std / 1.0 - 1) < 0.04
    assert abs(std / 1.1 - 1) > 0.04
    # Positive control: without noise those rows are exactly 0.
    assert float(_untouched_noise(small_split, sigma=0.0, clip=0.5, sam=sam).abs().max()) == 0.0


def test_no_noise_no_clipping_gives_the_plain_gradient(small_split):
    """Positive control: with sigma 0 and a clip no example reaches, SAM off, the upload is
    the autograd gradient of ``sum_e mean_s BCE * (k+1) / chunk_size`` at the round's start."""
    model = _model(small_split, sigma=0.0, clip=1e9, sam=False)
    shared = {k: v.clone().requires_grad_(True) for k, v in model.shared.items()}
    ug, um = model.user_gmf.clone(), model.user_mlp.clone()
    plan = model.plan_dpsgd_round(torch.tensor([1, 4]), torch_generator(3, "plan"))
    updates, _ = model.train_dpsgd(plan, 0, torch_generator(0, "noise"))
    cfg = model.config
    for c, user in enumerate((1, 4)):
        items = plan.example_items[plan.example_client == c]
        mlp_in = um[user].expand(*items.shape, -1)
        h = torch.cat([mlp_in, shared["embed_item_mlp"][items]], dim=-1)
        for k in range(len(cfg.layers) - 1):
            h = torch.relu(h @ shared[f"mlp.{k}.weight"].T + shared[f"mlp.{k}.bias"])
        gm = ug[user] * shared["embed_item_gmf"][items]
        z = torch.cat([gm, h], dim=-1) @ shared["predict.weight"][0] + shared["predict.bias"]
        labels = torch.zeros(items.shape)
        labels[:, 0] = 1.0
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z, labels, reduction="sum")
        grads = torch.autograd.grad(loss / cfg.chunk_size, list(shared.values()))
        expect = torch.cat([g.reshape(-1) for g in grads])
        torch.testing.assert_close(updates.dense()[c], expect, rtol=1e-4, atol=1e-7)
    # The private embeddings took one Adam step (lr 0.1): every coordinate moved.
    assert bool((model.user_gmf[[1, 4]] != ug[[1, 4]]).all())


# ---------------------------------------------------------------- accounting and wiring
SMALL = dict(synthetic_users=40, synthetic_items=300, checkpoint_every=1)


@pytest.mark.parametrize(("sam", "per_round"), [(True, 3), (False, 1)])
def test_accounting_counts_releases_times_rounds(tmp_path, sam, per_round):
    cfg = TrainConfig(
        model="fedrecgel",
        rounds=2,
        params=FedRecGELConfig(**TINY, sam=sam),
        privacy=PrivacyConfig(privacy_unit="interaction", noise_multiplier=3.0, example_clip=0.1),
        **SMALL,
    )
    res = train(cfg, out=tmp_path / "r")
    s = res.summary
    assert s["privacy_unit"] == "interaction" and s["placement"] == "local"
    assert s["dpsgd_steps"] == 2 * per_round and s["releases_per_round"] == per_round
    assert s["epsilon"] == pytest.approx(
        dpsgd_epsilon(noise_multiplier=3.0, delta=1e-5, steps=2 * per_round, accountant="prv")
    )
    events = json.loads((tmp_path / "r" / "privacy_ledger.json").read_text())["events"]
    assert [e["round"] for e in events] == [0] * per_round + [1] * per_round
    assert 0 <= s["test_hr@10"] <= 1


def test_calibrated_epsilon_target(tmp_path):
    cfg = TrainConfig(
        model="fedrecgel",
        rounds=2,
        params=FedRecGELConfig(**TINY),
        privacy=PrivacyConfig(privacy_unit="interaction", epsilon=4.0),
        **SMALL,
    )
    s = train(cfg, out=tmp_path / "r").summary
    assert 3.8 < s["epsilon"] <= 4.0 and s["dpsgd_steps"] == 6


def test_secure_aggregation_sums_the_dense_dp_uploads(tmp_path):
    cfg = TrainConfig(
        model="fedrecgel",
        rounds=1,
        params=FedRecGELConfig(**TINY),
        privacy=PrivacyConfig(
            privacy_unit="interaction", noise_multiplier=2.0, secagg=True, clip=1e4
        ),
        **SMALL,
    )
    res = train(cfg, out=tmp_path / "r")
    assert res.summary["secagg"] and res.summary["privacy_unit"] == "interaction"
    assert res.metrics[0]["secagg_survivors"] == res.metrics[0]["contributors"] > 0


def test_account_interaction_unit_counts_releases():
    from securefed.privacy import account

    for kwargs, steps in (
        ({"model": "fedrecgel"}, 15),
        ({"model": "fedrecgel", "sam": False}, 5),
        ({"model": "fedrap", "local_epochs": 2}, 10),
    ):
        res = account(noise_multiplier=3.0, rounds=5, privacy_unit="interaction", **kwargs)
        assert res["steps"] == steps and res["sample_rate"] == 1.0
        assert res["epsilon"] == pytest.approx(
            dpsgd_epsilon(noise_multiplier=3.0, delta=1e-5, steps=steps, accountant="prv")
        )
    res = account(epsilon=8.0, rounds=5, privacy_unit="interaction", model="fedrecgel")
    assert 7.9 < res["epsilon"] <= 8.0
    with pytest.raises(ConfigError, match="drop --client-fraction"):
        account(epsilon=8.0, privacy_unit="interaction", client_fraction=0.1)
    with pytest.raises(ConfigError, match="model must be one of"):
        account(epsilon=8.0, privacy_unit="interaction", model="ncf")
