"""Payloads through Flower's records: packed into few objects, malformed packings refused."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from securefed.errors import IntegrityError  # noqa: E402
from securefed.flower.apps import (  # noqa: E402
    SIDS_ARRAY_BYTES,
    GridTransport,
    from_content,
    to_content,
)
from securefed.flower.messages import Payload, pack_sids, unpack_sids  # noqa: E402


def _payload(big: int = SIDS_ARRAY_BYTES) -> Payload:
    rng = np.random.default_rng(0)
    sids = {s: rng.bytes(int(n)) for s, n in ((7, 1), (0, 430), (12, big), (3, 9))}
    return Payload(
        config={"protocol": "p", "round": 4, "seed": b"\x00\x01", **pack_sids(sids)},
        arrays={
            "C": rng.standard_normal((5, 3)).astype(np.float32),
            "mlp.bias": np.arange(7, dtype=np.float64),
            "step": np.array(3, dtype=np.int64),  # 0-d
            "empty": np.zeros((0, 4), dtype=np.float32),
        },
        metrics={"loss_sum": 1.5, "trained": 3.0},
    )


def _same(a: Payload, b: Payload) -> None:
    assert a.config == b.config
    assert a.metrics == b.metrics
    assert list(a.arrays) == list(b.arrays)
    for k, v in a.arrays.items():
        assert b.arrays[k].dtype == v.dtype and b.arrays[k].shape == v.shape
        assert np.array_equal(b.arrays[k], v)
        assert b.arrays[k].flags.writeable  # a model may load it in place


def test_a_payload_travels_as_one_config_and_one_array_and_comes_back_exactly():
    payload = _payload()
    content = to_content(payload)
    assert set(content.keys()) == {"config", "packed"}  # no ArrayRecord/MetricRecord of its own
    assert not any(k.startswith("sid.") for k in content["config"])  # none as bytes values
    assert list(content["packed"].keys()) == ["blob"]
    assert content["config"]["sid-ids"] == [0, 3, 7, 12]
    back = from_content(content)
    _same(payload, back)
    assert unpack_sids(back.config) == unpack_sids(payload.config)
    # Small per-user messages stay bytes values, and come back the same.
    small = _payload(big=1000)
    content = to_content(small)
    assert "sid-ids" not in content["config"] and "sid.12" in content["config"]
    _same(small, from_content(content))
    # Nothing to pack: no array at all.
    bare = Payload(config={"protocol": "p", **pack_sids({1: b"ab"})}, metrics={"users": 2.0})
    content = to_content(bare)
    assert set(content.keys()) == {"config"}
    _same(bare, from_content(content))


def _with_sids(ids, ends, blob) -> RecordDict:
    content = RecordDict(
        {"config": ConfigRecord({"protocol": "p", "sid-ids": ids, "sid-ends": ends})}
    )
    content["packed"] = ArrayRecord(array_dict={"blob": Array(blob)})
    return content


@pytest.mark.parametrize(
    "ids, ends, blob",
    [
        ([0, 1], [2, 5], np.zeros(4, np.uint8)),  # ends past the blob
        ([0, 1], [2, 3], np.zeros(4, np.uint8)),  # bytes left over
        ([0, 1], [3, 2], np.zeros(2, np.uint8)),  # decreasing ends
        ([0, 1], [-1, 2], np.zeros(2, np.uint8)),  # an end before the start
        ([1, 1], [1, 2], np.zeros(2, np.uint8)),  # one user twice
        ([-1, 1], [1, 2], np.zeros(2, np.uint8)),  # negative id
        ([0], [2], np.zeros(2, np.int8)),  # not bytes
        ([0], [2], np.zeros((1, 2), np.uint8)),  # not one row of bytes
        ([0, 1], [2], np.zeros(2, np.uint8)),  # one end missing
        ([], [], np.zeros(3, np.uint8)),  # no users
        ([0.0], [2], np.zeros(2, np.uint8)),  # a float id
    ],
)
def test_a_malformed_sids_record_is_an_integrity_error(ids, ends, blob):
    with pytest.raises(IntegrityError):
        from_content(_with_sids(ids, ends, blob))


def test_per_user_arrays_without_their_ids_or_record_are_an_integrity_error():
    lists = {"protocol": "p", "sid-ids": [0], "sid-ends": [2]}
    with pytest.raises(IntegrityError):  # the lists without the array
        from_content(RecordDict({"config": ConfigRecord(lists)}))
    content = RecordDict({"config": ConfigRecord({"protocol": "p"})})
    content["packed"] = ArrayRecord(array_dict={"blob": Array(np.zeros(2, np.uint8))})
    with pytest.raises(IntegrityError):  # the array without the lists
        from_content(content)


@pytest.mark.parametrize(
    "change",
    [
        {"array-dtypes": ["float32", "object"]},  # a dtype outside the list
        {"array-dims": [5, 3, 8]},  # sizes that do not match the bytes
        {"array-ndims": [2, 2]},  # more dimensions than sizes
        {"array-names": ["C", "C"]},  # one name twice
        {"array-ends": [60, 100]},  # past the blob
        {"metric.loss_sum": "x"},  # a metric that is not a number
    ],
)
def test_a_malformed_array_index_is_an_integrity_error(change):
    payload = Payload(
        config={"protocol": "p"},
        arrays={"C": np.zeros((5, 3), np.float32), "b": np.zeros(7, np.float64)},
        metrics={"loss_sum": 1.0},
    )
    config = dict(to_content(payload)["config"])
    blob = to_content(payload)["packed"]["blob"].numpy()
    config.update(change)
    content = RecordDict({"config": ConfigRecord(config)})
    content["packed"] = ArrayRecord(array_dict={"blob": Array(blob)})
    with pytest.raises(IntegrityError):
        from_content(content)


class _Grid:
    """Answers every message from its own node; node 2's reply has a malformed sids record."""

    def __init__(self) -> None:
        self.sent: dict[str, Message] = {}

    def get_node_ids(self):
        return [1, 2]

    def push_messages(self, messages):
        ids = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = m.object_id
            self.sent[m.metadata.message_id] = m
            ids.append(m.metadata.message_id)
        return ids

    def pull_messages(self, ids):
        out = []
        for mid in ids:
            msg = self.sent[mid]
            node = msg.metadata.dst_node_id
            TaskIdentity.node_id = node
            if node == 1:
                content = to_content(Payload(config=pack_sids({4: b"ok"})))
            else:
                content = _with_sids([5], [9], np.zeros(2, np.uint8))
            out.append(Message(content, reply_to=msg))
        return out


def test_the_server_takes_a_node_with_a_malformed_reply_for_a_dropout(monkeypatch):
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)  # the grid sets it per reply; restored
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    transport = GridTransport(_Grid(), poll=0.0)  # type: ignore[arg-type]
    sent = {n: Payload(config={"protocol": "p", **pack_sids({n: b"x"})}) for n in (1, 2)}
    replies = transport.exchange("masked", sent, timeout=5.0)
    assert set(replies) == {1}
    assert unpack_sids(replies[1].config) == {4: b"ok"}
    assert transport.errors == [("masked", 2, "malformed reply")]
