"""Flower's ``ServerApp`` and ``ClientApp`` for securefed (Flower 1.42 Message API).

Flower carries the messages; securefed does everything else. A :class:`Payload` becomes a
``RecordDict`` with a ``ConfigRecord`` (``"config"``: scalars and strings), an ``ArrayRecord``
(``"arrays"``: the shared model), a ``MetricRecord`` (``"metrics"``: a node's aggregate
counters) and, when the payload has per-user SecAgg messages, an ``ArrayRecord`` (``"sids"``:
the messages back to back, their user ids and where each ends; :func:`to_content`). Flower's
SecAgg+ mod and DP wrappers are not used.

Components (referenced by the app's ``pyproject.toml``)::

    serverapp = "securefed.flower.apps:server_app"
    clientapp = "securefed.flower.apps:client_app"

Run config of the ``ServerApp`` (``[tool.flwr.app.config]`` or ``flwr run --run-config``):
``config-file`` (the run's securefed TOML, a path on the SuperLink's machine), ``run-dir``
(created there), ``stage-timeout`` (seconds), ``transcript`` (bool), ``resume`` (bool:
continue the interrupted run in ``run-dir`` from its last checkpoint with the config it
recorded). Node config of each SuperNode (``--node-config``): ``partition-id``,
``num-partitions``, ``state-dir``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from securefed.errors import IntegrityError
from securefed.flower.messages import (
    SESSION_KEY,
    SID,
    NodeMemory,
    Payload,
    handle_node_message,
    pack_sids,
    unpack_sids,
)

logger = logging.getLogger(__name__)

#: Flower message type of each stage (``train``/``evaluate`` are Flower's own categories).
MESSAGE_TYPES = {
    "hello": "query.hello",
    "train": "train",
    "share": "query.share",
    "masked": "query.masked",
    "consistency": "query.consistency",
    "unmask": "query.unmask",
    "evaluate": "evaluate",
}
_STATE_RECORD = "securefed"
#: Set by :func:`keep_node_state_in_process` in a process that serves every message of its
#: node (securefed's long-lived ClientApp process); ``None`` in a per-message process.
_PROCESS_MEMORY: NodeMemory | None = None


def keep_node_state_in_process() -> NodeMemory:
    """From now on the ClientApp keeps the node's round session and model in this process's
    memory (returned) instead of freezing the session into ``Context.state``. Only for a
    process that serves every message of one node, for as long as the node runs:
    :mod:`securefed.flower.worker`."""
    global _PROCESS_MEMORY
    if _PROCESS_MEMORY is None:
        _PROCESS_MEMORY = NodeMemory()
    return _PROCESS_MEMORY


#: The record of a message's per-user SecAgg messages (see :func:`to_content`).
_SIDS_RECORD = "sids"


def to_content(payload: Payload) -> RecordDict:
    """A :class:`Payload` as a Flower ``RecordDict``.

    The per-user SecAgg messages of the config part (``sid.<id>``) travel as one
    ``ArrayRecord``: ``ids`` (int64 user ids), ``ends`` (int64 end offsets) and ``blob`` (the
    messages back to back, uint8). Flower hashes and serializes a ``ConfigRecord``'s bytes
    values in Python: a node's masked inputs at FedRAP ML-100K's size (314 users x 430 KB)
    took 2.8 s to prepare for each hop as bytes values, 0.3 s as arrays.
    """
    content = RecordDict()
    sids = unpack_sids(payload.config)
    content["config"] = ConfigRecord(
        {k: v for k, v in payload.config.items() if not k.startswith(SID)}
    )
    if sids:
        ids = sorted(sids)
        ends = np.cumsum([len(sids[i]) for i in ids], dtype=np.int64)
        blob = np.frombuffer(b"".join(sids[i] for i in ids), dtype=np.uint8)
        content[_SIDS_RECORD] = ArrayRecord(
            array_dict={
                "ids": Array(np.asarray(ids, dtype=np.int64)),
                "ends": Array(ends),
                "blob": Array(blob),
            }
        )
    if payload.arrays:
        content["arrays"] = ArrayRecord(
            array_dict={k: Array(np.ascontiguousarray(v)) for k, v in payload.arrays.items()}
        )
    if payload.metrics:
        content["metrics"] = MetricRecord({k: float(v) for k, v in payload.metrics.items()})
    return content


def _sid_messages(record: Any) -> dict[int, bytes]:
    """The per-user messages of a ``sids`` record; anything malformed is an integrity error."""
    if not isinstance(record, ArrayRecord) or set(record.keys()) != {"ids", "ends", "blob"}:
        raise IntegrityError()
    try:
        ids, ends, blob = (record[k].numpy() for k in ("ids", "ends", "blob"))
    except Exception:
        raise IntegrityError() from None
    if (
        ids.dtype != np.int64
        or ends.dtype != np.int64
        or blob.dtype != np.uint8
        or ids.ndim != 1
        or ends.shape != ids.shape
        or blob.ndim != 1
        or (ids < 0).any()
        or np.unique(ids).size != ids.size
        or (np.diff(ends, prepend=0) < 0).any()
        or (ends.size and ends[-1] != blob.size)
        or (not ends.size and blob.size)
    ):
        raise IntegrityError()
    starts = np.concatenate([[0], ends[:-1]]).tolist()
    return {
        sid: blob[a:b].tobytes()
        for sid, a, b in zip(ids.tolist(), starts, ends.tolist(), strict=True)
    }


def from_content(content: RecordDict) -> Payload:
    """The :class:`Payload` of a Flower ``RecordDict`` (missing parts are empty).

    Raises:
        IntegrityError: The per-user messages' record is malformed.
    """
    payload = Payload()
    if "config" in content:
        payload.config = dict(content["config"])
    if _SIDS_RECORD in content:
        payload.config.update(pack_sids(_sid_messages(content[_SIDS_RECORD])))
    if "arrays" in content:
        payload.arrays = {
            k: v.numpy() for k, v in content["arrays"].items() if isinstance(v, Array)
        }
    if "metrics" in content:
        payload.metrics = {
            k: float(v)  # type: ignore[arg-type]
            for k, v in content["metrics"].items()
        }
    return payload


# ----------------------------------------------------------------------------- server


class GridTransport:
    """:class:`~securefed.flower.server.Transport` over a Flower ``Grid``."""

    def __init__(self, grid: Grid, *, poll: float = 0.05) -> None:
        self.grid = grid
        self.poll = poll
        self.errors: list[tuple[str, int, str]] = []

    def node_ids(self) -> list[int]:
        return sorted(int(n) for n in self.grid.get_node_ids())

    def exchange(
        self, stage: str, messages: Mapping[int, Payload], *, timeout: float
    ) -> dict[int, Payload]:
        online = set(self.node_ids())
        for node in set(messages) - online:  # Flower saw it leave: a dropout, no waiting
            self.errors.append((stage, int(node), "node offline"))
        messages = {n: p for n, p in messages.items() if n in online}
        if not messages:
            return {}
        out = [
            Message(content=to_content(p), dst_node_id=int(node), message_type=MESSAGE_TYPES[stage])
            for node, p in messages.items()
        ]
        replies: dict[int, Payload] = {}
        for reply in self._send_and_receive(out, timeout):
            node = int(reply.metadata.src_node_id)
            if reply.has_error():
                # The node failed (crashed ClientApp, lost SuperNode): a dropout.
                self.errors.append((stage, node, str(reply.error.reason)[:200]))
                logger.warning("node %s failed at stage %s: %s", node, stage, reply.error.code)
                continue
            if node not in messages:
                continue
            try:
                replies[node] = from_content(reply.content)
            except IntegrityError:  # as for a reply the wire decoder rejects: a dropout
                self.errors.append((stage, node, "malformed reply"))
        return replies

    def _send_and_receive(self, messages: list[Message], timeout: float) -> list[Message]:
        """``Grid.send_and_receive`` polling every ``poll`` seconds instead of Flower's 3 s
        (a round has five exchanges; the stage latency is the round time). Only while a
        stage waits for its replies, against the SuperLink's Runtime API next to it."""
        pending = set(self.grid.push_messages(messages))
        deadline = time.monotonic() + timeout
        got: list[Message] = []
        while pending:
            new = list(self.grid.pull_messages(pending))
            got.extend(new)
            pending -= {m.metadata.reply_to_message_id for m in new}
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(self.poll)
        return got


