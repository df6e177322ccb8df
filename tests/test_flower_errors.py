"""A mistake on the by-hand path of docs/deployment.md ends in one line, not a traceback.

Started by hand (``flower-superlink``, ``python -m securefed.flower.supernode`` and its worker,
``flwr run``), Flower's processes logged securefed's one-line reasons inside Python
tracebacks: the ServerApp's ("ServerApp raised an exception" and the frames of Flower and
securefed around a bad config or a node's refusal, twice), a node's (the worker's or
``flwr-clientapp``'s, for a dataset it could not read), a worker whose SuperNode exited (a
``KeyboardInterrupt`` from inside torch's import). Also here: the config files ``flower
enroll`` and ``flower app`` read are refused as ``securefed train --config`` refuses them.
"""

from __future__ import annotations

import io
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'securefed[flower]')")

from flwr.app import Context, Message, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from securefed import runs  # noqa: E402
from securefed.errors import ConfigError  # noqa: E402
from securefed.flower import apps  # noqa: E402
from securefed.flower.local import LocalTransport  # noqa: E402
from securefed.flower.messages import PROTOCOL, Payload, handle_node_message  # noqa: E402
from securefed.flower.server import FederatedServer, ServerSettings  # noqa: E402
from securefed.training import PrivacyConfig, TrainConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _cfg(**kwargs) -> TrainConfig:
    kwargs.setdefault("synthetic_users", 60)
    kwargs.setdefault("synthetic_items", 400)
    kwargs.setdefault("rounds", 1)
    return TrainConfig(privacy=PrivacyConfig(secagg=True, epsilon=8.0), **kwargs)


def _hello(cfg: TrainConfig) -> Payload:
    return Payload(
        config={"protocol": PROTOCOL, "run-token": "t0", "config": runs.dumps_toml(cfg.to_dict())}
    )


@pytest.fixture
def flwr_logger():
    """Flower's logger, its filters and propagation put back afterwards (the ServerApp sets
    them for its whole process); yields the text a handler of its own receives."""
    logger = logging.getLogger("flwr")
    filters, propagate = list(logger.filters), logger.propagate
    text = io.StringIO()
    handler = logging.StreamHandler(text)
    logger.addHandler(handler)
    try:
        yield logger, text
    finally:
        logger.removeHandler(handler)
        logger.filters[:] = filters
        logger.propagate = propagate


# ----------------------------------------------------------------------------- the ServerApp


def _serve(run_config: dict, tmp_path: Path) -> None:
    """The ServerApp's main on ``run_config``, with no grid: whatever it refuses, it must
    refuse before it talks to any node."""
    context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    apps.make_server_app()(grid=None, context=context)  # type: ignore[arg-type]


def test_the_server_app_refuses_a_bad_run_config_in_one_line(tmp_path, flwr_logger):
    good = tmp_path / "run.toml"
    good.write_text(runs.dumps_toml(_cfg().to_dict()))
    other = tmp_path / "other.toml"
    other.write_text('model = "fedrap"\n[fedals]\ndim = 8\n[privacy]\nsecagg = true\n')
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("someone's notes")
    run = str(tmp_path / "run")
    for run_config, want in (
        ({"config-file": str(good)}, "the app's run config has no 'run-dir'"),
        ({"run-dir": run}, "the app's run config has no 'config-file'"),
        (
            {"config-file": str(good), "run-dir": run, "stage-timeout": "soon"},
            "run config stage-timeout must be a number of seconds, got 'soon'",
        ),
        (
            {"config-file": str(good), "run-dir": run, "transcript": "yes"},
            "run config transcript must be true or false",
        ),
        ({"config-file": str(other), "run-dir": run}, "[fedals] in"),
        # Found in a walkthrough: a run directory the server cannot write was a
        # PermissionError traceback once every node had connected.
        (
            {"config-file": str(good), "run-dir": str(blocker / "run")},
            "is a file, not a folder",
        ),
        ({"config-file": str(good), "run-dir": str(full)}, "already holds other files"),
    ):
        with pytest.raises(ConfigError) as info:
            _serve(run_config, tmp_path)
        assert want in str(info.value), (run_config, str(info.value))
        assert "\n" not in str(info.value)
    assert not (tmp_path / "run").exists()


