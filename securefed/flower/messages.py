"""The messages between the server and the nodes, independent of the transport.

A :class:`Payload` is what one Flower ``Message`` carries: a config part (scalars, strings,
lists of ints and ``bytes``), an array part (the shared model tensors) and a metrics part (a
node sends none since protocol 7); :func:`securefed.flower.apps.to_content` packs it into a
``ConfigRecord`` and at most one array. Per-user SecAgg messages are in the config part as
``sid.<id> -> bytes``, each one securefed's versioned wire format (``protocols/secagg/wire.py``),
decoded and validated by the same :class:`~protocols.secagg.SecAggClient` /
:class:`~protocols.secagg.SecAggServer` code as in simulation, so a tampered, replayed or
misrouted message raises the same :class:`~securefed.errors.IntegrityError`.

Stages of a round (``STAGES``)::

    hello     server -> node: run token, config    node -> server: partition id and count,
                                                   the dataset's name and sizes
    train     shared model, cohort, public seed    per-user ADVERTISE
    share     per-user KEYS                        per-user SHARES (+ eager MASKED_INPUT)
    masked    per-user FORWARD                     per-user MASKED_INPUT
    consistency  per-user SURVIVORS (malicious mode)  per-user SURVIVORS_SIGNATURE
    unmask    per-user UNMASK_REQUEST (+ FORWARD)  per-user UNMASK_SHARES
              (each user's masked input carries its loss and clip flag: the server learns
              their sums over the survivors with the update's, pipeline.COUNTERS)
    evaluate  shared model, public seed            per-user ADVERTISE of a secure evaluation
              round over every user (then share, masked, unmask as a training round's;
              each user's masked input carries its hits and NDCG: pipeline.EvalParameters)

With eager masking (``"eager": true`` in the share and unmask messages; semi-honest mode,
:mod:`protocols.secagg.client`) a user's share reply carries its masked input too, and when
every user's came the server skips ``masked``: the unmask message then carries each user's
FORWARD with its request. The two wire messages of one user travel as one value
(:func:`join_messages`). A round is then three exchanges instead of four; ``masked`` runs only
as the fallback when some user's share reply is missing.

With keys ahead (:data:`KEYS_AHEAD`, also semi-honest mode) the unmask message announces the
next round (``next-*`` entries and the run's config) and the reply adds that round's per-user
ADVERTISE (``adv.<id>``); the next train message then carries per-user KEYS (``sid.<id>``,
``keys-ahead``: true) and its reply the users' SHARES and eager MASKED_INPUT: two exchanges.

Between the messages of a round a node keeps its round session (the SecAgg secrets) either
as frozen bytes in a store the transport gives back with the next message (Flower's
``Context.state``: one ClientApp process per message) or, when the process outlives the
message, as live objects in a :class:`NodeMemory` (the long-lived ClientApp process of
:mod:`securefed.flower.worker`), which also keeps the node's model between messages.
"""

from __future__ import annotations

import dataclasses
import logging
import tomllib
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from securefed.errors import ConfigError, IntegrityError, ProtocolError

logger = logging.getLogger(__name__)

