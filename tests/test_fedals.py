"""fedals: the batched round against a per-client reference, the server step, quality, resume."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import torch

from securefed.config import PrivacyConfig, TrainConfig
from securefed.errors import ConfigError
from securefed.federation.base import Aggregate
from securefed.models.als_math import normal_equations, solve_rows, solve_side
from securefed.models.fedals import FedALS, FedALSConfig, resolve_reg
from securefed.training import train

CFG = FedALSConfig(dim=5, alpha=2.0, reg=0.7, init_std=0.3)
#: The same with one ``reg`` for every row (the private mode's regularisation).
CFG_FLAT = FedALSConfig(dim=5, alpha=2.0, reg=0.7, init_std=0.3, reg_frequency=False)


def _reg(cfg: FedALSConfig, n_obs: float, n_other: int) -> float:
    """A row's L2 weight as docs/models.md states it (frequency-scaled unless switched off)."""
    scaled = resolve_reg(cfg).reg_frequency
    return cfg.reg * (1 + cfg.alpha * n_obs / n_other) if scaled else cfg.reg


def _model(split, cfg=CFG) -> FedALS:
    m = FedALS(split, cfg, generator=torch.Generator().manual_seed(1))
    m.V = m.V.double()
    return m


def _reference_upload(v: torch.Tensor, items: torch.Tensor, cfg: FedALSConfig):
    """One client, written out from the equations (float64, explicit normal equations)."""
    d = v.shape[1]
    a = v.T @ v + _reg(cfg, len(items), v.shape[0]) * torch.eye(d, dtype=v.dtype)
    b = torch.zeros(d, dtype=v.dtype)
    for i in items.tolist():
        a += cfg.alpha * torch.outer(v[i], v[i])
        b += (1 + cfg.alpha) * v[i]
    x = torch.linalg.solve(a, b)
    grad = torch.zeros_like(v)
    count = torch.zeros(v.shape[0], dtype=v.dtype)
    for i in items.tolist():
        grad[i] = (cfg.alpha * (x @ v[i]) - (1 + cfg.alpha)) * x
        count[i] = 1
    return x, torch.cat([grad.reshape(-1), torch.outer(x, x).reshape(-1), count])


@pytest.mark.parametrize("cfg", [CFG, CFG_FLAT], ids=["frequency-reg", "flat-reg"])
def test_batched_round_equals_a_per_client_loop(small_split, cfg):
    m = _model(small_split, cfg)
    # Mixed client sizes, unsorted cohort positions.
    users = torch.tensor([0, 3, 7, 11, 19, 25, 38])
    sizes = {int(u): len(small_split.user_train_items(int(u))) for u in users}
    assert len(set(sizes.values())) > 2
    up, stats = m.client_round(users, 0, None)
    dense = up.dense().double()
    for row, u in enumerate(users.tolist()):
        items = torch.from_numpy(small_split.user_train_items(u))
        x, flat = _reference_upload(m.V, items, cfg)
        torch.testing.assert_close(up.x[row], x, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(dense[row], flat, rtol=1e-5, atol=1e-6)
    ref = torch.stack(
        [
            _reference_upload(m.V, torch.from_numpy(small_split.user_train_items(u)), cfg)[1]
            for u in users.tolist()
        ]
    )
    torch.testing.assert_close(up.norms(), ref.norm(dim=1), rtol=1e-9, atol=1e-9)
    w = torch.linspace(0.2, 1.3, users.shape[0], dtype=torch.float64)
    torch.testing.assert_close(up.weighted_sum(w).double(), w @ ref, rtol=1e-5, atol=1e-5)
    # A subset of the rows, in their order.
    rows = torch.tensor([5, 1])
    torch.testing.assert_close(up.dense(rows).double(), ref[rows], rtol=1e-5, atol=1e-6)
    assert stats.samples == sum(sizes.values())


def test_closed_form_solve_equals_linalg_solve_on_the_normal_equations():
    gen = torch.Generator().manual_seed(0)
    f = torch.randn(30, 6, generator=gen, dtype=torch.float64)
    owner = torch.tensor([0, 0, 1, 2, 2, 2, 4])
    other = torch.tensor([3, 7, 7, 0, 1, 29, 5])
    a, b = normal_equations(f, owner, other, 5, alpha=4.0, reg=0.5)
    for r in range(5):
        sel = other[owner == r]
        want = f.T @ f + 0.5 * torch.eye(6, dtype=torch.float64)
        want = want + 4.0 * f[sel].T @ f[sel]
        torch.testing.assert_close(a[r], want)
        torch.testing.assert_close(b[r], 5.0 * f[sel].sum(0))
    x = solve_side(f, owner, other, 5, alpha=4.0, reg=0.5)
    torch.testing.assert_close(x, torch.linalg.solve(a, b.unsqueeze(2)).squeeze(2))
    torch.testing.assert_close(solve_rows(a, b), x)
    assert torch.all(x[3] == 0)  # a row without observations solves to zero


@pytest.mark.parametrize("cfg", [CFG, CFG_FLAT], ids=["frequency-reg", "flat-reg"])
def test_server_step_is_the_stated_newton_step(small_split, cfg):
    m = _model(small_split, cfg)
    users = torch.arange(small_split.n_users)
    up, _ = m.client_round(users, 0, None)
    v0 = m.V.clone()
    x = up.x
    n = small_split.n_users
    gram = x.T @ x
    counts = torch.bincount(up.pair_item, minlength=small_split.n_items).double()
    data = torch.zeros_like(v0).index_add_(
        0, up.pair_item, up.coef.unsqueeze(1) * x[up.pair_client]
    )
    m.apply_aggregate(
        Aggregate(total=up.weighted_sum(torch.ones(n)), contributors=n, denominator=float(n)), 0
    )
    for i in range(small_split.n_items):
        reg = _reg(cfg, float(counts[i]), n)
        g = gram @ v0[i] + data[i] + reg * v0[i]
        h = gram + reg * torch.eye(5, dtype=torch.float64) + cfg.alpha * counts[i] * gram / n
        want = v0[i] - torch.linalg.solve(h, g)
        torch.testing.assert_close(m.V[i].double(), want, rtol=1e-4, atol=1e-5)


def test_fedals_reaches_centralized_quality_on_movielens(shared_data, tmp_path):
    """The target of the issue at its selected round: sampled >= 0.64, full >= 0.13 (the
    centralized iALS is 0.666 / 0.139); 6 rounds are enough for the check."""
    cfg = TrainConfig(model="fedals", dataset="ml-100k", data_dir=str(shared_data), rounds=6)
    s = train(cfg, out=tmp_path / "r").summary
    assert s["test_hr@10"] >= 0.64 and s["test_full_hr@10"] >= 0.13
    assert s["lift_over_mostpop_test_hr@10"] > 1.5 and s["verdict"] == []


def test_fedals_resume_equals_an_uninterrupted_run(tmp_path):
    base = dict(model="fedals", synthetic_users=60, synthetic_items=200, checkpoint_every=2)
    base["keep_private_state"] = True  # the finished 2-round run is extended to 4 rounds
    whole = train(TrainConfig(rounds=4, **base), out=tmp_path / "a")
    train(TrainConfig(rounds=2, **base), out=tmp_path / "b")
    cfg_path = tmp_path / "b" / "config.toml"
    cfg_path.write_text(cfg_path.read_text().replace("rounds = 2", "rounds = 4"))
    resumed = train(resume=tmp_path / "b")
    assert [m["test_hr@10"] for m in resumed.metrics] == [m["test_hr@10"] for m in whole.metrics]
    torch.testing.assert_close(resumed.model.V, whole.model.V)


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [None, 0.5])
def test_secagg_sum_matches_plain_and_noise_is_accounted(tmp_path, fraction):
    base = dict(
        model="fedals", synthetic_users=40, synthetic_items=250, rounds=2, client_fraction=fraction
    )
    plain = train(TrainConfig(**base), out=tmp_path / "p").summary
    sec = train(TrainConfig(privacy=PrivacyConfig(secagg=True), **base), out=tmp_path / "s")
    assert sec.summary["secagg"] is True
    assert abs(sec.summary["test_hr@10"] - plain["test_hr@10"]) <= 0.005 + 1e-9
    dp = train(TrainConfig(privacy=PrivacyConfig(epsilon=4.0), **base), out=tmp_path / "d")
    ledger = json.loads((tmp_path / "d" / "privacy_ledger.json").read_text())
    assert len(ledger["events"]) == 2 and dp.summary["epsilon"] <= 4.0
    assert dp.summary["baseline_dp_mostpop_epsilon"] == 4.0


