"""Flower's ``ServerApp`` and ``ClientApp`` for securefed (Flower 1.42 Message API).

Flower carries the messages; securefed does everything else. A :class:`Payload` becomes a
``RecordDict`` of a ``ConfigRecord`` (``"config"``: scalars, strings, small per-user SecAgg
messages as bytes, metrics as floats, and the index of the packed part) and, when there is
something to pack, one ``ArrayRecord`` (``"packed"``: the shared model's arrays and large
per-user messages back to back in one uint8 array; :func:`to_content`). Flower's SecAgg+ mod
and DP wrappers are not used.

Components (referenced by the app's ``pyproject.toml``)::

    serverapp = "securefed.flower.apps:server_app"
    clientapp = "securefed.flower.apps:client_app"

Run config of the ``ServerApp`` (``[tool.flwr.app.config]`` or ``flwr run --run-config``):
``config-file`` (the run's securefed TOML, a path on the SuperLink's machine), ``run-dir``
(created there), ``stage-timeout`` (seconds), ``transcript`` (bool), ``resume`` (bool:
continue the interrupted run in ``run-dir`` from its last checkpoint with the config it
recorded), ``eager-masking`` (bool, default true: masked inputs travel with the shares) and
``keys-ahead`` (bool, default true: the next round's keys travel with the unmask replies; both
:class:`~securefed.flower.server.ServerSettings`). Node config of each SuperNode
(``--node-config``): ``partition-id``, ``num-partitions``, ``state-dir``.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from securefed.errors import ConfigError, IntegrityError, SecureFedError
from securefed.flower.messages import (
    SESSION_KEY,
    SID,
    NodeMemory,
    Payload,
    handle_node_message,
    pack_sids,
    unpack_sids,
)

if TYPE_CHECKING:
    from securefed.training import RoundRecord

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


#: The record holding a message's packed bytes (:func:`to_content`).
_PACKED = "packed"
#: From this many bytes of per-user messages a message packs them, below it they stay
#: ``ConfigRecord`` bytes values (nothing else to pack: one Flower object instead of four; a
#: small stage's latency is per object, a large one's per byte).
SIDS_ARRAY_BYTES = 1 << 20
#: Dtypes a packed array may have.
_ARRAY_DTYPES = frozenset({"float32", "float64", "int32", "int64", "uint8", "uint64", "bool"})
_SID_IDS, _SID_ENDS = "sid-ids", "sid-ends"
_ARRAY_KEYS = ("array-names", "array-dtypes", "array-ndims", "array-dims", "array-ends")
_METRIC = "metric."
_INDEX = frozenset({_SID_IDS, _SID_ENDS, *_ARRAY_KEYS})


def to_content(payload: Payload) -> RecordDict:
    """A :class:`Payload` as a Flower ``RecordDict`` of as few Flower objects as it can be.

    Flower pushes and pulls every object of a message (record, array, chunk) as its own
    request at every hop (ServerApp -> SuperLink -> SuperNode -> ClientApp and back), and
    hashes and serializes a ``ConfigRecord``'s bytes values in Python. So the model arrays and
    per-user SecAgg messages of at least :data:`SIDS_ARRAY_BYTES` in all travel back to back
    in one uint8 array (the ``"packed"`` ``ArrayRecord``), indexed by lists in the config
    (``sid-ids``/``sid-ends``; ``array-names``/``-dtypes``/``-ndims``/``-dims``/``-ends``), and
    metrics as ``metric.<name>`` floats of the config: a node's masked inputs at FedRAP
    ML-100K's size (314 users x 430 KB) took 2.8 s to prepare for each hop as bytes values,
    0.3 s as an array; FedRecGEL's ten model tensors made a train message's content 23
    objects, now 5.
    """
    config = dict(payload.config)
    parts: list[bytes] = []
    end = 0
    sids = unpack_sids(config)
    if sum(len(m) for m in sids.values()) >= SIDS_ARRAY_BYTES:
        ids = sorted(sids)
        config = {k: v for k, v in config.items() if not k.startswith(SID)}
        ends = []
        for i in ids:
            parts.append(sids[i])
            end += len(sids[i])
            ends.append(end)
        config[_SID_IDS], config[_SID_ENDS] = ids, ends
    if payload.arrays:
        names: list[str] = []
        dtypes: list[str] = []
        ndims: list[int] = []
        dims: list[int] = []
        ends = []
        for name, value in payload.arrays.items():
            arr = np.asarray(value, order="C")
            names.append(name)
            dtypes.append(arr.dtype.name)
            ndims.append(arr.ndim)
            dims.extend(int(d) for d in arr.shape)
            parts.append(arr.tobytes())
            end += arr.nbytes
            ends.append(end)
        config.update(zip(_ARRAY_KEYS, (names, dtypes, ndims, dims, ends), strict=True))
    config.update({f"{_METRIC}{k}": float(v) for k, v in payload.metrics.items()})
    content = RecordDict({"config": ConfigRecord(config)})
    if parts:
        blob = np.frombuffer(b"".join(parts), dtype=np.uint8)
        content[_PACKED] = ArrayRecord(array_dict={"blob": Array(blob)})
    return content


def _int_list(value: Any) -> list[int]:
    if not (isinstance(value, list) and all(type(v) is int for v in value)):
        raise IntegrityError()
    return value


def _unpack(config: dict[str, Any], record: Any) -> tuple[dict[int, bytes], dict[str, np.ndarray]]:
    """The per-user messages and arrays packed by :func:`to_content` (removing their index
    from ``config``); anything malformed is an integrity error."""
    index = {k: config.pop(k) for k in _INDEX if k in config}
    if not isinstance(record, ArrayRecord) or set(record.keys()) != {"blob"}:
        raise IntegrityError()
    try:
        blob = record["blob"].numpy()
    except Exception:
        raise IntegrityError() from None
    if blob.dtype != np.uint8 or blob.ndim != 1:
        raise IntegrityError()
    sid_ids = _int_list(index.get(_SID_IDS, []))
    sid_ends = _int_list(index.get(_SID_ENDS, []))
    names, dtypes = index.get("array-names", []), index.get("array-dtypes", [])
    ndims, dims = _int_list(index.get("array-ndims", [])), _int_list(index.get("array-dims", []))
    array_ends = _int_list(index.get("array-ends", []))
    ends = sid_ends + array_ends
    starts = [0, *ends[:-1]]
    if (
        len(sid_ids) != len(sid_ends)
        or not (isinstance(names, list) and isinstance(dtypes, list))
        or not len(names) == len(dtypes) == len(ndims) == len(array_ends)
        or not ends
        or ends[-1] != blob.size
        or any(b < a for a, b in zip(starts, ends, strict=True))
        or any(i < 0 for i in sid_ids)
        or len(set(sid_ids)) != len(sid_ids)
        or not all(isinstance(n, str) for n in names)
        or len(set(names)) != len(names)
        or not all(isinstance(d, str) and d in _ARRAY_DTYPES for d in dtypes)
        or any(n < 0 for n in ndims)
        or sum(ndims) != len(dims)
        or any(d < 0 for d in dims)
    ):
        raise IntegrityError()
    messages = {
        sid: blob[a:b].tobytes()
        for sid, a, b in zip(sid_ids, starts[: len(sid_ids)], sid_ends, strict=True)
    }
    arrays: dict[str, np.ndarray] = {}
    at = 0
    for name, dtype, ndim, a, b in zip(
        names, dtypes, ndims, starts[len(sid_ids) :], array_ends, strict=True
    ):
        shape = tuple(dims[at : at + ndim])
        at += ndim
        dt = np.dtype(dtype)
        if int(np.prod(shape, dtype=np.int64)) * dt.itemsize != b - a:
            raise IntegrityError()
        arrays[name] = blob[a:b].view(dt).reshape(shape).copy()  # writable and aligned
    return messages, arrays


def from_content(content: RecordDict) -> Payload:
    """The :class:`Payload` of a Flower ``RecordDict`` (missing parts are empty).

    Raises:
        IntegrityError: The packed part or its index is malformed.
    """
    config = dict(content["config"]) if "config" in content else {}
    payload = Payload()
    if _PACKED in content or any(k in config for k in _INDEX):
        messages, payload.arrays = _unpack(config, content.get(_PACKED))
        config.update(pack_sids(messages))
    for key in [k for k in config if k.startswith(_METRIC)]:
        value = config.pop(key)
        if not isinstance(value, float):
            raise IntegrityError()
        payload.metrics[key[len(_METRIC) :]] = value
    payload.config = config
    return payload


# ----------------------------------------------------------------------------- server


def log_round(rec: RoundRecord) -> None:
    """One line per round in the ServerApp's log (what `flwr run --stream` and `flwr log`
    show; `securefed flower local` prints its own from metrics.jsonl)."""
    from flwr.common.logger import log

    r = rec.values
    parts = [f"round {r['round']}"]
    if isinstance(r.get("loss"), float) and math.isfinite(r["loss"]):
        parts.append(f"loss {r['loss']:.4g}")
    parts.append(f"{r.get('contributors', 0)} of {r.get('participants', 0)} users summed")
    if r.get("epsilon") is not None:
        parts.append(f"epsilon {r['epsilon']:.3f}")
    if r.get("val_hr@10") is not None:
        parts.append(f"validation HR@10 {r['val_hr@10']:.4f}")
    for key in ("aborted", "eval_aborted"):
        if r.get(key):
            parts.append(f"{key.replace('_', ' ')}: {r[key]}")
    log(logging.INFO, "securefed: %s", ", ".join(parts))
    if rec.warning:
        log(logging.WARNING, "securefed: %s", rec.warning)


def log_outcome(summary: Mapping[str, Any], run_dir: Path) -> None:
    """The run's outcome in the ServerApp's log: a run stopped by the budget (the nodes'
    or the server's) ended as 'completed' for Flower, its reason only in summary.json (found
    in a deployment walkthrough)."""
    from flwr.common.logger import log

    done = f"securefed: {summary.get('rounds')} of {summary.get('rounds_planned')} rounds"
    if summary.get("epsilon") is not None:
        done += f", epsilon {summary['epsilon']:.3f}"
    log(
        logging.INFO,
        "%s; results in %s, beside random, MostPop and DP-MostPop once whoever holds the data "
        "runs: securefed flower yardsticks %s --dataset <the data>",
        done,
        run_dir,
        run_dir,
    )
    if summary.get("stopped"):
        log(logging.WARNING, "securefed: stopped early: %s", summary["stopped"])


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
                # The node failed (crashed ClientApp, lost SuperNode, refused the message): a
                # dropout.
                reason = node_reason(str(reply.error.reason))
                self.errors.append((stage, node, reason[:1000]))
                logger.warning(
                    "node %s failed at stage %s (Flower error code %s): %s",
                    node,
                    stage,
                    reply.error.code,
                    reason[:500],
                )
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


#: How Flower words the reason of an exception a ClientApp raised: ``<class 'mod.Name'>:<'text'>``.
_FLOWER_REASON = re.compile(r"<class '(?:[\w.]*\.)?(\w+)'>:<'(.*)'>", re.DOTALL)


def node_reason(reason: str) -> str:
    """A node's error reason as one line: ``Name: text`` for Flower's wording of an exception
    (securefed's ClientApp already answers a refusal so), whitespace runs folded."""
    found = _FLOWER_REASON.fullmatch(reason.strip())
    if found:
        reason = f"{found[1]}: {found[2]}"
    return " ".join(reason.split()) or "no reason given"


class _OneLineReasons(logging.Filter):
    """Flower logs an exception its app raised with the whole traceback ("ServerApp raised an
    exception", then the frames of Flower and securefed around the reason). securefed's own
    errors (:class:`~securefed.errors.SecureFedError`: a mistake in the config, the data or a
    node's settings, a refused run) say what was wrong and what to do in one line: that line
    is logged, without the frames. Any other exception (a bug) keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, SecureFedError):
            record.msg, record.args = "securefed: %s", (str(exc),)
            record.exc_info = None
            record.exc_text = None
        return True


def quiet_tracebacks_of_reasons() -> None:
    """In this process, Flower logs securefed's errors as one line (:class:`_OneLineReasons`),
    and its log records are printed by its own handler only: opacus configures the root
    logger when imported, which printed every Flower line (and traceback) a second time, and
    its DEBUG lines."""
    flwr_logger = logging.getLogger("flwr")
    if not any(isinstance(f, _OneLineReasons) for f in flwr_logger.filters):
        flwr_logger.addFilter(_OneLineReasons())
    flwr_logger.propagate = False


def _run_setting(cfg: Mapping[str, Any], key: str, kind: type, default: Any = None) -> Any:
    """Run config ``key`` (the app's ``pyproject.toml`` or ``flwr run --run-config``) as
    ``kind``, refused in one line when missing (without a default) or of another type."""
    if key not in cfg:
        if default is None:
            raise ConfigError(
                f"the app's run config has no {key!r}; write the app with `securefed flower "
                "app` (or give it: flwr run APP <connection> --run-config "
                f"'{key}=...')"
            )
        return default
    value = cfg[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is str and isinstance(value, str) and value.strip():
        return value
    if kind is not str and type(value) is kind:
        return value
    want = {bool: "true or false", float: "a number of seconds", str: "a non-empty path"}[kind]
    raise ConfigError(
        f"run config {key} must be {want}, got {value!r}; fix it in the app's pyproject.toml "
        "or in flwr run --run-config"
    )


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
        # A mistake (the config, the run directory, a node's data or settings) ends the run
        # with its one-line reason in the log (`flwr run --stream`, `flwr log`), not in a
        # traceback; Flower still marks the run failed.
        quiet_tracebacks_of_reasons()
        from securefed.config import refuse_legacy_secure, refuse_other_model_tables
        from securefed.flower.server import FederatedServer, ServerSettings
        from securefed.training import (
            TrainConfig,
            check_run_dir_writable,
            load_config_file,
            refuse_foreign_files,
        )

        _shorten_reply_backoff()
        cfg = {**(defaults or {}), **dict(context.run_config)}
        enrollment = _run_setting(cfg, "enrollment", str, "") if cfg.get("enrollment") else ""
        settings = ServerSettings(
            stage_timeout=_run_setting(cfg, "stage-timeout", float, 120.0),
            connect_timeout=_run_setting(cfg, "connect-timeout", float, 300.0),
            transcript=_run_setting(cfg, "transcript", bool, False),
            enrollment=enrollment or None,
            eager_masking=_run_setting(cfg, "eager-masking", bool, True),
            keys_ahead=_run_setting(cfg, "keys-ahead", bool, True),
        )
        run_dir = Path(_run_setting(cfg, "run-dir", str))
        if _run_setting(cfg, "resume", bool, False):  # continue from the run's checkpoint
            server = FederatedServer.resume(
                run_dir, transport=GridTransport(grid), settings=settings
            )
        else:
            config_file = _run_setting(cfg, "config-file", str)
            raw = load_config_file(config_file)
            refuse_legacy_secure(raw, config_file)
            config = TrainConfig.from_dict(raw)
            refuse_other_model_tables(raw, config_file)
            # Before waiting for the nodes: a run directory it could not write was a
            # PermissionError traceback once every node had connected.
            refuse_foreign_files(run_dir)
            check_run_dir_writable(run_dir)
            server = FederatedServer(
                config, run_dir=run_dir, transport=GridTransport(grid), settings=settings
            )
        server.progress = log_round
        log_outcome(server.run().summary, run_dir)

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
            try:
                payload = from_content(msg.content)
                _maybe_stall(stage, payload, node_config)
                record = context.state.get(_STATE_RECORD)
                store: dict[str, bytes] = {}
                if isinstance(record, ConfigRecord) and SESSION_KEY in record:
                    store[SESSION_KEY] = bytes(record[SESSION_KEY])  # type: ignore[arg-type]
                reply = handle_node_message(
                    stage, payload, node_config=node_config, state=store, memory=_PROCESS_MEMORY
                )
            except SecureFedError as exc:
                return _refusal(stage, exc, msg)
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


def _refusal(stage: str, exc: SecureFedError, msg: Message) -> Message:
    """The error reply of a node that refuses or cannot handle ``msg`` for a reason of
    securefed's own (its data, its node config, its pinned config, its release count, a
    message that fails validation): the server sees the node fail the stage, as for a
    ClientApp that raised, with the reason as one line (``DataError: ...``); the node's log
    gets the same line. An exception raised instead was logged with its traceback by the
    ClientApp's process (the long-lived worker, Flower's ``flwr-clientapp``, the simulation
    engine), and reached the server as ``<class '...'>:<'...'>``."""
    from flwr.app import Error
    from flwr.common.constant import ErrorCode

    reason = f"{type(exc).__name__}: {exc}"
    logger.error("securefed: this node failed the %s message: %s", stage, reason)
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg)


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