#: Version 2: large per-user messages travel as one array (apps.to_content). Version 3: the
#: SecAgg wire format of version 2 (masked inputs packed to the ring's bits). Version 4: eager
#: masking (a round's masked inputs travel with its shares). Version 5: SecAgg wire format 3
#: (eager boxes carry shares of the fallback seed b'). Version 6: distributed noise shares
#: sized for each round's own cohort (the round fingerprint carries the share's scale).
#: Version 7: each user's training counters ride in its masked input (pipeline.COUNTERS); the
#: train reply has no metrics. Version 8: evaluation is a secure round over every user (no
#: metrics in the clear). Version 9: the server holds no data; the hello carries the run's
#: config and each node answers with its dataset's name and sizes (data.manifest).
PROTOCOL = "securefed-flower/9"
STAGES = ("hello", "train", "share", "masked", "consistency", "unmask", "evaluate")
#: ``consistency`` runs in malicious mode only (the signed survivor set); ``unmask`` is last.
SECAGG_STAGES = ("share", "masked", "consistency", "unmask")
#: Prefix of per-user SecAgg entries in a config record.
SID = "sid."
#: Prefix of schedule scalars (e.g. FedRAP's learning rates) in a config record.
SCALAR = "scalar."
#: Keys ahead: the next round's task in an unmask request (``next-round``, ``next-cohort``,
#: ``next-public-seed``, ``next-fingerprint``, ``next-aggregate``), the next round's
#: per-user ADVERTISE in the reply (``adv.<id>``), and the train message's flag that its
#: ``sid.<id>`` entries are KEYS.
NEXT = "next-"
NEXT_ROUND = "next-round"
ADVERT = "adv."
KEYS_AHEAD = "keys-ahead"
#: A train reply's only key when the node refuses the round on its own release count
#: (:class:`~securefed.flower.node.ReleaseRefused`): the server stops the run on it.
REFUSED = "release-refused"
#: Key of the node's round session in its ``Context.state``.
SESSION_KEY = "securefed.session"


@dataclass
class Payload:
    """One message's content (see the module docstring)."""

    config: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def pack_sids(messages: Mapping[int, bytes], *, prefix: str = SID) -> dict[str, bytes]:
    return {f"{prefix}{sid}": bytes(msg) for sid, msg in messages.items()}


def unpack_sids(config: Mapping[str, Any], *, prefix: str = SID) -> dict[int, bytes]:
    """Per-user wire messages of a config record; anything malformed is an integrity error."""
    out: dict[int, bytes] = {}
    for key, value in config.items():
        if not key.startswith(prefix):
            continue
        digits = key[len(prefix) :]
        if not digits.isdigit() or not isinstance(value, bytes):
            raise IntegrityError()
        out[int(digits)] = value
    return out


def join_messages(first: bytes, second: bytes) -> bytes:
    """Two wire messages of one user as one value (``len(first)`` as 4 bytes, then both)."""
    return len(first).to_bytes(4, "big") + first + second


def split_messages(value: bytes) -> tuple[bytes, bytes]:
    """The two messages of :func:`join_messages`; a malformed value is an integrity error."""
    if len(value) < 4:
        raise IntegrityError()
    cut = 4 + int.from_bytes(value[:4], "big")
    if cut > len(value):
        raise IntegrityError()
    return bytes(value[4:cut]), bytes(value[cut:])


def _scalars(config: Mapping[str, Any]) -> dict[str, float]:
    return {k[len(SCALAR) :]: float(v) for k, v in config.items() if k.startswith(SCALAR)}


def _int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"message field {key!r} must be an integer, got {value!r}")
    return value


@dataclass
class NodeMemory:
    """What a long-lived node process keeps between messages, in its memory only.

    ``sessions`` holds the round session of the one run in progress (keyed by the
    transport's run id), as live objects: never frozen, never written anywhere; it is
    dropped once the round's unmask stage has run (with keys ahead, replaced by the next
    round's session of fresh keys). ``runtime`` is the node's
    :class:`~securefed.flower.node.NodeRuntime` (split, model, its users' private state,
    aggregator), rebuilt only when the run, config or partition changes; its private state
    is still written to ``state-dir`` after every local training, so a restarted node
    continues from disk.
    """

    sessions: dict[Any, Any] = field(default_factory=dict)
    runtime: Any = None
    runtime_key: tuple[Any, ...] | None = None