def test_private_uploads_have_norm_at_most_one(small_split):
    """The private mode's clip (1) never binds: every upload of a count round and of an ALS
    round has L2 norm <= 1 by construction, whatever the client's number of items."""
    cfg = FedALSConfig(private=True, private_dim=4, min_weight_items=1, gram_items=0)
    m = FedALS(small_split, cfg, generator=torch.Generator().manual_seed(0))
    users = torch.arange(small_split.n_users)
    up, _ = m.client_round(users, 0, None)  # count round
    assert float(up.norms().max()) <= 1 + 1e-6  # float32 weights
    assert float(up.norms().min()) > 0.99  # every client spends its whole unit budget
    torch.testing.assert_close(up.dense().double().norm(dim=1), up.norms(), rtol=1e-5, atol=1e-6)
    total = up.weighted_sum(torch.ones(len(up)))
    m.apply_aggregate(Aggregate(total=total, contributors=len(up), denominator=len(up)), 0)
    assert bool(m.head.any())
    up, _ = m.client_round(users, 1, None)  # ALS round: head items only
    assert float(up.norms().max()) <= 1 + 1e-6  # float32 weights
    assert bool(m.head[up.pair_item].all())
    torch.testing.assert_close(up.dense().double().norm(dim=1), up.norms(), rtol=1e-5, atol=1e-6)
    total = up.weighted_sum(torch.ones(len(up)))
    m.apply_aggregate(Aggregate(total=total, contributors=len(up), denominator=len(up)), 1)
    m.V = m.V * 50.0  # large item factors: the clamp on x_hat . v_i must still bound the rows
    up, _ = m.client_round(users, 2, None)  # Newton round: gradient rows
    assert float(up.norms().max()) <= 1 + 1e-6
    assert bool((up.coef < 0).any()) and float(up.coef.abs().max()) <= 1.0


def test_private_head_is_chosen_from_the_noise_level(small_split):
    """Items whose released count clears head_z noise stds get factors; the rest score by the
    count alone (their factor rows stay exactly zero)."""
    # The ALS round (gram_items 0): the head is the items above the threshold.
    cfg = FedALSConfig(private=True, private_dim=4, head_z=2.0, gram_items=0)
    m = FedALS(small_split, cfg, generator=torch.Generator().manual_seed(0))
    users = torch.arange(small_split.n_users)
    up, _ = m.client_round(users, 0, None)
    total = up.weighted_sum(torch.ones(len(up)))
    noisy = total + torch.randn(total.shape, generator=torch.Generator().manual_seed(1)) * 0.5
    m.apply_aggregate(
        Aggregate(total=noisy, contributors=len(up), denominator=len(up), noise_std=0.5), 0
    )
    counts = m.layout.split(noisy)["count"]
    assert torch.equal(m.head, counts > 1.0)
    assert torch.all(m.V[~m.head] == 0)
    up, _ = m.client_round(users, 1, None)
    m.apply_aggregate(
        Aggregate(
            total=up.weighted_sum(torch.ones(len(up))),
            contributors=len(up),
            denominator=len(up),
            noise_std=0.5,
        ),
        1,
    )
    assert torch.all(m.V[~m.head] == 0) and bool((m.V[m.head] != 0).any())


@pytest.mark.parametrize("ratio", [0.99, 1.01])
def test_count_only_rule_switches_on_users_per_unit_of_noise(small_split, ratio):
    """The rule is decided before any data is read: below the threshold (N sqrt(R) / sigma <
    count_only_below) the run counts only, at or above it it does not; the note says which."""
    from securefed.models.fedals import count_only_ratio, resolve_population

    n, rounds, threshold = small_split.n_users, 3, 400.0
    sigma = n * math.sqrt(rounds) / (threshold * ratio)  # the ratio is threshold * ratio
    cfg = TrainConfig(
        model="fedals",
        rounds=rounds,
        privacy=PrivacyConfig(noise_multiplier=sigma),
        params=FedALSConfig(count_only_below=threshold),
    )
    assert count_only_ratio(cfg, n) == pytest.approx(threshold * ratio)
    got, note = resolve_population(cfg, small_split)
    assert got.params.count_only is (ratio < 1)
    assert ("count-only rule" in note) is (ratio < 1)
    # The same ratio with the budget over another number of rounds decides the same way.
    six = dataclasses.replace(
        cfg, rounds=6, privacy=PrivacyConfig(noise_multiplier=sigma * math.sqrt(2))
    )
    assert resolve_population(six, small_split)[0].params.count_only is (ratio < 1)
    # A setting the user gives is kept.
    given = dataclasses.replace(cfg, params=FedALSConfig(count_only=False))
    assert resolve_population(given, small_split)[0].params.count_only is False


def test_count_only_model_counts_every_round(small_split):
    """With count_only every round is a count round: uploads are count-only with norm <= 1,
    V stays zero, the prior averages the releases and the scores are the count's ranking;
    the switch is part of the server's state and of what clients receive."""
    n = small_split.n_users
    cfg = FedALSConfig(private=True, private_dim=4, count_only=True)
    m = FedALS(small_split, cfg, generator=torch.Generator().manual_seed(0))
    assert m.gram == 0 and "cooc" not in m.layout.names
    users = torch.arange(n)
    gen = torch.Generator().manual_seed(1)
    released = []
    for r in range(2):
        up, _ = m.client_round(users, r, None)
        assert float(up.coef.abs().max()) == 0.0 and float(up.gram_scale.abs().max()) == 0.0
        assert float(up.norms().min()) > 0.99 and float(up.norms().max()) <= 1 + 1e-6
        total = up.weighted_sum(torch.ones(n))
        noisy = total + torch.randn(total.shape, generator=gen) * 0.5
        released.append(m.layout.split(noisy)["count"].double())
        m.apply_aggregate(Aggregate(total=noisy, contributors=n, denominator=n, noise_std=0.5), r)
    assert torch.equal(m.V, torch.zeros_like(m.V))
    torch.testing.assert_close(m.prior.double(), (released[0] + released[1]) / 2)
    scores = m.score_all(users[:3])
    torch.testing.assert_close(
        scores, torch.log1p(m.prior.clamp_min(0)).expand(3, -1), rtol=0, atol=1e-6
    )
    fresh = FedALS(small_split, FedALSConfig(private=True, private_dim=4), generator=gen)
    fresh.load_state_dict(m.state_dict())
    assert fresh.count_only
    client = FedALS(
        small_split, FedALSConfig(private=True, private_dim=4, gram_items=0), generator=gen
    )
    client.set_global_parameters(m.global_parameters())
    assert client.count_only and client._counting()


def _gram_model(split, big=12, dim=3):
    cfg = FedALSConfig(private=True, private_dim=dim, gram_items=big, gram_scale=2.0)
    m = FedALS(split, cfg, generator=torch.Generator().manual_seed(0))
    users = torch.arange(split.n_users)
    up, _ = m.client_round(users, 0, None)  # count round
    total = up.weighted_sum(torch.ones(len(up)))
    m.apply_aggregate(Aggregate(total=total, contributors=len(up), denominator=len(up)), 0)
    return m, users


