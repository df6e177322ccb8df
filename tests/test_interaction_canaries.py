"""Interaction-level (zero-out) canaries: null examples in DP-SGD, planting, and the audit."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attacks.canaries import plant_interaction_canaries
from protocols.dp.dpsgd import DPSGDConfig
from protocols.seeding import numpy_generator, torch_generator
from securefed.cli import app
from securefed.errors import ConfigError
from securefed.models.fedrap import FedRAP, FedRAPConfig
from securefed.models.fedrecgel import FedRecGEL, FedRecGELConfig
from securefed.training import TrainConfig, train

runner = CliRunner()


def _null_user(split, user: int):
    mask = np.zeros(split.train_items.size, dtype=bool)
    mask[split.train_indptr[user] : split.train_indptr[user + 1]] = True
    return dataclasses.replace(split, null_positives=mask)


def _uploads(model_cls, split, cfg, participants):
    model = model_cls(
        split,
        cfg,
        generator=torch_generator(0, "init"),
        dpsgd=DPSGDConfig(noise_multiplier=0.0, example_clip=0.5),
    )
    plan = model.plan_dpsgd_round(participants, torch_generator(0, "plan"))
    updates, _ = model.train_dpsgd(plan, 0, torch_generator(0, "noise"))
    return plan.participants, updates.dense()


@pytest.mark.parametrize(
    ("model_cls", "cfg"),
    [
        (FedRAP, FedRAPConfig(dim=4, lam=0.0, mu=0.0, l2=0.0, local_epochs=2)),
        (FedRecGEL, FedRecGELConfig(gmf_dim=3, mlp_dim=4, layers=(8, 5, 3))),
    ],
)
def test_null_examples_have_zero_gradient_and_leave_other_clients_alone(
    small_split, model_cls, cfg
):
    # Without noise and without data-independent terms, a client whose examples are all
    # null uploads exactly zero; every other client's upload is unchanged.
    participants = torch.tensor([1, 4, 7])
    glob, plain = _uploads(model_cls, small_split, cfg, participants)
    glob2, nulled = _uploads(model_cls, _null_user(small_split, 4), cfg, participants)
    assert torch.equal(glob, glob2)
    row = int((glob == 4).nonzero())
    assert float(plain[row].abs().max()) > 0
    assert float(nulled[row].abs().max()) == 0.0
    others = glob != 4
    torch.testing.assert_close(nulled[others], plain[others], rtol=0, atol=0)


def test_planting_interaction_canaries(small_split):
    planted, can = plant_interaction_canaries(small_split, 12, numpy_generator(0, "t"))
    assert can.unit == "interaction" and can.size == 12
    assert planted.n_items == small_split.n_items + 12 and planted.n_users == small_split.n_users
    assert np.unique(can.users).size == 12  # distinct hosts, all real users
    null = planted.null_positives
    assert null is not None and null.size == planted.train_items.size
    for j in range(12):
        user, item = int(can.users[j]), int(can.items[j])
        lo, hi = planted.train_indptr[user], planted.train_indptr[user + 1]
        own = planted.train_items[lo:hi]
        assert own[-1] == item  # planted in both worlds, after the user's own positives
        np.testing.assert_array_equal(own[:-1], small_split.user_train_items(user))
        assert null[hi - 1] == (not can.included[j])
        assert (
            item
            in planted.history_items[
                planted.history_indptr[user] : planted.history_indptr[user + 1]
            ]
        )
    assert int(null.sum()) == int((~can.included).sum())
    # Every other user is untouched.
    rest = np.setdiff1d(np.arange(small_split.n_users), can.users)
    for user in rest[:5]:
        np.testing.assert_array_equal(
            planted.user_train_items(int(user)), small_split.user_train_items(int(user))
        )
    with pytest.raises(ConfigError, match="distinct host user"):
        plant_interaction_canaries(small_split, small_split.n_users + 1, numpy_generator(0, "t"))


def test_null_examples_are_refused_outside_dp_sgd(small_split, small_split_data, tmp_path):
    planted, _ = plant_interaction_canaries(small_split, 4, numpy_generator(0, "t"))
    with pytest.raises(ConfigError, match="only DP-SGD"):
        train(TrainConfig(rounds=1, **small_split_data), out=tmp_path / "r", split=planted)


def _audit(tmp_path, name, train_args, audit_args=()):
    run = tmp_path / f"{name}-run"
    # A replay run: `audit --run` re-simulates it (an OS-randomness run cannot be).
    res = runner.invoke(app, ["train", *train_args, "--replay-from-seed", "--out", str(run)])
    assert res.exit_code == 0, res.output
    out = tmp_path / f"{name}-audit"
    res = runner.invoke(
        app, ["audit", "--run", str(run), "--attacks", "row-change", "--out", str(out), *audit_args]
    )
    assert res.exit_code == 0, res.output
    return json.loads((out / "audit.json").read_text()), res.output


SYN = ["--synthetic-users", "200", "--synthetic-items", "600", "--rounds", "1"]
INTERACTION = ["--privacy-unit", "interaction"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "model_args", [["--model", "fedrap", "--local-epochs", "1"], ["--model", "fedrecgel"]]
)
def test_audit_of_interaction_runs_bounds_epsilon_from_both_sides(tmp_path, model_args):
    # Positive control: almost no noise (FedRecGEL's round-1 signal is tiny: its embeddings
    # start at N(0, 0.01^2)), 200 zero-out canaries, one round; the statistic (the host's
    # upload row projected on the positive's direction) must give a bound > 0 (measured
    # here: 1.15 for FedRAP, 1.68 for FedRecGEL).
    args = [*model_args, "--client-fraction", "1.0"] if "fedrecgel" in model_args else model_args
    loose, _ = _audit(
        tmp_path, "loose", [*args, *SYN, *INTERACTION, "--noise-multiplier", "0.0001"]
    )
    block = loose["audit"]
    assert block["unit"] == "interaction" and block["canaries"] == 200
    assert block["epsilon_lower_bound"] > 0.3 and block["canary_auc"] > 0.7
    # With noise the bound stays below the accountant's (interaction-level) epsilon.
    tight, output = _audit(tmp_path, "tight", [*args, *SYN, *INTERACTION, "--epsilon", "2"])
    assert tight["audit"]["epsilon_lower_bound"] <= tight["accounted_epsilon"] <= 2.0
    assert "empirical epsilon" in output


def test_a_null_example_adds_no_loss(small_split):
    """FedRAP's reported DP-SGD loss skips null examples, as FedRecGEL's does (found in
    review: a null canary's positive still entered metrics.jsonl's loss)."""
    cfg = FedRAPConfig(dim=4, lam=0.0, mu=0.0, l2=0.0, local_epochs=1)
    losses = []
    for split in (small_split, _null_user(small_split, 4)):
        model = FedRAP(
            split,
            cfg,
            generator=torch_generator(0, "init"),
            dpsgd=DPSGDConfig(noise_multiplier=0.0, example_clip=0.5),
        )
        plan = model.plan_dpsgd_round(torch.tensor([4]), torch_generator(0, "plan"))
        losses.append(model.train_dpsgd(plan, 0, torch_generator(0, "noise"))[1].loss)
    assert losses[0] > 0 and losses[1] == 0.0