def handle_node_message(
    stage: str,
    payload: Payload,
    *,
    node_config: Mapping[str, Any],
    state: MutableMapping[str, bytes],
    memory: NodeMemory | None = None,
) -> Payload:
    """Everything a node does with one message (used by the ClientApp and by tests).

    Args:
        stage: One of :data:`STAGES`.
        payload: The server's message.
        node_config: The SuperNode's ``--node-config``: ``partition-id``, ``num-partitions``
            and ``state-dir`` (where the users' private state persists); ``enrollment`` (the
            enrollment directory file) for malicious-mode secure aggregation.
        state: The node's ephemeral store between messages of a run (``Context.state``):
            the round session travels there, frozen, unless ``memory`` is given.
        memory: The process's own memory when it serves every message of the node (a
            long-lived ClientApp process): the round session stays there as live objects
            and ``state`` holds none; the node's runtime (model, data) is reused.

    Returns:
        The reply.
    """
    if payload.config.get("protocol") != PROTOCOL:
        raise ProtocolError(
            f"message protocol {payload.config.get('protocol')!r} is not {PROTOCOL!r}; "
            "run the same securefed version on the server and the nodes"
        )
    pid = _node_int(node_config, "partition-id")
    nparts = _node_int(node_config, "num-partitions")
    if stage == "hello":
        # The node's own settings are checked when it joins: a mistake there is named in the
        # server's error at once, not met at every round's train message as a dropout (or,
        # for a partition id past the count, after the server's connect timeout).
        _check_node_config(node_config, pid, nparts)
        manifest = _manifest(payload, node_config)
        return Payload(config={"partition-id": pid, "num-partitions": nparts, **manifest})
    token = str(payload.config.get("run-token", ""))
    if stage in SECAGG_STAGES:
        inbox = unpack_sids(payload.config)
        announced = stage == SECAGG_STAGES[-1] and NEXT_ROUND in payload.config
        replies: dict[int, bytes] = {}
        if inbox or not announced:  # an announcement alone may reach a node without users
            session = _session(token, state, memory)
            if session is None:
                raise ProtocolError(f"{stage} message without a round session on this node")
            if _int(payload.config, "round") != session.round_index:
                raise IntegrityError()
            eager = payload.config.get("eager", False) is True
            replies = session.step(stage, inbox, eager=eager)
            if memory is None:
                state[SESSION_KEY] = session.freeze()
            elif stage == SECAGG_STAGES[-1]:
                memory.sessions.pop(token, None)  # the round's secrets are no longer needed
        reply = Payload(config=pack_sids(replies))
        if not announced:
            return reply
        # keys ahead: the next round's advertisements travel with this round's last reply
        runtime = _runtime(payload, node_config, memory, token, pid, nparts)
        upcoming, adverts = runtime.advertise(_task(payload.config, prefix=NEXT))
        _keep(upcoming, token, state, memory)
        reply.config.update(pack_sids(adverts, prefix=ADVERT))
        return reply
    if stage not in ("train", "evaluate"):
        raise ProtocolError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)}")
    runtime = _runtime(payload, node_config, memory, token, pid, nparts)
    try:
        return _run_task(stage, payload, runtime, token, state, memory)
    except BaseException:
        if memory is not None:  # a failed step may leave the model half-updated: reload
            memory.runtime = memory.runtime_key = None
        raise


def _check_node_config(node_config: Mapping[str, Any], pid: int, nparts: int) -> None:
    """Refuse a SuperNode's ``--node-config`` that cannot serve a run: a partition outside
    ``[0, num-partitions)``, no ``state-dir``."""
    from securefed.flower.node import partition_users

    try:
        partition_users(nparts, pid, nparts)  # its range checks, in one place
    except ConfigError as exc:
        raise ConfigError(
            f"{exc} in the SuperNode's --node-config; give each of the N SuperNodes "
            "num-partitions=N and its own partition-id from 0 to N-1"
        ) from None
    _state_dir(node_config)


def _state_dir(node_config: Mapping[str, Any]) -> str:
    state_dir = node_config.get("state-dir")
    if not state_dir:
        raise ConfigError(
            "the SuperNode needs --node-config 'state-dir=\"/path\"': its users' private "
            "model state persists there between rounds and across restarts"
        )
    return str(state_dir)