def test_cooccurrence_upload_is_every_pair_of_head_items_at_unit_norm(small_split):
    """A co-occurrence round's upload, written out per client: the head is the gram_items
    items with the largest released counts; a client with k >= 2 of them sends
    sqrt(2 / (k (k - 1))) at each of its pairs (upper triangle, row by row), nothing else;
    fewer than 2, nothing. Norm exactly 1 (or 0); dense, norms and sums agree."""
    big = 12
    m, users = _gram_model(small_split, big)
    order = torch.argsort(m.prior, descending=True, stable=True)
    assert torch.equal(torch.nonzero(m.head).reshape(-1), torch.sort(order[:big]).values)
    assert torch.equal(m.V, torch.zeros_like(m.V))
    up, _ = m.client_round(users, 1, None)
    dense = up.dense().double()
    parts = m.layout.split(dense)
    assert float(parts["item_grad"].abs().max()) == 0 and float(parts["count"].abs().max()) == 0
    assert float(parts["gram"].abs().max()) == 0
    position = {int(i): p for p, i in enumerate(torch.nonzero(m.head).reshape(-1).tolist())}
    rows, cols = torch.triu_indices(big, big, offset=1)
    flat = {(int(a), int(b)): q for q, (a, b) in enumerate(zip(rows, cols, strict=True))}
    seen_small = seen_big = False
    for c in range(small_split.n_users):
        mine = sorted(
            position[i] for i in small_split.user_train_items(c).tolist() if i in position
        )
        want = torch.zeros(big * (big - 1) // 2, dtype=torch.float64)
        k = len(mine)
        for a in range(k):
            for b in range(a + 1, k):
                want[flat[(mine[a], mine[b])]] = math.sqrt(2.0 / (k * (k - 1)))
        torch.testing.assert_close(parts["cooc"][c], want, rtol=1e-6, atol=1e-7)
        assert float(up.norms()[c]) == pytest.approx(1.0 if k >= 2 else 0.0, abs=1e-6)
        seen_small |= k < 2
        seen_big |= k >= 3
    assert seen_small and seen_big  # both branches of the upload are exercised
    w = torch.rand(len(up), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    torch.testing.assert_close(
        up.weighted_sum(w).double(), (w.unsqueeze(1) * dense).sum(0), rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(up.norms(), dense.norm(dim=1), rtol=1e-6, atol=1e-6)


def _symmetric(packed: torch.Tensor, size: int) -> torch.Tensor:
    """The symmetric ``[size, size]`` matrix (zero diagonal) whose upper triangle, row by row,
    is ``packed`` (one upload's ``cooc`` part), in float64."""
    rows, cols = torch.triu_indices(size, size, offset=1)
    full = torch.zeros(size, size, dtype=torch.float64)
    full[rows, cols] = packed.double()
    return full + full.T


def test_audit_items_join_the_cooccurrence_set_and_the_canary_reads_their_row(small_split):
    """``gram_audit_items`` (set by ``securefed audit``): the catalogue's last items join the
    co-occurrence set beside the ``gram_items`` most counted others, the layout grows by
    them, and the audit hook ``canary_extra`` returns exactly item ``i``'s row of each
    upload's co-occurrence matrix (zero at itself; zeros for an item outside the set; no
    columns in a count round)."""
    from securefed.models.fedals import SPEC, gram_size

    big, audit_items = 8, 3
    cfg = FedALSConfig(
        private=True, private_dim=3, gram_items=big, gram_scale=2.0, gram_audit_items=audit_items
    )
    n = small_split.n_items
    assert gram_size(cfg, n) == big + audit_items
    assert gram_size(dataclasses.replace(cfg, gram_items=0), n) == 0  # ALS mode: no set
    m = FedALS(small_split, cfg, generator=torch.Generator().manual_seed(0))
    users = torch.arange(small_split.n_users)
    hook = SPEC.observer.canary_extra
    up, _ = m.client_round(users, 0, None)  # count round: no co-occurrence part yet
    assert hook(up.dense(), _public(m), torch.zeros(len(up), dtype=torch.long)).shape[1] == 0
    total = up.weighted_sum(torch.ones(len(up)))
    m.apply_aggregate(Aggregate(total=total, contributors=len(up), denominator=len(up)), 0)
    members = torch.nonzero(m.head).reshape(-1)
    g = big + audit_items
    assert members.numel() == g and torch.equal(members[-audit_items:], torch.arange(n - 3, n))
    top = torch.argsort(m.prior[: n - audit_items], descending=True, stable=True)[:big]
    assert torch.equal(members[:-audit_items], torch.sort(top).values)
    gb = _public(m)
    up, _ = m.client_round(users, 1, None)
    flat = up.dense()
    cooc = m.layout.split(flat.double())["cooc"]
    outside = int(torch.nonzero(~m.head)[0])
    read = 0.0
    for item in [int(members[0]), int(members[5]), n - 1, outside]:
        at = torch.full((len(up),), item, dtype=torch.long)
        got = hook(flat, gb, at).double()
        assert got.shape == (len(up), g)
        for c in range(len(up)):
            full = _symmetric(cooc[c], g)
            want = (
                full[(members == item).nonzero().reshape(-1)[0]] if item != outside else 0 * full[0]
            )
            torch.testing.assert_close(got[c], want, rtol=0, atol=0)
        read += float(got.abs().sum()) if item != outside else 0.0
    assert read > 0  # the rows read are not all empty


def test_canary_reads_its_row_where_the_noise_leaves_fewer_cooccurrence_items(small_split):
    """With ``gram_head_z`` the co-occurrence set can be smaller than the part's room: the
    items it keeps (the audit's among them) take its first positions, and ``canary_extra``
    still reads exactly an item's row over them (the part's size read from the upload)."""
    from securefed.models.fedals import SPEC

    big, audit_items, sigma, kept = 8, 3, 0.5, 4
    n = small_split.n_items
    users = torch.arange(small_split.n_users)

    def model(z: float) -> FedALS:
        cfg = FedALSConfig(
            private=True,
            private_dim=3,
            gram_items=big,
            gram_audit_items=audit_items,
            gram_head_z=z,
        )
        return FedALS(small_split, cfg, generator=torch.Generator().manual_seed(0))

    probe = model(0.0)
    up, _ = probe.client_round(users, 0, None)
    total = up.weighted_sum(torch.ones(len(up)))
    noisy = total + torch.randn(total.shape, generator=torch.Generator().manual_seed(6)) * sigma
    counts = probe.layout.split(noisy)["count"][: n - audit_items]
    top = torch.sort(counts, descending=True).values
    m = model(float(top[kept - 1] + top[kept]) / 2 / sigma)
    m.apply_aggregate(
        Aggregate(total=noisy, contributors=len(up), denominator=len(up), noise_std=sigma), 0
    )
    members = torch.nonzero(m.head).reshape(-1)
    g, room = kept + audit_items, big + audit_items
    assert members.numel() == g and torch.equal(members[-audit_items:], torch.arange(n - 3, n))
    gb = _public(m)
    up, _ = m.client_round(users, 1, None)
    flat = up.dense()
    cooc = m.layout.split(flat.double())["cooc"]
    hook = SPEC.observer.canary_extra
    read = 0.0
    for position in (0, kept - 1, g - 1):
        at = torch.full((len(up),), int(members[position]), dtype=torch.long)
        got = hook(flat, gb, at).double()
        assert got.shape == (len(up), g)
        for c in range(len(up)):
            full = _symmetric(cooc[c], room)
            torch.testing.assert_close(got[c], full[position, :g], rtol=0, atol=0)
        read += float(got.abs().sum())
    assert read > 0


def test_options_without_their_rounds_are_refused(small_split):
    """gram_head_z needs a count round to read the noise from; tail_counts and gram_head_z
    need co-occurrence rounds."""
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ConfigError, match="count_rounds = 0 releases no count"):
        FedALS(
            small_split,
            FedALSConfig(private=True, gram_items=8, count_rounds=0, gram_head_z=2.0),
            generator=gen,
        )
    for option in ({"tail_counts": True}, {"gram_head_z": 1.0}):
        with pytest.raises(ConfigError, match="gram_items = 0 has none"):
            FedALS(small_split, FedALSConfig(private=True, gram_items=0, **option), generator=gen)


def _public(model):
    from securefed.training import public_state

    return public_state(model)


def test_cooccurrence_rounds_set_head_factors_from_the_averaged_release(small_split):
    """The server averages the co-occurrence releases and sets the head items' factors to
    gram_scale * u_j sqrt(lambda_j / lambda_1) of the d leading eigenpairs (other items
    none); a checkpoint restores the sum and the factors exactly."""
    big, dim = 12, 3
    m, users = _gram_model(small_split, big, dim)
    gen = torch.Generator().manual_seed(3)
    prior_after_count = m.prior.clone()
    released = []
    for r in (1, 2):
        up, _ = m.client_round(users, r, None)
        total = up.weighted_sum(torch.ones(len(up)))
        noisy = total + torch.randn(total.shape, generator=gen) * 0.3
        released.append(m.layout.split(noisy.double())["cooc"])
        m.apply_aggregate(
            Aggregate(total=noisy, contributors=len(up), denominator=len(up), noise_std=0.3), r
        )
    # The co-occurrence uploads carry no count: the prior stays the count round's release.
    torch.testing.assert_close(m.prior, prior_after_count)
    mean = (released[0] + released[1]) / 2
    rows, cols = torch.triu_indices(big, big, offset=1)
    c = torch.zeros(big, big, dtype=torch.float64)
    c[rows, cols] = mean
    c = c + c.T
    evals, evecs = torch.linalg.eigh(c)
    lam, u = evals.flip(0)[:dim].clamp_min(0), evecs.flip(1)[:, :dim]
    head_v = m.V[m.head].double()
    want = 2.0 * u * torch.sqrt(lam / lam[0])
    # Eigenvectors are defined up to sign: compare column by column.
    for j in range(dim):
        sign = 1.0 if float(head_v[:, j] @ want[:, j]) >= 0 else -1.0
        torch.testing.assert_close(head_v[:, j], sign * want[:, j], rtol=1e-4, atol=1e-5)
    assert torch.equal(m.V[~m.head], torch.zeros_like(m.V[~m.head]))
    fresh = FedALS(small_split, m.config, generator=torch.Generator().manual_seed(9))
    fresh.load_state_dict(m.state_dict())
    assert torch.equal(fresh.V, m.V) and fresh._cooc_releases == 2
    fresh._set_gram_factors()
    torch.testing.assert_close(fresh.V, m.V)
    with pytest.raises(ConfigError, match="cooc_sum"):
        other = FedALS(
            small_split, dataclasses.replace(m.config, gram_items=big - 1), generator=gen
        )
        other.load_state_dict(m.state_dict())


def test_tail_counts_ride_the_cooccurrence_rounds_at_unit_norm(small_split):
    """tail_counts: in a co-occurrence round a client with n items, t of them without a
    factor, counts each of those 1 / sqrt(n) (the count round's weight) and scales its pairs
    by sqrt(1 - t / n): norm exactly 1 with k >= 2 head items; the server folds each
    release's tail counts into the tail's count with the count round's precision, the head's
    count stays the count round's."""
    big = 12
    cfg = FedALSConfig(private=True, private_dim=3, gram_items=big, tail_counts=True)
    m = FedALS(small_split, cfg, generator=torch.Generator().manual_seed(0))
    users = torch.arange(small_split.n_users)
    gen = torch.Generator().manual_seed(5)
    up, _ = m.client_round(users, 0, None)
    total = up.weighted_sum(torch.ones(len(up)))
    noisy = total + torch.randn(total.shape, generator=gen) * 0.4
    m.apply_aggregate(
        Aggregate(total=noisy, contributors=len(up), denominator=len(up), noise_std=0.4), 0
    )
    released = [m.layout.split(noisy.double())["count"]]
    head = m.head.clone()
    position = {int(i): p for p, i in enumerate(torch.nonzero(head).reshape(-1).tolist())}
    rows, cols = torch.triu_indices(big, big, offset=1)
    flat = {(int(a), int(b)): q for q, (a, b) in enumerate(zip(rows, cols, strict=True))}
    for r in (1, 2):
        up, _ = m.client_round(users, r, None)
        parts = m.layout.split(up.dense().double())
        assert float(parts["item_grad"].abs().max()) == 0 and float(parts["gram"].abs().max()) == 0
        for c in range(small_split.n_users):
            items = small_split.user_train_items(c).tolist()
            n = len(items)
            tail = [i for i in items if not bool(head[i])]
            want_count = torch.zeros(small_split.n_items, dtype=torch.float64)
            want_count[tail] = 1.0 / math.sqrt(n)
            torch.testing.assert_close(parts["count"][c], want_count, rtol=1e-6, atol=1e-7)
            mine = sorted(position[i] for i in items if i in position)
            k = len(mine)
            want = torch.zeros(big * (big - 1) // 2, dtype=torch.float64)
            for a in range(k):
                for b in range(a + 1, k):
                    want[flat[(mine[a], mine[b])]] = math.sqrt(
                        2.0 / (k * (k - 1)) * (1.0 - len(tail) / n)
                    )
            torch.testing.assert_close(parts["cooc"][c], want, rtol=1e-6, atol=1e-7)
            norm = float(up.norms()[c])
            assert norm <= 1 + 1e-6
            if k >= 2:
                assert norm == pytest.approx(1.0, abs=1e-6)
        total = up.weighted_sum(torch.ones(len(up)))
        noisy = total + torch.randn(total.shape, generator=gen) * 0.4
        released.append(m.layout.split(noisy.double())["count"])
        m.apply_aggregate(
            Aggregate(total=noisy, contributors=len(up), denominator=len(up), noise_std=0.4), r
        )
    assert torch.equal(m.head, head)
    want_prior = released[0].clone()
    want_prior[~head] = sum(rel[~head] for rel in released) / 3
    torch.testing.assert_close(m.prior.double(), want_prior, rtol=1e-5, atol=1e-6)
    fresh = FedALS(small_split, cfg, generator=torch.Generator().manual_seed(2))
    fresh.load_state_dict(m.state_dict())
    assert fresh._cooc_releases == 2  # the tail's count has 1 + 2 releases' precision
    with pytest.raises(ConfigError, match="tail_counts"):
        FedALSConfig(private=True, tail_counts=True, count_items=20)


def test_cooccurrence_items_are_those_whose_count_clears_the_noise(small_split):
    """gram_head_z: of the gram_items most counted items only those whose released count
    exceeds gram_head_z noise stds get co-occurrence pairs and factors; the factors come
    from the release's block of those items alone (the unused positions hold noise only)."""
    big, dim, sigma, kept = 12, 3, 0.5, 5
    users = torch.arange(small_split.n_users)
    gen = torch.Generator().manual_seed(4)

    def model(z: float) -> FedALS:
        cfg = FedALSConfig(
            private=True, private_dim=dim, gram_items=big, gram_head_z=z, gram_scale=2.0
        )
        return FedALS(small_split, cfg, generator=torch.Generator().manual_seed(0))

    probe = model(0.0)
    up, _ = probe.client_round(users, 0, None)
    total = up.weighted_sum(torch.ones(len(up)))
    noisy = total + torch.randn(total.shape, generator=gen) * sigma
    counts = probe.layout.split(noisy)["count"]
    top = torch.sort(counts, descending=True).values
    z = float(top[kept - 1] + top[kept]) / 2 / sigma
    m = model(z)
    m.apply_aggregate(
        Aggregate(total=noisy, contributors=len(up), denominator=len(up), noise_std=sigma), 0
    )
    assert torch.equal(m.head, counts > z * sigma) and int(m.head.sum()) == kept
    rows, cols = torch.triu_indices(big, big, offset=1)
    released = []
    for r in (1, 2):
        up, _ = m.client_round(users, r, None)
        cooc = m.layout.split(up.dense().double())["cooc"]
        assert float(cooc[:, cols >= kept].abs().max()) == 0.0  # pairs of kept items only
        assert float(cooc.abs().max()) > 0
        total = up.weighted_sum(torch.ones(len(up)))
        noisy = total + torch.randn(total.shape, generator=gen) * 0.3
        released.append(m.layout.split(noisy.double())["cooc"])
        m.apply_aggregate(
            Aggregate(total=noisy, contributors=len(up), denominator=len(up), noise_std=0.3), r
        )
    c = torch.zeros(big, big, dtype=torch.float64)
    c[rows, cols] = (released[0] + released[1]) / 2
    c = c[:kept, :kept] + c[:kept, :kept].T
    evals, evecs = torch.linalg.eigh(c)
    lam, u = evals.flip(0)[:dim].clamp_min(0), evecs.flip(1)[:, :dim]
    want = 2.0 * u * torch.sqrt(lam / lam[0])
    head_v = m.V[m.head].double()
    for j in range(dim):
        sign = 1.0 if float(head_v[:, j] @ want[:, j]) >= 0 else -1.0
        torch.testing.assert_close(head_v[:, j], sign * want[:, j], rtol=1e-4, atol=1e-5)
    assert torch.equal(m.V[~m.head], torch.zeros_like(m.V[~m.head]))


def test_layout_size_of_the_registry_matches_the_model(small_split):
    from securefed.models.fedals import SPEC

    for cfg in (
        FedALSConfig(),
        FedALSConfig(private=True, private_dim=4),
        FedALSConfig(private=True, private_dim=4, gram_items=0),
        FedALSConfig(private=True, private_dim=4, gram_items=10_000),
        FedALSConfig(private=True, private_dim=4, count_only=True),
    ):
        m = FedALS(small_split, cfg, generator=torch.Generator().manual_seed(0))
        assert SPEC.layout_size(cfg, small_split) == m.layout.size


def test_private_newton_round_is_the_stated_step(small_split):
    """A private ALS round after the first is fedals's Newton step on the weighted objective:
    without noise, V moves as the equations say."""
    cfg = FedALSConfig(
        private=True, private_dim=3, shares=(0.5, 0.3, 0.2), head_z=0.0, gram_items=0
    )
    m = FedALS(small_split, cfg, generator=torch.Generator().manual_seed(0))
    users = torch.arange(small_split.n_users)
    n = small_split.n_users
    for r in range(2):  # the count round, then the first (direct) ALS round
        up, _ = m.client_round(users, r, None)
        total = up.weighted_sum(torch.ones(n))
        m.apply_aggregate(Aggregate(total=total, contributors=n, denominator=n), r)
    v0 = m.V.double().clone()
    up, _ = m.client_round(users, 2, None)
    x, a = up.x.double(), cfg.alpha
    local, items = up.pair_client, up.pair_item
    w = 1.0 / torch.bincount(local, minlength=n).double().clamp_min(1).sqrt()
    s = (x[local] * v0[items]).sum(1).clamp(-1, 1)
    data = torch.zeros_like(v0).index_add_(
        0, items, (w[local] * (a * s - (1 + a))).unsqueeze(1) * x[local]
    )
    gram = x.T @ x
    total = up.weighted_sum(torch.ones(n))
    m.apply_aggregate(Aggregate(total=total, contributors=n, denominator=n), 2)
    counts = m.prior.double().clamp_min(0)  # both rounds' counts, combined as the server does
    checked = 0
    for i in torch.nonzero(m.head).squeeze(1).tolist()[:10]:
        g = gram @ v0[i] + data[i] + cfg.item_reg * v0[i]
        h = gram * (1 + a * counts[i] / n) + cfg.item_reg * torch.eye(3, dtype=torch.float64)
        want = v0[i] - torch.linalg.solve(h, g)
        torch.testing.assert_close(m.V[i].double(), want, rtol=1e-3, atol=1e-4)
        checked += 1
    assert checked == 10


def test_private_fedals_beats_dp_mostpop_on_movielens(shared_data, tmp_path):
    """At epsilon 2 (user-level, delta 1e-5) the private mode beats DP-MostPop at the same
    epsilon on the same split, sampled and full HR@10 (seed 0; 3 seeds in docs/privacy.md).
    A replay run: with OS noise the sampled margin (0.455 +- 0.005 against 0.420, 3 seeds)
    would fail on an unlucky draw; the seeded draw is the measured one."""
    cfg = TrainConfig(
        model="fedals",
        dataset="ml-100k",
        data_dir=str(shared_data),
        privacy=PrivacyConfig(epsilon=2.0, replay=True),
    )
    s = train(cfg, out=tmp_path / "r").summary
    assert s["rounds"] == 3 and s["epsilon"] <= 2.0
    assert s["test_hr@10"] >= s["baseline_dp_mostpop_test_hr@10"]
    assert s["test_full_hr@10"] >= s["baseline_dp_mostpop_test_full_hr@10"]
    assert s["verdict"] == []


def test_private_fedals_beats_dp_mostpop_on_filmtrust(shared_data, tmp_path):
    """FilmTrust at epsilon 2, where the noise-limited head rule fires (14 % of the 400 most
    counted items clear 3 noise stds): above DP-MostPop in sampled and full HR@10 (seed 0,
    replay: +0.007 / +0.012; the mode without the rule reads +0.000 / +0.001 on this draw,
    ten seeds in docs/privacy.md, "A noise-limited head")."""
    cfg = TrainConfig(
        model="fedals",
        dataset="filmtrust",
        data_dir=str(shared_data),
        privacy=PrivacyConfig(epsilon=2.0, replay=True),
    )
    result = train(cfg, out=tmp_path / "r")
    s = result.summary
    assert result.model.sparse_head and 0 < int(result.model.head.sum()) < 200
    kept = int(result.model.head.sum())
    (note,) = s["model_notes"]  # what the run decided, in its summary and printed
    assert "noise-limited head rule" in note and f"fired ({kept / 400:.0%} cleared them)" in note
    assert f"factors for the {kept} items" in note
    assert s["test_hr@10"] > s["baseline_dp_mostpop_test_hr@10"]
    assert s["test_full_hr@10"] > s["baseline_dp_mostpop_test_full_hr@10"]
    # Below the non-private count (0.897 against 0.912 sampled): said, not a DP-MostPop loss.
    assert not any("DP-MostPop" in line for line in s["verdict"])


def test_train_prints_what_the_private_mode_decided(shared_data, tmp_path):
    """``securefed train`` prints the run's model notes (the noise-limited head rule fired on
    FilmTrust at epsilon 2) and reports the last round without a choice."""
    from typer.testing import CliRunner

    from securefed.cli import app

    args = ["train", "--dataset", "filmtrust", "--data-dir", str(shared_data), "--epsilon", "2"]
    res = CliRunner().invoke(app, [*args, "--replay-from-seed", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "noise-limited head rule (fewer than 50% of the 400 most counted items" in text
    assert "fired (" in text and "reported round 3 (the last evaluated round: no choice)" in text


# ---------------------------------------------------------------- the regularisation rule


def test_rule_scales_rows_by_their_confidence_on_movielens_and_filmtrust_shapes():
    """The rule's weights for the shapes of MovieLens 100K (943 users, 1,682 items; most
    popular film 575 users, mean user 104 items) and FilmTrust (1,227 users, 2,059 items;
    most popular film 886 users, mean user 26 items): a row without observations keeps
    ``reg`` 10, FilmTrust's most popular film (72 % of its users) gets 3.2 times that."""
    from securefed.models.als_math import frequency_reg

    def weights(counts, n_other):
        return frequency_reg(torch.tensor(counts), n_other, alpha=3.0, reg=10.0).tolist()

    ml_items = weights([0, 26, 575], 943)
    ft_items = weights([0, 2, 886], 1227)
    assert ml_items == pytest.approx([10.0, 10.827, 28.293], abs=1e-3)
    assert ft_items == pytest.approx([10.0, 10.049, 31.663], abs=1e-3)
    assert weights([104], 1682) == pytest.approx([11.855], abs=1e-3)  # ML-100K mean user
    assert weights([26], 2059) == pytest.approx([10.379], abs=1e-3)  # FilmTrust mean user
    # Gowalla's rows (29,858 users, 40,981 places; busiest place 1,877 users, busiest user
    # 911 places) stay within 1.19 times reg: there the rule is about one reg for every row.
    assert weights([1877], 29858) + weights([911], 40981) == pytest.approx(
        [11.886, 10.667], abs=1e-3
    )
    # What the rule resolves to: scaled without DP, one reg in the private mode.
    assert resolve_reg(FedALSConfig()).reg_frequency is True
    assert resolve_reg(FedALSConfig(private=True)).reg_frequency is False
    assert resolve_reg(FedALSConfig()).reg == 10.0 and resolve_reg(FedALSConfig()).dim is None


def test_dim_follows_the_catalogue_unless_given(tmp_path):
    """``dim`` 32 below LARGE_CATALOGUE items, 64 from it (docs/models.md, *Dimension*); a
    given value wins; the private mode uses ``private_dim``; config.toml records the choice
    for fedals and for the centralized iALS, and the model is built at that size."""
    import tomllib

    from securefed.models.fedals import LARGE_CATALOGUE, resolve_dim

    assert LARGE_CATALOGUE == 10_000
    assert resolve_dim(FedALSConfig(), 1682).dim == 32
    assert resolve_dim(FedALSConfig(), LARGE_CATALOGUE - 1).dim == 32
    assert resolve_dim(FedALSConfig(), LARGE_CATALOGUE).dim == 64
    assert resolve_dim(FedALSConfig(dim=8), 40_981).dim == 8
    assert resolve_dim(FedALSConfig(private=True), 40_981).factor_dim == 16
    with pytest.raises(ValueError, match="resolve it from the catalogue"):
        _ = FedALSConfig().factor_dim
    for model in ("fedals", "ials"):
        for items, want in ((200, 32), (LARGE_CATALOGUE, 64)):
            out = tmp_path / f"{model}-{items}"
            cfg = TrainConfig(model=model, synthetic_users=40, synthetic_items=items, rounds=1)
            res = train(cfg, out=out)
            table = tomllib.loads((out / "config.toml").read_text())[model]
            assert table["dim"] == want
            assert tuple(res.model.V.shape) == (items, want)


def test_settings_the_user_gives_win_over_the_rule():
    from securefed.models.registry import get_spec, params_from_flags

    spec = get_spec("fedals")
    p = TrainConfig(
        model="fedals", params=params_from_flags(spec, {"dim": 8, "reg_frequency": False})
    ).params
    assert (p.dim, p.reg, p.reg_frequency) == (8, 10.0, False)
    p = TrainConfig(model="fedals", params=params_from_flags(spec, {"reg": 3.0})).params
    assert (p.reg, p.reg_frequency) == (3.0, True)
    # Under user-level DP the private mode keeps one reg; asking it to scale is an error.
    dp = PrivacyConfig(epsilon=2.0)
    assert TrainConfig(model="fedals", privacy=dp).params.reg_frequency is False
    with pytest.raises(ConfigError, match="reg_frequency applies without DP"):
        TrainConfig(model="fedals", privacy=dp, params=FedALSConfig(reg_frequency=True))
    with pytest.raises(ConfigError, match="reg_frequency must be"):
        FedALSConfig(reg_frequency=1)  # type: ignore[arg-type]
    # The centralized reference follows the same rule, and an explicit setting wins there too.
    assert TrainConfig(model="ials").params.reg_frequency is True
    ials = TrainConfig(model="ials", params=FedALSConfig(reg_frequency=False)).params
    assert ials.reg_frequency is False


def test_resolved_rule_is_written_to_config_toml_and_kept_on_resume(tmp_path):
    import tomllib

    # keep_private_state: a finished run keeps what extending it by a round needs.
    base = dict(
        model="fedals",
        synthetic_users=60,
        synthetic_items=200,
        checkpoint_every=1,
        keep_private_state=True,
    )
    first = train(TrainConfig(rounds=1, **base), out=tmp_path / "r")
    cfg_path = tmp_path / "r" / "config.toml"
    table = tomllib.loads(cfg_path.read_text())["fedals"]
    assert table["reg_frequency"] is True and table["reg"] == 10.0 and table["dim"] == 32
    assert first.model.config.reg_frequency is True
    cfg_path.write_text(re.sub(r"(?m)^rounds = 1$", "rounds = 2", cfg_path.read_text()))
    resumed = train(resume=tmp_path / "r")
    assert resumed.model.config == first.model.config
    # An explicit setting is what the file records, and what a resume runs.
    flat = TrainConfig(rounds=1, params=FedALSConfig(reg_frequency=False), **base)
    train(flat, out=tmp_path / "f")
    table = tomllib.loads((tmp_path / "f" / "config.toml").read_text())["fedals"]
    assert table["reg_frequency"] is False
    f_path = tmp_path / "f" / "config.toml"
    f_path.write_text(re.sub(r"(?m)^rounds = 1$", "rounds = 2", f_path.read_text()))
    assert train(resume=tmp_path / "f").model.config.reg_frequency is False


def test_tail_last_ranks_items_without_a_factor_below_the_head_by_count(small_split):
    """With tail_last, every item without a factor scores below every item with one, and the
    tail is ordered by its released count; without it the tail scores its (weighted) count."""
    cfg = FedALSConfig(private=True, private_dim=4, population="large")
    m = FedALS(small_split, cfg, generator=torch.Generator().manual_seed(0))
    assert (m.config.head_z, m.config.prior_weight, m.config.tail_last) == (3.0, 0.0, True)
    n_items = small_split.n_items
    gen = torch.Generator().manual_seed(11)  # not the global RNG: other tests move it
    m.prior = torch.linspace(-1.0, 30.0, n_items)[torch.randperm(n_items, generator=gen)]
    m.head = m.prior > 12.0
    m.V = torch.randn(n_items, 4, generator=gen) * 3.0
    m.V[~m.head] = 0.0
    users = torch.arange(small_split.n_users)
    scores = m.score_all(users)
    head, tail = scores[:, m.head], scores[:, ~m.head]
    assert bool((head.min(1).values > tail.max(1).values).all())
    order = torch.argsort(m.prior[~m.head])
    assert bool((tail[:, order].diff(dim=1) >= 0).all())
    sampled = m.score(users[:3], torch.arange(n_items).expand(3, n_items))
    # Two float32 summation orders of the same dot products (a product near 0 can differ by
    # more than allclose's default atol of 1e-8).
    assert torch.allclose(sampled, scores[:3], atol=1e-5)
    # The small mode's scores: the tail is its weighted count, above the negative head scores.
    small = FedALS(
        small_split,
        FedALSConfig(private=True, private_dim=4, population="small"),
        generator=torch.Generator().manual_seed(0),
    )
    small.prior, small.head, small.V = m.prior, m.head, m.V
    tail_small = small.score_all(users)[:, ~m.head]
    expected = small.config.prior_weight * torch.log1p(m.prior.clamp_min(0))[~m.head]
    assert torch.allclose(tail_small, expected.expand_as(tail_small))


@pytest.mark.parametrize("sigma, expect", [(5.0, "small"), (0.01, "large")])
def test_population_rule_is_recorded_and_sets_the_large_mode(tmp_path, sigma, expect):
    """N / sigma below large_above gives the small mode; at or above it the large mode with
    four rounds; config.toml records the choice, the settings and the rounds."""
    from securefed.config import load_config_file

    cfg = TrainConfig(
        model="fedals",
        synthetic_users=200,
        synthetic_items=300,
        privacy=PrivacyConfig(noise_multiplier=sigma),
    )
    assert cfg.rounds == 3 and cfg.params.population is None
    notes: list[str] = []
    res = train(cfg, out=tmp_path / "run", on_start=lambda start: notes.extend(start.notes))
    raw = load_config_file(tmp_path / "run" / "config.toml")
    assert raw["fedals"]["population"] == expect
    assert len(notes) == 1 and f"{expect} population" in notes[0]
    assert raw["rounds"] == (4 if expect == "large" else 3)
    assert raw["fedals"]["head_z"] == (3.0 if expect == "large" else 0.0)
    assert raw["fedals"]["tail_last"] is (expect == "large")
    # Two count rounds of the large mode's four (the count ranks every item without a factor).
    assert raw["fedals"]["count_rounds"] == (2 if expect == "large" else 1)
    # Co-occurrence rounds in both populations; the large one's items from the noise level:
    # 200 users x sqrt(4 rounds) / 0.01 = 40,000 per unit of noise, / 15 = 2,667 -> 2,700.
    assert raw["fedals"]["gram_items"] == (2700 if expect == "large" else 400)
    if expect == "large":
        assert "2,700 co-occurrence items: 40,000 users per unit of noise" in notes[0]
    # Either mode reports its last round (no choice on validation).
    assert raw.get("select_on") == "last"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["selection"] == "the last evaluated round"
    assert summary["selected_round"] == len(res.metrics)
    if expect == "small":
        # 200 users at sigma 5 is count-only (no co-occurrence set, no rule to report).
        assert res.model.count_only and "model_notes" not in summary
        assert "the last round reported" in notes[0]
    assert len(res.metrics) == raw["rounds"]
    # The count's precision: the large mode combined its two count rounds and no more (its
    # co-occurrence uploads carry no count); at sigma 5 the small run is all count rounds.
    assert raw["fedals"]["count_only"] is (expect == "small")
    assert res.model._prior_precision == (2.0 if expect == "large" else 3.0)


def test_large_mode_cooccurrence_items_follow_the_noise_level(small_split):
    """``gram_items`` unset in the large mode: one item per 15 users per unit of noise, to
    the nearest 100, within 400-4,000 (Gowalla at epsilon 2 / 4 / 8: ratios 14,842 / 27,545 /
    49,664 give 1,000 / 1,800 / 3,300); a value given is kept; the small mode keeps 400."""
    from securefed.models.fedals import large_gram_items, resolve_population

    assert [large_gram_items(r) for r in (14_842, 27_545, 49_664)] == [1000, 1800, 3300]
    assert large_gram_items(100.0) == 400 and large_gram_items(1e9) == 4000
    assert large_gram_items(math.inf) == 4000
    # N / sigma = 4,000 (large); N sqrt(4) / sigma = 8,000 -> 533 -> 500 items.
    sigma = small_split.n_users / 4000
    base = dict(model="fedals", privacy=PrivacyConfig(noise_multiplier=sigma))
    got, _ = resolve_population(TrainConfig(**base), small_split)
    assert got.params.population == "large" and got.rounds == 4
    assert got.params.gram_items == 500
    assert got.params.count_rounds == 2
    got, _ = resolve_population(
        TrainConfig(**base, params=FedALSConfig(gram_items=600)), small_split
    )
    assert got.params.gram_items == 600
    # The ALS mode (no co-occurrence) keeps one count round; a count given is kept.
    got, _ = resolve_population(TrainConfig(**base, params=FedALSConfig(gram_items=0)), small_split)
    assert got.params.count_rounds == 1
    got, _ = resolve_population(
        TrainConfig(**base, params=FedALSConfig(count_rounds=3)), small_split
    )
    assert got.params.count_rounds == 3
    got, _ = resolve_population(
        TrainConfig(**base, params=FedALSConfig(population="small")), small_split
    )
    assert got.params.gram_items == 400


def test_population_rule_keeps_what_the_user_set(small_split):
    from securefed.models.fedals import population_ratio, resolve_population

    base = dict(model="fedals", privacy=PrivacyConfig(noise_multiplier=0.01))
    ratio = population_ratio(TrainConfig(**base), small_split.n_users)
    assert ratio == pytest.approx(small_split.n_users / 0.01)
    # Rounds given other than the private default stay; a head_z given stays.
    got, note = resolve_population(
        TrainConfig(**base, rounds=5, params=FedALSConfig(head_z=1.0)), small_split
    )
    assert "large population" in note and ">= large_above" in note
    assert got.rounds == 5 and got.params.population == "large"
    assert got.params.head_z == 1.0 and got.params.prior_weight == 0.0
    # The threshold decides; a population given is kept whatever the ratio.
    got, note = resolve_population(
        TrainConfig(**base, params=FedALSConfig(large_above=ratio * 1.01)), small_split
    )
    assert "small population" in note and "< large_above" in note
    assert got.params.population == "small" and got.rounds == 3
    got, _ = resolve_population(
        TrainConfig(**base, params=FedALSConfig(population="small")), small_split
    )
    assert got.params.population == "small"
    # A Poisson cohort amplifies (less noise); a fixed-size one is refused under DP.
    eps = dict(model="fedals", privacy=PrivacyConfig(epsilon=2.0))
    every = population_ratio(TrainConfig(**eps), small_split.n_users)
    with pytest.raises(ConfigError, match="fixed-size cohort"):
        population_ratio(TrainConfig(**eps, clients_per_round=10), small_split.n_users)
    poisson = population_ratio(TrainConfig(**eps, client_fraction=0.25), small_split.n_users)
    assert poisson > every
    # Without DP nothing changes but the dimension, which the catalogue decides.
    plain = TrainConfig(model="fedals")
    got, note = resolve_population(plain, small_split)
    assert note is None and got.params == dataclasses.replace(plain.params, dim=32)
    assert dataclasses.replace(got, params=plain.params) == plain


def test_a_private_run_reports_no_clipping_where_uploads_are_built_to_the_bound(tmp_path):
    """Found in review: float32 weights put norms at up to 1 + 7e-8 of the bound 1, and every
    such upload counted as clipped (clipped_fraction 0.69, 0.49, 0.49 where the docs say the
    clip never binds). The count ignores float rounding now; a real overshoot still counts."""
    from protocols.dp import clipped_count

    run = train(
        TrainConfig(
            model="fedals",
            synthetic_users=300,
            synthetic_items=200,
            rounds=3,
            privacy=PrivacyConfig(epsilon=2.0),
        ),
        out=tmp_path / "r",
    )
    assert [m["clipped_fraction"] for m in run.metrics] == [0.0, 0.0, 0.0]
    norms = torch.tensor([1.0, 1.0 + 7e-8, 1.0 + 1e-5, 0.5, 3.0])
    assert clipped_count(norms, 1.0) == 2


def test_count_items_sample_is_drawn_even_without_a_generator(small_split):
    """Found in review: client_round(..., None) skipped the count_items sample and weighed every
    item 1/sqrt(k), uploads of norm up to 4.4 that only the server's clip bounded."""
    cfg = FedALSConfig(private=True, private_dim=4, count_items=5, gram_items=0)
    m = FedALS(small_split, cfg, generator=torch.Generator().manual_seed(0))
    up, _ = m.client_round(torch.arange(small_split.n_users), 0, None)
    assert float(up.norms().max()) <= 1 + 1e-6
    assert int(torch.bincount(up.pair_client).max()) <= 5


def test_cooccurrence_rounds_without_a_count_round_are_refused(small_split):
    """Found in review: count_rounds = 0 with fewer co-occurrence items than the catalogue
    crashed in the first upload (RuntimeError: repeats can not be negative, a traceback);
    the items are chosen from a released count, so there must be one."""
    cfg = FedALSConfig(private=True, private_dim=4, count_rounds=0, gram_items=10, count_only=False)
    with pytest.raises(ConfigError, match="count_rounds = 0 releases none"):
        FedALS(small_split, cfg, generator=torch.Generator().manual_seed(0))
    ok = dataclasses.replace(cfg, gram_items=0)
    FedALS(small_split, ok, generator=torch.Generator().manual_seed(0))


def _count_release(m: FedALS, sigma: float, gen: torch.Generator, r: int = 0) -> torch.Tensor:
    """Apply count round ``r`` of every client with Gaussian noise of std ``sigma`` drawn
    from ``gen``; the released count."""
    users = torch.arange(m.split.n_users)
    up, _ = m.client_round(users, r, None)
    total = up.weighted_sum(torch.ones(len(up)))
    noisy = total + torch.randn(total.shape, generator=gen) * sigma
    m.apply_aggregate(
        Aggregate(total=noisy, contributors=len(up), denominator=len(up), noise_std=sigma), r
    )
    return m.layout.split(noisy)["count"]


@pytest.mark.parametrize("fires", [True, False])
def test_noise_limited_head_rule_cuts_the_set_and_counts_the_rest(small_split, fires):
    """sparse_head_below: after the count round, when fewer than that share of the gram_items
    most counted items clear sparse_head_z noise stds, only those that do enter the
    co-occurrence rounds and every other item is counted in them (as gram_head_z with
    tail_counts); otherwise the set is the gram_items most counted items and the
    co-occurrence uploads carry no count. The clients learn the decision with the model."""
    big, sigma = 12, 0.5
    cfg = FedALSConfig(private=True, private_dim=3, gram_items=big)  # the small mode's 0.5
    probe = FedALS(small_split, cfg, generator=torch.Generator().manual_seed(0))
    counts = _count_release(probe, sigma, torch.Generator().manual_seed(7))
    top = torch.sort(counts, descending=True).values[:big]
    # A z between two of the top counts: 3 (fires) or 9 (does not) of the 12 clear it.
    cleared = 3 if fires else 9
    z = float(top[cleared - 1] + top[cleared]) / 2 / sigma
    cfg = dataclasses.replace(cfg, sparse_head_z=z)
    m = FedALS(small_split, cfg, generator=torch.Generator().manual_seed(0))
    assert m.run_notes() == []  # nothing decided before the count round
    _count_release(m, sigma, torch.Generator().manual_seed(7))
    assert m.sparse_head is fires and m.head_share == pytest.approx(cleared / big)
    (note,) = m.run_notes()
    share = f"({cleared / big:.0%} cleared them)"
    assert note.endswith(
        f"fired {share}: factors for the {cleared} items that clear them, every other item "
        "counted again in the co-occurrence rounds"
        if fires
        else f"did not fire {share}: factors for all {big}"
    )
    if fires:
        assert torch.equal(m.head, counts > z * sigma) and int(m.head.sum()) == cleared
    else:
        assert int(m.head.sum()) == big and torch.equal(m.head, counts >= top[big - 1])
    node = FedALS(small_split, cfg, generator=torch.Generator().manual_seed(3))
    node.set_global_parameters(m.global_parameters())  # a device receiving the model
    assert node.sparse_head is fires
    users = torch.arange(small_split.n_users)
    up, _ = node.client_round(users, 1, None)
    parts = node.layout.split(up.dense().double())
    assert float(up.norms().max()) <= 1 + 1e-6
    tail_rows = parts["count"][:, ~m.head]
    assert float(parts["count"][:, m.head].abs().max()) == 0.0
    if fires:
        for c in range(small_split.n_users):
            items = small_split.user_train_items(c)
            want = torch.zeros(small_split.n_items, dtype=torch.float64)
            want[items[~m.head[items]]] = 1.0 / math.sqrt(len(items))
            torch.testing.assert_close(parts["count"][c], want, rtol=1e-6, atol=1e-7)
    else:
        assert float(tail_rows.abs().max()) == 0.0
    # The server folds the round's tail counts into the tail's count (equal precision).
    before = m.prior.clone()
    total = up.weighted_sum(torch.ones(len(up)))
    m.apply_aggregate(Aggregate(total=total, contributors=len(up), denominator=len(up)), 1)
    want = before.double()
    if fires:
        want[~m.head] = (want[~m.head] + parts["count"].sum(0)[~m.head]) / 2
    torch.testing.assert_close(m.prior.double(), want, rtol=1e-5, atol=1e-6)
    fresh = FedALS(small_split, cfg, generator=torch.Generator().manual_seed(5))
    fresh.load_state_dict(m.state_dict())  # a resumed server keeps the decision
    assert fresh.sparse_head is fires and torch.equal(fresh.head, m.head)


def test_noise_limited_head_rule_is_off_where_the_user_shapes_the_set(small_split):
    """The rule never overrides a setting given for the co-occurrence set or the counts, nor
    runs without co-occurrence rounds, a count round or with the large mode's settings."""
    from securefed.models.fedals import sparse_head_rule, with_population

    assert sparse_head_rule(with_population(FedALSConfig(private=True)))
    assert not sparse_head_rule(with_population(FedALSConfig(private=True), "large"))
    for given in (
        {"sparse_head_below": 0.0},
        {"gram_head_z": 2.0},
        {"tail_counts": True},
        {"count_items": 20},
        {"gram_items": 0},
        {"count_rounds": 0},
        {"count_only": True},
    ):
        params = with_population(FedALSConfig(private=True, **given))
        assert not sparse_head_rule(params), given
    # Every item below the noise: with the rule the set is empty (and the co-occurrence
    # rounds still run: counts only, no factor); with it off, or with gram_head_z given
    # (which keeps its own cut), no rule.
    users = torch.arange(small_split.n_users)
    for given, fired in (
        ({}, True),
        ({"sparse_head_below": 0.0}, False),
        ({"gram_head_z": 5.0}, False),
    ):
        cfg = FedALSConfig(private=True, private_dim=3, gram_items=12, **given)
        m = FedALS(small_split, cfg, generator=torch.Generator().manual_seed(0))
        _count_release(m, 1e4, torch.Generator().manual_seed(1))
        assert m.sparse_head is fired and (m.head_share is not None) is fired
        assert int(m.head.sum()) == (12 if given.get("sparse_head_below") == 0.0 else 0)
        if fired:
            up, _ = m.client_round(users, 1, None)
            parts = m.layout.split(up.dense().double())
            assert float(parts["cooc"].abs().max()) == 0.0 and float(up.norms().max()) <= 1 + 1e-6
            total = up.weighted_sum(torch.ones(len(up)))
            m.apply_aggregate(Aggregate(total=total, contributors=len(up), denominator=len(up)), 1)
            assert float(m.V.abs().max()) == 0.0 and m.sparse_head
    for bad in ({"sparse_head_below": 1.5}, {"sparse_head_below": -0.1}, {"sparse_head_z": 0.0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            FedALSConfig(private=True, **bad)


def test_noise_limited_head_rule_reads_the_count_at_its_precision(small_split):
    """With two count rounds the rule compares the combined count with its own noise std,
    sigma / sqrt(2); an audit's canary items join the set beside the items that clear it."""
    big, sigma, audit = 12, 0.5, 2
    cfg = FedALSConfig(private=True, private_dim=3, gram_items=big, count_rounds=2)

    def counted(m: FedALS) -> None:
        gen = torch.Generator().manual_seed(9)
        for r in (0, 1):
            _count_release(m, sigma, gen, r)

    probe = FedALS(small_split, cfg, generator=torch.Generator().manual_seed(0))
    counted(probe)
    n = small_split.n_items
    top = torch.sort(probe.prior[: n - audit], descending=True).values[:big]
    std = sigma / math.sqrt(2)
    z = float(top[2] + top[3]) / 2 / std  # 3 of the 12 clear z at the combined precision
    assert int((top > z * sigma).sum()) < 3  # at one release's std fewer would
    cfg = dataclasses.replace(cfg, sparse_head_z=z, gram_audit_items=audit)
    m = FedALS(small_split, cfg, generator=torch.Generator().manual_seed(0))
    counted(m)
    assert m.head_share == pytest.approx(3 / big) and m.sparse_head
    assert int(m.head[: n - audit].sum()) == 3 and bool(m.head[n - audit :].all())
    assert torch.equal(m.head[: n - audit], m.prior[: n - audit] > z * std)


def test_spectral_shrink_keeps_a_planted_spike_and_zeroes_the_bulk():
    """A rank-one matrix theta u u^T under symmetric Gaussian noise of std s per entry: its
    eigenvalue shows at theta + s^2 m / theta, which spectral_shrink maps back to theta times
    the eigenvector's squared overlap 1 - s^2 m / theta^2; the noise's own eigenvalues (all
    near or below the bulk edge 2 s sqrt(m)) go to (nearly) zero; without noise nothing
    changes."""
    from securefed.models.fedals import spectral_shrink

    m, s = 400, 0.5
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(m, generator=gen, dtype=torch.float64)
    u /= u.norm()
    theta = 3.0 * s * math.sqrt(m)
    noise = torch.randn(m, m, generator=gen, dtype=torch.float64) * s
    noise = torch.triu(noise, diagonal=1)
    c = theta * torch.outer(u, u) + noise + noise.T
    evals = torch.linalg.eigvalsh(c).flip(0)[:16]
    assert float(evals[0]) == pytest.approx(theta + s**2 * m / theta, rel=0.03)
    shrunk = spectral_shrink(evals, s, m)
    assert float(shrunk[0]) == pytest.approx(theta * (1.0 - 1.0 / 9.0), rel=0.03)
    assert float(shrunk[1:].max()) < 0.05 * float(shrunk[0])
    assert int((shrunk[1:] > 0).sum()) <= 1  # at most an edge fluctuation survives
    assert torch.equal(spectral_shrink(evals, 0.0, m), evals)


def test_gram_shrink_drops_the_factors_inside_the_noise_bulk(small_split):
    """With gram_shrink the head's factor columns whose eigenvalue lies inside the noise's
    bulk are zero, the others scaled by the shrunk eigenvalues; the averaged releases' noise
    std (what the edge reads) survives a checkpoint; without noise the factors are those of
    the unshrunk mode."""
    from securefed.models.fedals import spectral_shrink

    big, dim, sigma = 12, 3, 2.0
    plain, users = _gram_model(small_split, big, dim)
    shrink = FedALS(
        small_split,
        dataclasses.replace(plain.config, gram_shrink=True),
        generator=torch.Generator().manual_seed(0),
    )
    shrink.load_state_dict(plain.state_dict())
    gen = torch.Generator().manual_seed(3)
    for r in (1, 2):
        up, _ = shrink.client_round(users, r, None)
        total = up.weighted_sum(torch.ones(len(up)))
        noisy = total + torch.randn(total.shape, generator=gen) * sigma
        for model in (plain, shrink):
            model.apply_aggregate(
                Aggregate(total=noisy, contributors=len(up), denominator=len(up), noise_std=sigma),
                r,
            )
    assert shrink.cooc_noise_std() == pytest.approx(sigma / math.sqrt(2))
    evals, edge = shrink.cooc_spectrum()
    assert edge == pytest.approx(2 * sigma / math.sqrt(2) * math.sqrt(big))
    lam = spectral_shrink(evals[:dim].clamp_min(0), sigma / math.sqrt(2), big)
    assert 0 < int((lam > 0).sum()) < dim  # the test needs a spike and a bulk
    head = shrink.V[shrink.head].double()
    plain_head = plain.V[plain.head].double()
    for j in range(dim):
        if lam[j] == 0:
            assert float(head[:, j].abs().max()) == 0.0
        else:  # the same eigenvector, rescaled by sqrt(shrunk / shrunk lead)
            want = plain_head[:, j] * torch.sqrt(lam[j] / lam[0] * evals[0] / evals[j])
            sign = 1.0 if float(head[:, j] @ want) >= 0 else -1.0
            torch.testing.assert_close(head[:, j], sign * want, rtol=1e-4, atol=1e-5)
    fresh = FedALS(small_split, shrink.config, generator=torch.Generator().manual_seed(9))
    fresh.load_state_dict(shrink.state_dict())
    assert fresh.cooc_noise_std() == shrink.cooc_noise_std()
    fresh._set_gram_factors()
    torch.testing.assert_close(fresh.V, shrink.V)
    # A state saved before the noise was kept restores (a Flower server's too: a fresh
    # model's state has no such key to ask for); its noise is unknown, not zero.
    from securefed.flower.models import load_server_state, server_state

    old = server_state("fedals", shrink)
    del old["cooc_noise_var"]
    restored = FedALS(small_split, shrink.config, generator=gen)
    assert "cooc_noise_var" not in restored.state_dict()
    load_server_state("fedals", restored, old)
    assert math.isnan(restored.cooc_noise_std()) and torch.equal(restored.V, shrink.V)
    with pytest.raises(ConfigError, match="gram_shrink"):
        dataclasses.replace(shrink.config, gram_shrink="False")
    # Without noise there is no bulk: the same factors as without the option.
    quiet = [
        FedALS(small_split, c.config, generator=torch.Generator().manual_seed(0))
        for c in (plain, shrink)
    ]
    for model in quiet:
        model.load_state_dict(_gram_model(small_split, big, dim)[0].state_dict())
        for r in (1, 2):
            up, _ = model.client_round(users, r, None)
            total = up.weighted_sum(torch.ones(len(up)))
            model.apply_aggregate(
                Aggregate(total=total, contributors=len(up), denominator=len(up)), r
            )
    torch.testing.assert_close(quiet[0].V, quiet[1].V)
