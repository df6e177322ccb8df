"""Payloads through Flower's records: per-user SecAgg messages as arrays; malformed ones fail."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from securefed.errors import IntegrityError  # noqa: E402
from securefed.flower.apps import GridTransport, from_content, to_content  # noqa: E402
from securefed.flower.messages import Payload, pack_sids, unpack_sids  # noqa: E402


def _payload() -> Payload:
    rng = np.random.default_rng(0)
    sids = {s: rng.bytes(int(n)) for s, n in ((7, 1), (0, 430), (12, 65_537), (3, 9))}
    return Payload(
        config={"protocol": "p", "round": 4, "seed": b"\x00\x01", **pack_sids(sids)},
        arrays={"C": rng.standard_normal((5, 3)).astype(np.float32)},
        metrics={"loss_sum": 1.5},
    )


def test_sid_messages_travel_as_arrays_and_come_back_byte_for_byte():
    payload = _payload()
    content = to_content(payload)
    assert not any(k.startswith("sid.") for k in content["config"])  # none as bytes values
    record = content["sids"]
    assert isinstance(record, ArrayRecord)
    assert record["ids"].numpy().tolist() == [0, 3, 7, 12]
    back = from_content(content)
    assert back.config == payload.config
    assert unpack_sids(back.config) == unpack_sids(payload.config)
    assert np.array_equal(back.arrays["C"], payload.arrays["C"])
    assert back.metrics == payload.metrics
    # No per-user messages: no record.
    assert "sids" not in to_content(Payload(config={"protocol": "p"}))


def _with_sids(ids, ends, blob) -> RecordDict:
    content = RecordDict({"config": ConfigRecord({"protocol": "p"})})
    content["sids"] = ArrayRecord(
        array_dict={"ids": Array(ids), "ends": Array(ends), "blob": Array(blob)}
    )
    return content


@pytest.mark.parametrize(
    "ids, ends, blob",
    [
        (np.array([0, 1]), np.array([2, 5]), np.zeros(4, np.uint8)),  # ends past the blob
        (np.array([0, 1]), np.array([2, 3]), np.zeros(4, np.uint8)),  # bytes left over
        (np.array([0, 1]), np.array([3, 2]), np.zeros(2, np.uint8)),  # decreasing ends
        (np.array([1, 1]), np.array([1, 2]), np.zeros(2, np.uint8)),  # one user twice
        (np.array([-1, 1]), np.array([1, 2]), np.zeros(2, np.uint8)),  # negative id
        (np.array([0]), np.array([2]), np.zeros(2, np.int8)),  # not bytes
        (np.array([0.0]), np.array([2]), np.zeros(2, np.uint8)),  # float ids
        (np.array([0, 1]), np.array([2]), np.zeros(2, np.uint8)),  # one end missing
        (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(3, np.uint8)),  # no users
    ],
)
def test_a_malformed_sids_record_is_an_integrity_error(ids, ends, blob):
    with pytest.raises(IntegrityError):
        from_content(_with_sids(ids, ends.astype(np.int64), blob))


def test_a_sids_record_without_its_three_arrays_is_an_integrity_error():
    content = RecordDict({"config": ConfigRecord({"protocol": "p"})})
    content["sids"] = ArrayRecord(array_dict={"ids": Array(np.array([0]))})
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
                content = _with_sids(np.array([5]), np.array([9]), np.zeros(2, np.uint8))
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