def _manifest(payload: Payload, node_config: Mapping[str, Any]) -> dict[str, Any]:
    """The hello reply's description of the node's dataset (the run's config names it, and a
    node with ``pin-config`` checks it against its own copy first): its name and sizes, all
    the server learns of it (:mod:`securefed.data.manifest`)."""
    from securefed.data.manifest import manifest_of
    from securefed.flower.node import node_split

    config = _run_config(payload, "hello")
    token = str(payload.config.get("run-token", ""))
    # The node's own partition: the split it builds its runtime on next (node.node_split).
    partition = (_node_int(node_config, "partition-id"), _node_int(node_config, "num-partitions"))
    pinned = node_config.get("pin-config")
    if pinned:
        check_pinned(config, Path(str(pinned)), lambda: node_split(config, token, partition))
    expected = node_config.get("data-sha256")
    if expected:
        check_data_sha256(config.dataset, str(expected))
    return manifest_of(node_split(config, token, partition)).fields()


def check_data_sha256(dataset: str, expected: str) -> None:
    """Refuse a run on a dataset file whose SHA-256 is not the one the node operator gave
    (``--node-config 'data-sha256="<sha256sum of the file>"'``): the server compares the
    nodes' dataset names and sizes only (it reads no data, and a digest of the data is an
    exact function of it), so two nodes holding different files of the same name and sizes
    (a relative path, another file at that path) would train one model on different data
    unnoticed (found in a deployment walkthrough). The digest stays on the node: the error,
    which reaches the server, does not carry it.

    Raises:
        ProtocolError: The file's digest differs, or the dataset is a built-in name.
    """
    from securefed.data.registry import dataset_sha256

    found = dataset_sha256(dataset)
    if found is None:
        raise ProtocolError(
            f"data-sha256 checks a dataset file, and this run's dataset is {dataset!r} (built "
            "in: its files are checked against their publishers' checksums); drop data-sha256"
        )
    if found != expected.strip().lower():
        # The reason travels to the server (Flower sends a ClientApp's error text): no digest
        # in it, not even a prefix (found in review); the node's own log has the digest.
        logger.warning("dataset %s: SHA-256 %s, data-sha256 %s", dataset, found, expected)
        raise ProtocolError(
            f"this node's dataset {dataset} is not the file its node-config's data-sha256 "
            "names (its SHA-256 differs): it holds another file than the operator's; give "
            "this node the operator's copy (the node's log has both digests)"
        )


def _run_config(payload: Payload, what: str) -> Any:
    """The run's config a message carries (the server's, as sent)."""
    from securefed.training import TrainConfig

    if "config" not in payload.config:
        raise ProtocolError(f"{what} without the run's config")
    return TrainConfig.from_dict(tomllib.loads(str(payload.config["config"])))


def _session(token: str, state: MutableMapping[str, bytes], memory: NodeMemory | None) -> Any:
    """The node's round session (live in ``memory``, else frozen in ``state``), or None."""
    from securefed.flower.session import NodeSession

    if memory is not None:
        return memory.sessions.get(token)
    blob = state.get(SESSION_KEY)
    return NodeSession.thaw(blob) if blob is not None else None


def _keep(
    session: Any, token: str, state: MutableMapping[str, bytes], memory: NodeMemory | None
) -> None:
    """Keep ``session`` as the node's round session until the next message."""
    if memory is not None:
        memory.sessions = {token: session}  # the run in progress only
        state.pop(SESSION_KEY, None)
    else:
        state[SESSION_KEY] = session.freeze()


