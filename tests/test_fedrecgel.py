"""FedRecGEL: the batched round against a per-client autograd loop in the official style."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from securefed.data.split import leave_one_out
from securefed.data.synthetic import make_synthetic
from securefed.data.types import Split
from securefed.errors import ConfigError
from securefed.federation.base import Aggregate, DenseUpdates, Recommender
from securefed.models import fedrecgel as fedrecgel_mod
from securefed.models.fedrecgel import (
    FedRecGEL,
    FedRecGELConfig,
    FedRecGELUpdates,
    RoundPlan,
    sam_scale,
)
from securefed.privacy import PrivateAggregator
from securefed.training import PrivacyConfig, TrainConfig


def small_split(n_users: int = 30, n_items: int = 120, seed: int = 0) -> Split:
    data = make_synthetic(
        n_users=n_users, n_items=n_items, seed=seed, min_history=20, mean_history=50.0
    )
    return leave_one_out(data, seed=seed, n_eval_negatives=20)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------- reference
class Reference:
    """One client at a time with plain autograd and torch.optim.Adam, as the official code does.

    Written independently of the batched math: the MLP input is the concatenation
    ``[q_u ; Q_i]``, chunks are consecutive slices of each client's sample list, SAM perturbs
    and reverts parameter tensors in place.
    """

    def __init__(self, model: FedRecGEL) -> None:
        self.cfg = model.config
        self.layout = model.layout
        self.shared = {
            k: torch.nn.Parameter(v.clone()) for k, v in model.shared.items()
        }  # server copy
        self.server_opt = torch.optim.Adam(list(self.shared.values()), lr=self.cfg.server_lr)
        self.user_gmf = model.user_gmf.clone()
        self.user_mlp = model.user_mlp.clone()
        self.clients: dict[
            int, tuple[torch.nn.Parameter, torch.nn.Parameter, torch.optim.Adam]
        ] = {}
        self.n_layers = len(self.cfg.layers) - 1

    def client(self, u: int) -> tuple[torch.nn.Parameter, torch.nn.Parameter, torch.optim.Adam]:
        if u not in self.clients:
            pg = torch.nn.Parameter(self.user_gmf[u : u + 1].clone())
            pm = torch.nn.Parameter(self.user_mlp[u : u + 1].clone())
            self.clients[u] = (pg, pm, torch.optim.Adam([pg, pm], lr=self.cfg.client_lr))
        return self.clients[u]

    def logits(self, p: dict[str, torch.Tensor], pg, pm, items) -> torch.Tensor:
        gm = pg * p["embed_item_gmf"][items]
        h = torch.cat([pm.expand(items.shape[0], -1), p["embed_item_mlp"][items]], dim=1)
        for k in range(self.n_layers):
            h = torch.relu(F.linear(h, p[f"mlp.{k}.weight"], p[f"mlp.{k}.bias"]))
        return F.linear(torch.cat([gm, h], 1), p["predict.weight"], p["predict.bias"]).view(-1)

    def loss(self, p, pg, pm, items, labels) -> torch.Tensor:
        total = torch.zeros(())
        cs = self.cfg.chunk_size
        for i in range(0, items.shape[0], cs):
            z = self.logits(p, pg, pm, items[i : i + cs])
            total = total + F.binary_cross_entropy_with_logits(z, labels[i : i + cs])
        return total

    @staticmethod
    def perturb(params: list[torch.Tensor], grads: list[torch.Tensor], rho: float) -> list:
        norm = torch.sqrt(sum((g * g).sum() for g in grads))
        if norm == 0 or rho == 0:
            return [torch.zeros_like(p) for p in params]
        eps = [g * (rho / (norm + 1e-12)) for g in grads]
        with torch.no_grad():
            for p, e in zip(params, eps, strict=True):
                p.add_(e)
        return eps

    def round(self, plan: RoundPlan) -> torch.Tensor:
        uploads = []
        for c, u in enumerate(plan.participants.tolist()):
            sel = plan.sample_client == c
            items, labels = plan.sample_item[sel], plan.sample_label[sel]
            pg, pm, opt = self.client(u)
            sh = {k: torch.nn.Parameter(v.detach().clone()) for k, v in self.shared.items()}
            sh_list, ns_list = list(sh.values()), [pg, pm]
            params = sh_list + ns_list
            grads = torch.autograd.grad(self.loss(sh, pg, pm, items, labels), params)
            g_sh, g_ns = list(grads[: len(sh_list)]), list(grads[len(sh_list) :])
            if self.cfg.sam:
                eps = self.perturb(sh_list, g_sh, self.cfg.rho_shared)
                g_sh = list(torch.autograd.grad(self.loss(sh, pg, pm, items, labels), sh_list))
                with torch.no_grad():
                    for p, e in zip(sh_list, eps, strict=True):
                        p.sub_(e)
                eps = self.perturb(ns_list, g_ns, self.cfg.rho_private)
                g_ns = list(torch.autograd.grad(self.loss(sh, pg, pm, items, labels), ns_list))
                with torch.no_grad():
                    for p, e in zip(ns_list, eps, strict=True):
                        p.sub_(e)
            opt.zero_grad()
            pg.grad, pm.grad = g_ns[0].clone(), g_ns[1].clone()
            opt.step()
            uploads.append(torch.cat([g.reshape(-1) for g in g_sh]))
        return torch.stack(uploads)

    def server_step(self, mean: torch.Tensor) -> None:
        for name, part in self.layout.split(mean).items():
            self.shared[name].grad = part.clone()
        self.server_opt.step()
        self.server_opt.zero_grad()


def close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5) -> None:
    torch.testing.assert_close(a, b, rtol=1e-4, atol=atol)


SMALL = {"gmf_dim": 8, "mlp_dim": 16, "layers": (32, 16, 8)}


@pytest.mark.parametrize(
    ("sam", "chunk_size", "negatives_from", "dims", "block_slots"),
    [
        (True, 128, "train", {}, None),
        (True, 32, "history", SMALL, None),
        (False, 128, "train", SMALL, None),
        (True, 32, "train", SMALL, 200),  # many blocks of clients, some of a single client
    ],
)
def test_batched_round_equals_per_client_reference(
    sam, chunk_size, negatives_from, dims, block_slots, monkeypatch
):
    if block_slots is not None:
        monkeypatch.setattr(fedrecgel_mod, "_BLOCK_SLOTS", block_slots)
    split = small_split()
    cfg = FedRecGELConfig(sam=sam, chunk_size=chunk_size, negatives_from=negatives_from, **dims)
    model = FedRecGEL(split, cfg, generator=gen(1))
    ref = Reference(model)
    rng = gen(2)
    for r in range(2):
        participants = torch.randperm(split.n_users, generator=rng)[:12]
        plan = model.plan_round(participants, gen(100 + r))
        updates, stats = model.train_plan(plan, r)
        expected = ref.round(plan)
        assert torch.equal(updates.clients, participants)
        assert stats.samples == int(plan.sample_item.shape[0])
        close(updates.dense(), expected)
        mean = updates.dense().mean(0)
        model.apply_aggregate(
            Aggregate(total=mean * len(updates), contributors=12, denominator=12.0), r
        )
        ref.server_step(expected.mean(0))
    for name, p in ref.shared.items():
        close(model.shared[name], p.detach())
        state = ref.server_opt.state[p]
        close(model._server_exp_avg[name], state["exp_avg"], atol=1e-7)
        close(model._server_exp_avg_sq[name], state["exp_avg_sq"], atol=1e-9)
    adam = model._client_adam
    for u, (pg, pm, opt) in ref.clients.items():
        close(model.user_gmf[u], pg.detach()[0])
        close(model.user_mlp[u], pm.detach()[0])
        assert int(adam["step"][u]) == int(opt.state[pg]["step"])
        close(adam["user_gmf.exp_avg"][u], opt.state[pg]["exp_avg"][0], atol=1e-7)
        close(adam["user_mlp.exp_avg_sq"][u], opt.state[pm]["exp_avg_sq"][0], atol=1e-9)
    untouched = sorted(set(range(split.n_users)) - set(ref.clients))
    assert torch.equal(model.user_gmf[untouched], ref.user_gmf[untouched])
    assert bool((adam["step"][untouched] == 0).all())


def _round_updates(seed: int = 3, m: int = 12) -> tuple[FedRecGEL, FedRecGELUpdates]:
    split = small_split()
    model = FedRecGEL(split, FedRecGELConfig(**SMALL), generator=gen(seed))
    participants = torch.randperm(split.n_users, generator=gen(seed + 1))[:m]
    updates, _ = model.client_round(participants, 0, gen(seed + 2))
    assert isinstance(updates, FedRecGELUpdates)
    return model, updates


def test_structured_upload_is_the_dense_gradient_with_zero_untouched_rows():
    model, up = _round_updates()
    dense = up.dense()
    assert dense.shape == (12, model.layout.size)
    views = model.layout.split(dense)
    touched = torch.zeros(12, model.split.n_items, dtype=torch.bool)
    touched[up.pair_client, up.pair_item] = True
    assert 0 < int(touched.sum()) < touched.numel()
    for name, rows in (("embed_item_gmf", up.pair_gmf), ("embed_item_mlp", up.pair_mlp)):
        assert bool((views[name][~touched] == 0).all())
        assert torch.equal(views[name][up.pair_client, up.pair_item], rows)
    # Only items a client really touched are stored (no padding pair): the GMF gradient
    # dz * w_p * p_u of a touched item is never exactly zero.
    assert bool((up.pair_gmf.abs().sum(1) > 0).all())
    # The rows of a subset, in the asked order, are the same rows.
    rows = torch.tensor([7, 0, 11, 3])
    assert torch.equal(up.dense(rows), dense[rows])
    assert up.dense(torch.zeros(0, dtype=torch.long)).shape == (0, model.layout.size)
    # Norms over the stored rows are the dense norms; weighted sums are the dense ones.
    torch.testing.assert_close(
        up.norms(), torch.linalg.vector_norm(dense.double(), dim=1), rtol=1e-12, atol=0
    )
    w = torch.rand(12, generator=gen(9))
    torch.testing.assert_close(up.weighted_sum(w), w @ dense, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "privacy",
    [
        {"secagg": True},
        # Replay: both aggregators draw the same noise, so their totals are comparable.
        {"noise_multiplier": 1e-6, "clip": 0.05, "accountant": "rdp", "replay": True},
    ],
)
def test_privacy_seam_treats_the_structured_upload_as_its_dense_form(privacy):
    """Secure aggregation (clip inactive: bit-identical ring sums) and DP clipping (active)."""
    model, up = _round_updates(seed=20)
    dense = DenseUpdates(clients=up.clients, vectors=up.dense(), layout=model.layout)
    cfg = TrainConfig(model="fedrecgel", rounds=2, privacy=PrivacyConfig(**privacy))
    totals = []
    for updates in (up, dense):
        agg = PrivateAggregator(cfg, model.split, dim=model.layout.size)
        out = agg(updates, 0)
        assert out is not None and out.contributors == 12
        totals.append(out.total)
        if "clip" in privacy:
            assert agg.round_record()["clipped_fraction"] == 1.0  # every update was clipped
    if "secagg" in privacy:
        assert torch.equal(totals[0], totals[1])
    else:
        torch.testing.assert_close(totals[0], totals[1], rtol=1e-5, atol=1e-8)
        norm = float(totals[0].norm())
        assert 0.05 < norm <= 12 * 0.05 * (1 + 1e-5)


def test_blocks_of_clients_change_nothing(monkeypatch):
    """Several blocks (``_BLOCK_SLOTS`` small) give the one-block uploads and private state."""
    results = []
    for slots in (1 << 15, 300):
        monkeypatch.setattr(fedrecgel_mod, "_BLOCK_SLOTS", slots)
        model, up = _round_updates(seed=30, m=20)
        blocks = fedrecgel_mod._blocks(
            model.plan_round(up.clients, gen(32)), model.config.chunk_size
        )
        results.append((len(blocks), up.dense(), model.user_mlp.clone(), model.last_round))
    (n1, d1, u1, diag1), (n2, d2, u2, diag2) = results
    assert n1 == 1 and n2 > 5
    close(d2, d1, atol=1e-7)
    close(u2, u1, atol=1e-7)
    assert diag1 is not None and diag2 is not None
    close(diag2.shared_eps_norm, diag1.shared_eps_norm, atol=1e-9)


def test_plan_follows_the_official_sample_order():
    split = small_split()
    cfg = FedRecGELConfig(num_negatives=3)
    model = FedRecGEL(split, cfg, generator=gen(0))
    participants = torch.tensor([4, 0, 17])
    plan = model.plan_round(participants, gen(5))
    for c, u in enumerate(participants.tolist()):
        sel = plan.sample_client == c
        items, labels = plan.sample_item[sel], plan.sample_label[sel]
        positives = split.user_train_items(u)
        assert int(sel.sum()) == 4 * len(positives) == int(plan.samples_per_client[c])
        assert torch.equal(labels.view(-1, 4)[:, 0], torch.ones(len(positives)))
        assert bool((labels.view(-1, 4)[:, 1:] == 0).all())
        assert sorted(items.view(-1, 4)[:, 0].tolist()) == sorted(positives.tolist())
        assert not np.isin(items.view(-1, 4)[:, 1:].numpy(), positives).any()
    # The shuffle is real: positives do not come out in the stored (sorted) order.
    first = plan.sample_item[plan.sample_client == 0].view(-1, 4)[:, 0]
    assert not torch.equal(first, torch.sort(first).values)


def test_sam_off_uploads_the_plain_gradient_and_sam_on_differs():
    split = small_split()
    participants = torch.arange(8)
    plans = {}
    ups = {}
    for sam in (False, True):
        model = FedRecGEL(split, FedRecGELConfig(sam=sam), generator=gen(3))
        ref = Reference(model)
        plans[sam] = model.plan_round(participants, gen(4))
        ups[sam] = model.train_plan(plans[sam], 0)[0].dense()
        if not sam:
            close(ups[sam], ref.round(plans[sam]))
            assert model.last_round is not None
            assert bool((model.last_round.shared_eps_norm == 0).all())
    assert torch.equal(plans[False].sample_item, plans[True].sample_item)
    # SAM's gradient is taken elsewhere: it must differ by a visible amount.
    diff = (ups[True] - ups[False]).norm(dim=1) / ups[False].norm(dim=1)
    assert bool((diff > 1e-3).all())


def test_sam_perturbations_have_norm_rho():
    split = small_split()
    cfg = FedRecGELConfig(rho_shared=0.05, rho_private=0.3)
    model = FedRecGEL(split, cfg, generator=gen(6))
    model.client_round(torch.arange(0, 30, 2), 0, gen(7))
    diag = model.last_round
    assert diag is not None
    close(diag.shared_eps_norm, torch.full((15,), 0.05), atol=1e-6)
    close(diag.private_eps_norm, torch.full((15,), 0.3), atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.lists(
            st.one_of(st.just(0.0), st.floats(1e-6, 1e3), st.floats(-1e3, -1e-6)),
            min_size=1,
            max_size=8,
        ),
        min_size=1,
        max_size=6,
    ),
    rho=st.one_of(st.just(0.0), st.floats(1e-6, 10.0)),
)
def test_sam_scale_gives_norm_rho_or_zero(rows, rho):
    width = max(len(r) for r in rows)
    g = torch.tensor([r + [0.0] * (width - len(r)) for r in rows], dtype=torch.float64)
    eps = sam_scale(g.square().sum(1), rho).unsqueeze(1) * g
    norms = eps.norm(dim=1)
    for i in range(g.shape[0]):
        n = float(g[i].norm())
        if n == 0.0:
            assert float(norms[i]) == 0.0
        else:  # rho / (n + 1e-12) * n: rho up to the official 1e-12 guard
            assert math.isclose(float(norms[i]), rho * n / (n + 1e-12), rel_tol=1e-9, abs_tol=0)
            assert abs(float(norms[i]) - rho) <= rho * (1e-12 / n + 1e-12)


def test_state_dict_round_trip_continues_identically():
    split = small_split()
    cfg = FedRecGELConfig(**SMALL)
    model = FedRecGEL(split, cfg, generator=gen(8))

    def run(m: FedRecGEL, rounds: range) -> list[torch.Tensor]:
        out = []
        for r in rounds:
            participants = torch.randperm(split.n_users, generator=gen(50 + r))[:10]
            updates, _ = m.client_round(participants, r, gen(60 + r))
            m.apply_aggregate(
                Aggregate(total=updates.dense().sum(0), contributors=10, denominator=10.0), r
            )
            m.end_round(r)
            out.append(updates.dense())
        return out

    run(model, range(2))
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    expected = run(model, range(2, 4))
    resumed = FedRecGEL(split, cfg, generator=gen(9))  # different init, overwritten by the load
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer))
    got = run(resumed, range(2, 4))
    for a, b in zip(expected, got, strict=True):
        assert torch.equal(a, b)
    for key, value in model.state_dict()["shared"].items():
        assert torch.equal(resumed.shared[key], value)
    assert torch.equal(resumed.user_mlp, model.user_mlp)
    assert torch.equal(
        resumed._client_adam["user_gmf.exp_avg_sq"], model._client_adam["user_gmf.exp_avg_sq"]
    )


def test_load_state_dict_rejects_a_mismatched_state_without_changing_anything():
    split = small_split()
    model = FedRecGEL(split, FedRecGELConfig(), generator=gen(0))
    state = model.state_dict()
    state["user_mlp"] = torch.zeros(3, 128)
    before = model.user_gmf.clone()
    other = FedRecGEL(split, FedRecGELConfig(), generator=gen(1))
    bad = other.state_dict()
    bad["user_mlp"] = torch.zeros(3, 128)
    with pytest.raises(ConfigError, match="user_mlp"):
        model.load_state_dict(bad)
    assert torch.equal(model.user_gmf, before)
    with pytest.raises(ConfigError, match="missing"):
        model.load_state_dict({"shared": {}})


def test_scores_match_the_reference_forward():
    split = small_split()
    model = FedRecGEL(split, FedRecGELConfig(), generator=gen(11))
    model.client_round(torch.arange(30), 0, gen(12))  # move the private embeddings
    ref = Reference(model)
    users = torch.tensor([3, 0, 29, 3])
    items = torch.randint(0, split.n_items, (4, 7), generator=gen(13))
    scores = model.score(users, items)
    for b, u in enumerate(users.tolist()):
        want = ref.logits(
            model.shared, model.user_gmf[u : u + 1], model.user_mlp[u : u + 1], items[b]
        )
        close(scores[b], want, atol=1e-6)
    full = model.score_all(users)
    assert full.shape == (4, split.n_items)
    close(full.gather(1, items), scores, atol=1e-6)


def test_training_beats_random_ranking():
    data = make_synthetic(n_users=40, n_items=200, seed=3, min_history=20, mean_history=40.0)
    split = leave_one_out(data, seed=3, n_eval_negatives=99)
    model = FedRecGEL(split, FedRecGELConfig(), generator=gen(14))
    users = torch.arange(split.n_users)
    candidates = torch.cat(
        [torch.from_numpy(split.test_items).unsqueeze(1), torch.from_numpy(split.test_negatives)],
        dim=1,
    )

    def hr_at_10() -> float:
        s = model.score(users, candidates)
        rank = (s[:, 1:] > s[:, :1]).sum(1)
        return float((rank < 10).double().mean())

    start = hr_at_10()
    losses = []
    for r in range(15):
        updates, stats = model.client_round(users, r, gen(200 + r))
        model.apply_aggregate(
            Aggregate(
                total=updates.dense().sum(0),
                contributors=len(updates),
                denominator=float(len(updates)),
            ),
            r,
        )
        losses.append(stats.loss)
    end = hr_at_10()
    # 100 candidates: a random ranking has HR@10 = 0.1; 40 users give a binomial sd of 0.047.
    assert end >= 0.25, (start, end)
    assert losses[-1] < losses[0]


def test_protocol_layout_and_init():
    split = small_split()
    model = FedRecGEL(split, FedRecGELConfig(), generator=gen(0))
    assert isinstance(model, Recommender)
    n = split.n_items
    assert model.layout.names[:4] == (
        "embed_item_gmf",
        "embed_item_mlp",
        "mlp.0.weight",
        "mlp.0.bias",
    )
    assert dict(zip(model.layout.names, model.layout.shapes, strict=True)) == {
        "embed_item_gmf": (n, 32),
        "embed_item_mlp": (n, 128),
        "mlp.0.weight": (128, 256),
        "mlp.0.bias": (128,),
        "mlp.1.weight": (64, 128),
        "mlp.1.bias": (64,),
        "mlp.2.weight": (32, 64),
        "mlp.2.bias": (32,),
        "predict.weight": (1, 64),
        "predict.bias": (1,),
    }
    wp = model.shared["predict.weight"]
    assert float(wp.abs().max()) <= math.sqrt(3 / 64)
    w0 = model.shared["mlp.0.weight"]
    assert float(w0.abs().max()) <= math.sqrt(6 / (256 + 128))
    assert all(float(model.shared[f"mlp.{k}.bias"].abs().sum()) == 0 for k in range(3))
    assert 0.008 < float(model.user_mlp.std()) < 0.012
    again = FedRecGEL(split, FedRecGELConfig(), generator=gen(0))
    assert torch.equal(again.shared["embed_item_mlp"], model.shared["embed_item_mlp"])


def test_empty_cohort_and_bad_participants():
    split = small_split()
    model = FedRecGEL(split, FedRecGELConfig(), generator=gen(0))
    updates, stats = model.client_round(torch.zeros(0, dtype=torch.long), 0, gen(1))
    assert updates.dense().shape == (0, model.layout.size) and stats.samples == 0
    with pytest.raises(ConfigError, match="distinct"):
        model.client_round(torch.tensor([1, 1]), 0, gen(1))
    with pytest.raises(ConfigError, match="user indices"):
        model.client_round(torch.tensor([30]), 0, gen(1))
    with pytest.raises(ConfigError, match="flat vector"):
        model.apply_aggregate(Aggregate(total=torch.zeros(3), contributors=1, denominator=1.0), 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rho_shared": -0.1}, "rho_shared must be >= 0, got -0.1"),
        ({"rho_private": float("nan")}, "rho_private must be >= 0"),
        ({"client_lr": 0.0}, "client_lr must be a finite number > 0"),
        ({"gmf_dim": 0}, "gmf_dim must be a positive integer"),
        ({"layers": (128, 64)}, r"layers\[0\] must be 2 \* mlp_dim = 256"),
        ({"layers": (256,)}, "layers must be at least two"),
        ({"negatives_from": "test"}, "negatives_from must be"),
        ({"local_steps": 2}, "local_steps must be 1"),
        ({"chunk_size": True}, "chunk_size must be a whole number, got True"),
        ({"chunk_size": 0}, "chunk_size must be a positive integer"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        FedRecGELConfig(**kwargs)
