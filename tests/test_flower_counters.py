"""The training counters of a deployed round (loss, clipped) ride in the secure sum.

A node used to send its users' loss sum and clip count in the clear beside their masked
inputs; with one user per SuperNode that was the user's own loss (for the private fedals its
number of items) and clip flag, every round. They are now extra ring coordinates of each
user's masked input (``securefed.flower.pipeline.COUNTERS``, ``protocols.secagg.LimbCodec``),
so the server learns their sums over the survivors only, as the in-process round reports.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.errors import ConfigError
from protocols.secagg import LimbCodec
from securefed.errors import ProtocolError
from securefed.evaluation import hit_ratio, ndcg
from securefed.federation.base import DenseUpdates
from securefed.flower import models
from securefed.flower.local import LocalTransport
from securefed.flower.node import EvalTask, NodeRuntime
from securefed.flower.pipeline import (
    EVAL_RING_BITS,
    EVAL_ROUND_OFFSET,
    LOSS_OFFSET,
    LOSS_SCALE,
    encode_updates,
    evaluation_consistent,
    evaluation_counters,
    evaluation_metrics,
    evaluation_parameters,
    finish_round,
    round_parameters,
    user_counters,
)
from securefed.flower.server import FederatedServer, ServerSettings
from securefed.training import (
    PrivacyConfig,
    TrainConfig,
    build_aggregator,
    build_model,
    load_split,
    train,
)


@settings(max_examples=200, deadline=None)
@given(
    bits=st.integers(2, 64),
    n=st.integers(1, 5000),
    fields=st.lists(st.integers(1, 63), min_size=1, max_size=5),
    data=st.data(),
)
def test_limb_codec_sums_the_largest_values_of_every_client_exactly(bits, n, fields, data):
    if bits <= n.bit_length():
        with pytest.raises(ConfigError, match="cannot sum"):
            LimbCodec(n_clients=n, modulus_bits=bits, value_bits=tuple(fields))
        return
    codec = LimbCodec(n_clients=n, modulus_bits=bits, value_bits=tuple(fields))
    # Every client at each field's largest value (the worst case for a wrap), and one row of
    # arbitrary values standing for the rest.
    top = np.array([[(1 << b) - 1 for b in fields]], dtype=np.int64)
    other = np.array([[data.draw(st.integers(0, (1 << b) - 1)) for b in fields]], dtype=np.int64)
    rows = np.concatenate([np.repeat(top, n - 1, axis=0), other])
    ring = codec.encode(rows)
    assert ring.shape == (n, codec.width) and int(ring.max()) < 1 << codec.limb_bits
    # The ring sum modulo 2^bits (Python integers: no uint64 overflow in the test itself).
    total = np.array(
        [sum(int(v) for v in ring[:, c]) % (1 << bits) for c in range(codec.width)],
        dtype=np.uint64,
    )
    assert codec.decode_sum(total) == [int(v) for v in rows.sum(axis=0, dtype=object)]


def test_limb_codec_refuses_values_outside_their_fields():
    codec = LimbCodec(n_clients=10, modulus_bits=16, value_bits=(1, 20))
    assert (codec.limb_bits, codec.limbs, codec.width) == (12, (1, 2), 3)
    for bad in ([[2, 0]], [[0, 1 << 20]], [[-1, 0]]):
        with pytest.raises(ConfigError, match="field"):
            codec.encode(np.array(bad))
    with pytest.raises(ConfigError, match="shape"):
        codec.encode(np.array([[0, 1, 2]]))
    with pytest.raises(ConfigError, match="integers"):
        codec.encode(np.array([[0.0, 1.0]]))
    with pytest.raises(ConfigError, match="limbs"):
        codec.decode_sum(np.zeros(2, dtype=np.uint64))
    # numpy integers are taken as Python ints (a numpy shift would overflow in decode_sum).
    same = LimbCodec(n_clients=np.int64(10), modulus_bits=np.int64(16), value_bits=(1, 20))
    assert same == codec
    assert same.decode_sum(np.array([1, 4095, 255], dtype=np.uint64)) == [1, 4095 + (255 << 12)]
    for bad in (16.0, True):
        with pytest.raises(ConfigError, match="modulus_bits must be an integer"):
            LimbCodec(n_clients=10, modulus_bits=bad, value_bits=(1,))


def test_user_counters_offset_the_loss_and_flag_the_unusable_ones():
    losses = np.array([1.5, -0.25, 0.0, float("nan"), float("inf"), 1e12, -(2.0**31)])
    clipped = np.array([True, False, False, True, False, False, False])
    c = user_counters(clipped, losses)
    assert c[:, 0].tolist() == [1] * 7  # trained
    assert c[:, 1].tolist() == [1, 0, 0, 1, 0, 0, 0]
    # One field: the loss in 2^-16 units plus 2^48, so its sum reveals the losses' sum only.
    assert (c[:, 2] - LOSS_OFFSET).tolist() == [98304, -16384, 0, 0, 0, 0, -(2**47)]
    assert c[:, 3].tolist() == [0, 0, 0, 1, 1, 1, 0]  # NaN, inf and |loss| >= 2^32
    assert c.min() >= 0 and c[:, 2].max() < 1 << 49


def _cfg(**privacy) -> TrainConfig:
    return TrainConfig(
        model="fedrap",
        synthetic_users=60,
        synthetic_items=400,
        rounds=2,
        checkpoint_every=1,
        privacy=PrivacyConfig(**{"secagg": True, "epsilon": 8.0, "replay": True, **privacy}),
    )


def test_encoded_counters_sum_to_the_rows_clipped_and_their_losses():
    cfg = _cfg(epsilon=None, replay=False)  # no noise: the update's sum is exact too
    split = load_split(cfg)
    model = build_model(cfg, split)
    agg = build_aggregator(cfg, split, model)
    m = 12
    vectors = torch.zeros(m, agg.dim)
    vectors[:, 0] = agg.clip * torch.tensor([0.5, 2.0] * 6)  # every other row over the clip
    updates = DenseUpdates(clients=torch.arange(m), vectors=vectors, layout=model.layout)
    params = round_parameters(agg, m)
    losses = np.linspace(-1.0, 4.0, m)
    ring = encode_updates(agg, updates, round_index=0, params=params, losses=losses)
    assert ring.shape == (m, params.width(agg.dim))
    total = np.zeros(params.width(agg.dim), dtype=np.uint64)
    for row in ring:
        total = params.codec.add(total, row)
    # The server's half: the update's sum and the counters' sums.
    aggregate, counters = finish_round(
        agg, total, survivors=m, round_index=0, params=params, started=0.0
    )
    assert (counters.trained, counters.clipped) == (m, 6)
    assert counters.loss_sum == pytest.approx(losses.sum(), abs=m / LOSS_SCALE)
    assert agg.round_record()["clipped_fraction"] == 0.5
    assert float(aggregate.total[0]) == pytest.approx(agg.clip * 6 * 1.5, rel=1e-3)
    # A loss that was not finite makes the round's loss NaN, not a wrong number.
    losses[3] = float("nan")
    ring = encode_updates(agg, updates, round_index=0, params=params, losses=losses)
    total = np.zeros(params.width(agg.dim), dtype=np.uint64)
    for row in ring:
        total = params.codec.add(total, row)
    _, counters = finish_round(agg, total, survivors=m, round_index=0, params=params, started=0.0)
    assert math.isnan(counters.loss_sum) and counters.trained == m
    # Counters that do not add up to the survivors (a client wrote something else there):
    # no loss and no clipped fraction rather than wrong ones.
    _, counters = finish_round(
        agg, total, survivors=m - 1, round_index=0, params=params, started=0.0
    )
    assert math.isnan(counters.loss_sum)
    assert agg.round_record().get("counters_inconsistent") is True
    assert "clipped_fraction" not in agg.round_record()


def test_a_deployed_round_reports_the_in_process_loss_and_clipped_fraction(tmp_path):
    # Clip 0.5: FedRAP's uploads are all longer, so the clipped fraction is 1 on both sides;
    # the loss agrees to the counters' fixed point (2^-16 a user).
    cfg = _cfg(clip=0.5)
    ref = train(cfg, out=tmp_path / "ref")
    server = FederatedServer(
        cfg,
        run_dir=tmp_path / "fl",
        transport=LocalTransport(3, state_dir=tmp_path / "nodes"),
        settings=ServerSettings(),
    )
    res = server.run()
    for a, b in zip(ref.metrics, res.metrics, strict=True):
        assert b["clipped_fraction"] == a["clipped_fraction"] == 1.0
        assert math.isfinite(b["loss"])
        assert b["loss"] == pytest.approx(a["loss"], abs=1.0 / LOSS_SCALE)
    # No reply carries a number in the clear, evaluation's included.
    for stage, _node, reply in server.transport.seen:
        assert not reply.metrics, stage
    assert all(b["eval_users"] == 60 for b in res.metrics)


def test_evaluation_fields_sum_to_the_in_process_metrics():
    # Every user's ranks as fields, summed as the secure evaluation round sums them, give
    # HR@10 exactly and NDCG@10 to 2^-16 a user (the gain of a rank below 10 is at most 1).
    cfg = _cfg(epsilon=None, replay=False)
    split = load_split(cfg)
    agg = build_aggregator(cfg, split, build_model(cfg, split))
    params = evaluation_parameters(agg, 60, full=True)
    assert params.fields == (
        "users",
        "val_hr@10",
        "val_ndcg@10",
        "val_full_hr@10",
        "val_full_ndcg@10",
        "test_hr@10",
        "test_ndcg@10",
        "test_full_hr@10",
        "test_full_ndcg@10",
    )
    rng = np.random.default_rng(0)
    ranks = {w: rng.integers(0, 30, size=60) for w in ("val", "val_full", "test", "test_full")}
    ring = params.counters.encode(evaluation_counters(params, ranks))
    total = np.zeros(params.counters.width, dtype=np.uint64)
    for row in ring:
        total = (total + row) & np.uint64((1 << EVAL_RING_BITS) - 1)
    metrics = evaluation_metrics(params, params.counters.decode_sum(total))
    assert metrics["eval_users"] == 60
    for which, r in ranks.items():
        assert metrics[f"{which}_hr@10"] == hit_ratio(torch.from_numpy(r), 10)
        assert metrics[f"{which}_ndcg@10"] == pytest.approx(
            ndcg(torch.from_numpy(r), 10), abs=2.0**-17
        )
    # Without full ranking the round carries the sampled metrics only.
    assert evaluation_parameters(agg, 60, full=False).fields == (
        "users",
        "val_hr@10",
        "val_ndcg@10",
        "test_hr@10",
        "test_ndcg@10",
    )


def test_an_evaluation_round_that_aborts_leaves_no_metrics_and_the_run_goes_on(tmp_path):
    # A node dies at round 2's evaluation: too few users for the secure evaluation (and for
    # round 3's training) at the default dropout tolerance. The run finishes on round 1's
    # evaluation; the aborted ones carry no metric (the selection skipped them: it used to
    # raise KeyError here).
    cfg = dataclasses.replace(_cfg(), rounds=3)
    drop_at = EVAL_ROUND_OFFSET + 1

    server = FederatedServer(
        cfg,
        run_dir=tmp_path / "fl",
        transport=LocalTransport(
            3,
            state_dir=tmp_path / "nodes",
            drop=lambda stage, node, r: node == 101 and stage == "evaluate" and r == drop_at,
        ),
        settings=ServerSettings(),
    )
    res = server.run()
    first, second, third = res.metrics
    assert "val_hr@10" in first and "eval_aborted" not in first
    for rec in (second, third):
        assert "eval_aborted" in rec and "val_hr@10" not in rec
    assert res.summary["selected_round"] == 1


def test_a_node_refuses_an_evaluation_outside_the_runs_rounds(tmp_path):
    cfg = _cfg()
    runtime = NodeRuntime(
        cfg, run_token="t", partition_id=0, num_partitions=1, state_dir=tmp_path / "n"
    )
    params = evaluation_parameters(runtime.aggregator, runtime.split.n_users, full=False)
    arrays, scalars = models.global_payload(cfg.model, build_model(cfg, runtime.split))
    for index in (0, 7, EVAL_ROUND_OFFSET - 1, EVAL_ROUND_OFFSET + cfg.rounds):
        task = EvalTask(
            round_index=index, public_seed=b"s" * 16, fingerprint=params.fingerprint(), full=False
        )
        with pytest.raises(ProtocolError, match="evaluation round's index"):
            runtime.evaluate(task, arrays, scalars)
    task = EvalTask(
        round_index=EVAL_ROUND_OFFSET, public_seed=b"s" * 16, fingerprint="other", full=False
    )
    with pytest.raises(ProtocolError, match="evaluation parameters differ"):
        runtime.evaluate(task, arrays, scalars)
    task = dataclasses.replace(task, fingerprint=params.fingerprint())
    reply = runtime.evaluate(task, arrays, scalars)
    assert sorted(reply.adverts) == list(range(runtime.split.n_users))


def test_evaluation_sums_that_cannot_be_the_survivors_are_refused():
    cfg = _cfg(epsilon=None, replay=False)
    split = load_split(cfg)
    params = evaluation_parameters(
        build_aggregator(cfg, split, build_model(cfg, split)), 60, full=False
    )
    # users, val hits, val NDCG, test hits, test NDCG
    good = [50, 20, 10 * 2**16, 5, 5 * 2**16]
    assert evaluation_consistent(params, good, 50)
    assert not evaluation_consistent(params, good, 49)  # not the survivors' count
    assert not evaluation_consistent(params, [50, 51, 0, 0, 0], 50)  # more hits than users
    assert not evaluation_consistent(params, [50, 2, 3 * 2**16, 0, 0], 50)  # NDCG above hits