def _runtime(
    payload: Payload,
    node_config: Mapping[str, Any],
    memory: NodeMemory | None,
    token: str,
    pid: int,
    nparts: int,
) -> Any:
    """The node's :class:`~securefed.flower.node.NodeRuntime` for the message's run and
    config (the long-lived process's own, when it is that one)."""
    from securefed.flower.node import NodeRuntime, config_digest, node_split

    config = _run_config(payload, "message")
    state_dir = _state_dir(node_config)
    enrolled = node_config.get("enrollment")
    pinned = node_config.get("pin-config")
    key = (token, config_digest(config), pid, nparts, str(state_dir), str(enrolled), str(pinned))
    if memory is not None and memory.runtime_key == key:
        return memory.runtime  # built for this very config and pin: checked then
    if pinned:
        check_pinned(config, Path(str(pinned)), lambda: node_split(config, token, (pid, nparts)))
    runtime = NodeRuntime(
        config,
        run_token=str(payload.config["run-token"]),
        partition_id=pid,
        num_partitions=nparts,
        state_dir=Path(str(state_dir)),
        enrollment=Path(str(enrolled)) if enrolled else None,
    )
    if memory is not None:
        memory.runtime, memory.runtime_key = runtime, key
    return runtime


#: The settings naming the data a node reads (a server could otherwise have it load another
#: file and report its sizes in the hello), pinned.
DATA_SETTINGS = (
    "dataset",
    "data_dir",
    "columns",
    "eval_negatives",
    "min_interactions",
    "synthetic_users",
    "synthetic_items",
)
#: Settings outside ``[privacy]`` that size the noise and the accounting (the model's default
#: cohort, the planned rounds, the cohort's rate or size), pinned with it, and the data's.
PINNED_SETTINGS = ("model", "rounds", "client_fraction", "clients_per_round", *DATA_SETTINGS)


def _differences(config: Any, pinned: Any) -> dict[str, str]:
    """Setting -> ``"key = sent (pinned ours)"`` for every pinned setting that differs."""
    mine, sent = dataclasses.asdict(pinned.privacy), dataclasses.asdict(config.privacy)
    differ = {
        k: f"{k} = {sent.get(k)!r} (pinned {v!r})" for k, v in mine.items() if sent.get(k) != v
    }
    for key in PINNED_SETTINGS:
        ours, theirs = getattr(pinned, key), getattr(config, key)
        if ours != theirs:
            differ[key] = f"{key} = {theirs!r} (pinned {ours!r})"
    return differ


def check_pinned(config: Any, path: Path, split: Callable[[], Any] | None = None) -> None:
    """Refuse a run whose privacy settings differ from the node operator's own copy of the
    run's config (``--node-config 'pin-config="/path/run.toml"'``).

    The config reaches a node from the server with every message, and the node derives its
    noise shares, the secure-aggregation threshold and the mode from it: without a copy of
    its own, a server could lower ``epsilon`` or add a smaller ``noise_multiplier`` (so the
    nodes add less noise), lower the corruption bound (so ``t`` drops), or switch the mode;
    and since the noise is calibrated for the planned rounds at the cohort's sampling rate,
    and the node's own release count (:class:`~securefed.flower.pipeline.ReleaseLedger`)
    is amplified by that rate, a smaller ``client_fraction`` or more ``rounds`` would buy
    smaller noise and more releases (found in review: 201 releases at sigma 0.66 where the
    operator's config allowed 20 at 2.85). Every ``[privacy]`` setting and
    :data:`PINNED_SETTINGS` are compared, resolved as a run resolves them (defaults for what
    the file leaves out, legacy keys translated).

    A model may settle some of them from the data when a run starts (the private fedals'
    population rule raises a large population's rounds from 3 to 4: ``resolve_for_data``),
    and the server sends its settled config: where only such settings differ and the data
    settings (:data:`DATA_SETTINGS`) agree, ``split`` (the node's data, loaded only then)
    settles the pinned copy as a run would, and the server's config as sent is compared with
    it. The node settles only its operator's copy, on its own data: what the server sends is
    compared, never settled (settling it let a server send 3 rounds with the large
    population's setting against a copy pinned at 4, found in review).

    Raises:
        ProtocolError: a setting differs (named, with both values), or the file is unreadable.
    """
    from securefed.training import TrainConfig, load_config_file

    try:
        pinned = TrainConfig.from_dict(load_config_file(path))
    except (OSError, ValueError) as exc:
        raise ProtocolError(f"cannot read this node's pinned config {path}: {exc}") from None
    differ = _differences(config, pinned)
    resolve = pinned.spec.resolve_for_data
    if (
        differ
        and not set(differ) & set(DATA_SETTINGS)
        and split is not None
        and resolve is not None
        and config.model == pinned.model
    ):
        differ = _differences(config, resolve(pinned, split())[0])
    if differ:
        raise ProtocolError(
            "the server's run differs from this node's pinned config "
            f"{path}: {'; '.join(differ.values())}; refused"
        )