def _shorten_reply_backoff() -> None:
    """The ServerApp pulls a reply's objects from the SuperLink with Flower's 1 s first
    backoff when the node has not finished uploading them (see
    :func:`securefed.flower.supernode.shorten_object_backoff`): start it at 20 ms."""
    try:
        from flwr.superlink.grid import http_grid
    except ImportError:  # another Flower layout: its own backoff applies
        return
    from securefed.flower.supernode import shorten_object_backoff

    shorten_object_backoff(http_grid)


def make_server_app(defaults: Mapping[str, Any] | None = None) -> ServerApp:
    """A ``ServerApp`` running :class:`FederatedServer`; ``defaults`` fill the run config
    (the simulation engine passes its settings this way)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        from securefed.flower.server import FederatedServer, ServerSettings
        from securefed.training import TrainConfig, load_config_file

        _shorten_reply_backoff()
        cfg = {**(defaults or {}), **dict(context.run_config)}
        settings = ServerSettings(
            stage_timeout=float(cfg.get("stage-timeout", 120.0)),
            connect_timeout=float(cfg.get("connect-timeout", 300.0)),
            transcript=bool(cfg.get("transcript", False)),
            enrollment=str(cfg["enrollment"]) if cfg.get("enrollment") else None,
        )
        run_dir = Path(str(cfg["run-dir"]))
        if bool(cfg.get("resume", False)):  # continue from the run directory's checkpoint
            server = FederatedServer.resume(
                run_dir, transport=GridTransport(grid), settings=settings
            )
        else:
            config = TrainConfig.from_dict(load_config_file(str(cfg["config-file"])))
            server = FederatedServer(
                config, run_dir=run_dir, transport=GridTransport(grid), settings=settings
            )
        server.run()

    return app


# ----------------------------------------------------------------------------- client


def make_client_app(defaults: Mapping[str, Any] | None = None) -> ClientApp:
    """A ``ClientApp`` answering every stage with :func:`handle_node_message`.

    ``defaults`` fill the node config (the simulation engine gives only the partition, so
    it passes ``state-root``: node ``p`` then keeps its state in ``<state-root>/node-<p>``).
    Test hook: node config ``fault-stall-at = "<stage>:<round>"`` makes the node write
    ``<state-dir>/stalled`` and hang on that message, so a test can kill the SuperNode
    mid-round at a known point.
    """
    app = ClientApp()

    def handler(stage: str) -> Any:
        def handle(msg: Message, context: Context) -> Message:
            node_config = {**(defaults or {}), **dict(context.node_config)}
            if "state-dir" not in node_config and "state-root" in node_config:
                node_config["state-dir"] = str(
                    Path(str(node_config["state-root"])) / f"node-{node_config['partition-id']}"
                )
            payload = from_content(msg.content)
            _maybe_stall(stage, payload, node_config)
            record = context.state.get(_STATE_RECORD)
            store: dict[str, bytes] = {}
            if isinstance(record, ConfigRecord) and SESSION_KEY in record:
                store[SESSION_KEY] = bytes(record[SESSION_KEY])  # type: ignore[arg-type]
            reply = handle_node_message(
                stage, payload, node_config=node_config, state=store, memory=_PROCESS_MEMORY
            )
            context.state[_STATE_RECORD] = ConfigRecord(dict(store))
            return Message(to_content(reply), reply_to=msg)

        return handle

    app.query("hello")(handler("hello"))
    app.train()(handler("train"))
    app.query("share")(handler("share"))
    app.query("masked")(handler("masked"))
    app.query("consistency")(handler("consistency"))
    app.query("unmask")(handler("unmask"))
    app.evaluate()(handler("evaluate"))
    return app


def _maybe_stall(stage: str, payload: Payload, node_config: Mapping[str, Any]) -> None:
    spec = node_config.get("fault-stall-at")
    if not spec:
        return
    want_stage, _, want_round = str(spec).partition(":")
    if stage == want_stage and str(payload.config.get("round")) == want_round:
        marker = Path(str(node_config["state-dir"])) / "stalled"
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{stage}:{want_round}\n")
        while True:  # until the test kills this SuperNode
            time.sleep(1.0)


#: The components a Flower app's pyproject references.
server_app = make_server_app()
client_app = make_client_app()