def test_flower_logs_a_refused_run_in_one_line_and_a_bug_with_its_traceback(flwr_logger):
    """What Flower's ``run_serverapp`` does with the exception the ServerApp raised (``log(ERROR,
    "%s raised an exception", "ServerApp", exc_info=ex)``), once the ServerApp ran: its one
    line for securefed's own error; any other exception keeps its frames."""
    from flwr.supercore import log

    logger, text = flwr_logger
    apps.quiet_tracebacks_of_reasons()

    def raise_(exc: Exception) -> Exception:
        try:
            raise exc
        except Exception as caught:
            return caught

    reason = "node 7 failed the hello: DataError: unknown dataset 'x.csv'; fix that node"
    log(logging.ERROR, "%s raised an exception", "ServerApp", exc_info=raise_(ConfigError(reason)))
    assert text.getvalue() == f"securefed: {reason}\n"
    assert not logger.propagate  # not a second time through the root logger opacus configures
    log(logging.ERROR, "%s raised an exception", "ServerApp", exc_info=raise_(KeyError("bug")))
    bug = text.getvalue().split("\n", 1)[1]
    assert bug.startswith("ServerApp raised an exception\nTraceback") and "KeyError" in bug


# ----------------------------------------------------------------------------- a node


@pytest.fixture
def task_identity(monkeypatch):
    """What Flower sets in a ClientApp's process before it builds a message."""
    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


def test_a_node_refuses_a_message_with_an_error_reply_of_one_line(tmp_path, task_identity):
    """A node whose dataset is missing answered the hello by raising: the worker (or Flower's
    ``flwr-clientapp``, or the simulation engine) logged the traceback, and the server's line
    carried Flower's ``<class 'protocols.errors.DataError'>:<'...'>``."""
    cfg = _cfg(dataset=str(tmp_path / "missing.csv"))
    msg = Message(content=apps.to_content(_hello(cfg)), dst_node_id=7, message_type="query.hello")
    node_config = {"partition-id": 0, "num-partitions": 2, "state-dir": str(tmp_path / "n")}
    context = Context(
        run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config={}
    )
    reply = apps.make_client_app()(message=msg, context=context)
    assert reply.has_error()
    assert reply.error.reason.startswith("DataError: unknown dataset ")
    assert str(tmp_path / "missing.csv") in reply.error.reason and "\n" not in reply.error.reason
    # A reason worded by Flower (an exception that is not securefed's, an older node) reads
    # the same at the server.
    flower = "<class 'protocols.errors.DataError'>:<'no such\n file'>"
    assert apps.node_reason(flower) == "DataError: no such file"
    assert apps.node_reason("  ") == "no reason given"


class _GridLike(LocalTransport):
    """A node's error is a dropout recorded in ``errors``, as over Flower's Grid."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.errors: list[tuple[str, int, str]] = []

    def exchange(self, stage, messages, *, timeout):
        replies = {}
        for node, payload in messages.items():
            try:
                replies.update(super().exchange(stage, {node: payload}, timeout=timeout))
            except Exception as exc:
                self.errors.append((stage, node, f"{type(exc).__name__}: {exc}"))
        return replies


@pytest.mark.parametrize(
    ("entries", "want"),
    [
        ({"partition-id": 3}, "partition-id must be in [0, 3), got 3 in the SuperNode's"),
        ({"state-dir": ""}, "the SuperNode needs --node-config 'state-dir="),
    ],
)
def test_a_node_config_mistake_is_named_when_the_node_joins(tmp_path, entries, want):
    """Found in a walkthrough: a partition id past the count waited out the server's connect
    timeout ("not every partition connected"), and a node without a state directory answered
    its hello and then failed every round's train message as a dropout."""
    cfg = _cfg()
    node_config = {"partition-id": 0, "num-partitions": 3, "state-dir": str(tmp_path / "n")}
    with pytest.raises(ConfigError, match=re.escape(want)):
        handle_node_message("hello", _hello(cfg), node_config={**node_config, **entries}, state={})
    transport = _GridLike(3, state_dir=tmp_path / "nodes")
    transport.node_configs[101].update(entries)
    server = FederatedServer(
        cfg,
        run_dir=tmp_path / "run",
        transport=transport,
        settings=ServerSettings(connect_timeout=60.0),
    )
    started = time.monotonic()
    with pytest.raises(ConfigError, match="node 101 failed the hello: ConfigError: "):
        server.run()
    assert time.monotonic() - started < 30  # named at once, not after the connect timeout


# ----------------------------------------------------------------------------- config files