def _task(config: Mapping[str, Any], *, prefix: str = "") -> Any:
    """The :class:`~securefed.flower.node.TrainTask` of a message (``prefix`` ``"next-"``:
    the next round's, sent with this round's unmask request for keys ahead)."""
    import torch

    from securefed.flower.node import TrainTask

    cohort = config.get(f"{prefix}cohort", [])
    if not isinstance(cohort, list) or not all(isinstance(u, int) for u in cohort):
        raise ProtocolError(f"message field '{prefix}cohort' must be a list of user ids")
    return TrainTask(
        round_index=_int(config, f"{prefix}round"),
        cohort=torch.tensor(cohort, dtype=torch.long),
        public_seed=bytes(config.get(f"{prefix}public-seed", b"")),
        fingerprint=str(config.get(f"{prefix}fingerprint", "")),
        aggregate=bool(config.get(f"{prefix}aggregate", False)),
        resume=bool(config.get(f"{prefix}resume", False)),
    )


def _run_task(
    stage: str,
    payload: Payload,
    runtime: Any,
    token: str,
    state: MutableMapping[str, bytes],
    memory: NodeMemory | None,
) -> Payload:
    """``train`` or ``evaluate`` on the node's runtime."""
    scalars = _scalars(payload.config)
    if stage == "evaluate":  # a secure evaluation round: its users' advertisements
        from securefed.flower.node import EvalTask

        task = EvalTask(
            round_index=_int(payload.config, "round"),
            public_seed=bytes(payload.config.get("public-seed", b"")),
            fingerprint=str(payload.config.get("fingerprint", "")),
            full=payload.config.get("full", False) is True,
        )
        reply = runtime.evaluate(task, payload.arrays, scalars)
        _keep(reply.session, token, state, memory)
        return Payload(config=pack_sids(reply.adverts))
    from securefed.flower.node import ReleaseRefused

    task = _task(payload.config)
    try:
        if payload.config.get(KEYS_AHEAD, False) is True:
            ahead = _session(token, state, memory)
            if ahead is None or ahead.round_index != task.round_index:
                raise ProtocolError("train message with keys ahead but no advertised session here")
            reply = runtime.train(
                task, payload.arrays, scalars, ahead=ahead, keys=unpack_sids(payload.config)
            )
        else:
            reply = runtime.train(task, payload.arrays, scalars)
    except ReleaseRefused as exc:
        return Payload(config={REFUSED: str(exc)})
    _keep(reply.session, token, state, memory)
    # No counters: each user's loss and clip flag are in its masked input (pipeline.COUNTERS).
    return Payload(config=pack_sids(reply.adverts))


def _node_int(node_config: Mapping[str, Any], key: str) -> int:
    value = node_config.get(key)
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"the SuperNode needs --node-config '{key}=<int>' (got {value!r}); e.g. "
            "--node-config 'partition-id=0 num-partitions=3'"
        )
    return value


NodeHandler = Callable[[str, Payload], Payload]