def _flower_cli():
    import typer
    from typer.testing import CliRunner

    from securefed.cli.flower import flower_app

    root = typer.Typer()
    root.add_typer(flower_app, name="flower")
    return root, CliRunner()


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            'model = "fedrap"\n[fedals]\ndim = 8\n[privacy]\nsecagg = true\n',
            "[fedals] in {config} sets fedals's settings, but this run trains fedrap",
        ),
        (
            "[privacy]\nsecagg = true\nsecure = false\n",
            "[privacy] secure = false in {config} asked for DP noise derived from the seed",
        ),
    ],
)
def test_enroll_and_app_refuse_a_config_train_refuses(tmp_path, text, want):
    """``flower enroll --config`` read ``model = "fedrap"`` with a ``[fedals]`` table as a
    FedRAP run's config and enrolled its users (``refuse_other_model_tables`` applies to
    ``securefed train --config`` and ``flower local/simulate --config``); ``flower app``
    wrote an app for a legacy ``secure = false`` the ServerApp would refuse only when run."""
    root, cli = _flower_cli()
    config = tmp_path / "run.toml"
    config.write_text(text)
    state, keys, app = tmp_path / "state", tmp_path / "keys.json", tmp_path / "app"
    for args in (
        ["enroll", "--config", str(config), "--state-dir", str(state)]
        + ["--partition-id", "0", "--num-partitions", "2", "--out", str(keys)],
        ["app", str(app), "--config", str(config), "--out", str(tmp_path / "run")],
    ):
        res = cli.invoke(root, ["flower", *args])
        assert res.exit_code == 2, res.output
        line = " ".join(res.output.split())
        assert line.startswith("error: ") and want.format(config=config) in line, line
        assert "Traceback" not in res.output
    assert not state.exists() and not keys.exists() and not app.exists()


# ----------------------------------------------------------------------------- processes


@pytest.mark.slow
def test_a_worker_whose_supernode_exits_says_so_in_one_line(tmp_path):
    """Found in a walkthrough: a SuperNode refused for a certificate its CA did not sign
    exited at once, and its worker, interrupted by Flower's parent monitor while importing
    torch, logged a ``KeyboardInterrupt`` traceback from inside torch under the SuperNode's
    own reason."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # A stand-in SuperNode: its Runtime API port listens, then it exits while the worker is
    # importing torch and the model code.
    supernode = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, time; s = socket.socket(); "
            f"s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(1.5)",
        ]
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "securefed.flower.worker"]
        + ["--runtime-api-address", f"127.0.0.1:{port}", "--parent-pid", str(supernode.pid)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        supernode.wait(timeout=60)  # reaped: the worker's monitor then sees it gone
        _, stderr = worker.communicate(timeout=120)
    finally:
        for proc in (supernode, worker):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert "Traceback" not in stderr, stderr
    assert "stops: its SuperNode exited" in stderr, stderr


@pytest.mark.slow
def test_by_hand_mistakes_end_in_one_line_across_processes(tmp_path):
    """The by-hand path over real processes (a SuperLink with TLS and node authentication, two
    SuperNodes with their long-lived workers, ``flwr run`` of an app written as
    docs/deployment.md writes it): a config edited after the app was written, then a
    dataset the nodes do not hold, each end in the ServerApp's one line in the run's log
    stream, and no process logs a traceback."""
    from securefed.flower import deploy

    work = tmp_path / "work"
    bad = tmp_path / "bad.toml"
    bad.write_text(runs.dumps_toml(_cfg().to_dict()).replace("epsilon = 8.0", "epsilon = -1.0"))
    missing = tmp_path / "missing.toml"
    missing.write_text(runs.dumps_toml(_cfg(dataset=str(tmp_path / "nowhere.csv")).to_dict()))
    logs = work / "logs"
    with deploy.local_deployment(work, nodes=2) as dep:
        for name, config, want in (
            ("bad", bad, "securefed: epsilon must be > 0, got -1.0"),
            ("missing", missing, "failed the hello: DataError: unknown dataset"),
        ):
            app = deploy.write_app(
                tmp_path / f"app-{name}",
                config_file=config,
                run_dir=tmp_path / f"run-{name}",
                stage_timeout=60,
            )
            deploy.submit(dep, app, timeout=300)
            stream = (logs / "flwr-run.log").read_text()
            assert want in stream, stream
            assert stream.count(want) == 1, stream  # once: not again through the root logger
    text = "".join(f.read_text() for f in sorted(logs.glob("*.log")))
    assert "Traceback" not in text, text
    for p in range(2):
        worker = (logs / f"worker-{p}.log").read_text()
        assert "this node failed the hello message: DataError: unknown dataset" in worker
