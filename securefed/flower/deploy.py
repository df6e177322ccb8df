"""Run securefed on Flower: the simulation engine, and a local deployment on loopback.

* :func:`run_simulation` – Flower's simulation engine (Ray backend; ``pip install ray``):
  ``nodes`` virtual SuperNodes in one machine, each one partition of users.
* :func:`run_local_deployment` – real processes on ``127.0.0.1`` only: one
  ``flower-superlink``, ``nodes`` ``flower-supernode`` processes (one partition each, with its
  own state directory) and ``flwr run`` submitting the app. Every process is stopped when the
  run ends or fails. Across machines, start the same processes by hand (docs/deployment.md).

  Each SuperNode runs in Flower's ``process`` isolation mode with one long-lived ClientApp
  process beside it (:mod:`securefed.flower.worker`: torch, the node's model and the round's
  secrets stay in its memory across messages) and polls the SuperLink from 20 ms after a
  message up to every 0.2 s when idle (:mod:`securefed.flower.supernode`).
  ``isolation="subprocess"`` is Flower's default instead: a fresh ClientApp process per
  message.

  Secure by default: every connection to the SuperLink (SuperNodes, ``flwr``, the ServerApp)
  is TLS, verified against a throwaway CA made for the run, and the SuperLink accepts only
  SuperNodes whose public keys were registered with it (``--enable-supernode-auth``, keys
  registered through ``flwr supernode register``). ``insecure=True`` turns both off: for
  debugging only.

:func:`write_app` writes the Flower app directory both use: a ``pyproject.toml`` that names
securefed's ``ServerApp``/``ClientApp`` and carries the run config; the code itself is the
installed ``securefed`` package on every machine.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import securefed
from protocols.cores import usable_cores
from securefed import runs
from securefed.errors import ConfigError, DataError, ProtocolError
from securefed.flower import require_flwr
from securefed.flower.certs import LocalCertificates, make_local_certificates, make_node_key
from securefed.flower.guard import _start_time, record_process, start_guard, stop_recorded
from securefed.flower.server import FLOWER_FILE, check_config, read_flower_record
from securefed.flower.supernode import DEFAULT_IDLE_POLL, MAX_IDLE_POLL
from securefed.training import (
    LossWatch,
    RoundRecord,
    TrainConfig,
    check_resume,
    load_config_file,
)

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
APP_NAME = "securefed-app"
#: ``process``: one long-lived securefed ClientApp process per SuperNode (the default);
#: ``subprocess``: Flower's SuperExec starts a ``flwr-clientapp`` process per message.
ISOLATION_MODES = ("process", "subprocess")


def write_app(
    app_dir: Path,
    *,
    config_file: Path,
    run_dir: Path,
    stage_timeout: float,
    transcript: bool = False,
    resume: bool = False,
    enrollment: Path | None = None,
    eager_masking: bool = True,
    keys_ahead: bool = True,
) -> Path:
    """Write the Flower app directory (``pyproject.toml`` only) and return it; with
    ``resume`` the app continues the interrupted run in ``run_dir``; ``enrollment`` is the
    enrollment directory file a malicious-mode run's server reads; ``eager_masking`` and
    ``keys_ahead`` are :class:`~securefed.flower.server.ServerSettings`'s."""
    app_dir.mkdir(parents=True, exist_ok=True)
    text = f"""[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{APP_NAME}"
version = "1.0.0"
description = "securefed federated recommendation with securefed's own secure aggregation"
license = "Apache-2.0"
dependencies = []  # securefed[flower] is installed on every machine

[tool.flwr.app]
publisher = "securefed"

[tool.flwr.app.components]
serverapp = "securefed.flower.apps:server_app"
clientapp = "securefed.flower.apps:client_app"

[tool.flwr.app.config]
config-file = {_toml_str(str(config_file.resolve()))}
run-dir = {_toml_str(str(run_dir.resolve()))}
stage-timeout = {float(stage_timeout)!r}
transcript = {"true" if transcript else "false"}
resume = {"true" if resume else "false"}
eager-masking = {"true" if eager_masking else "false"}
keys-ahead = {"true" if keys_ahead else "false"}
"""
    if enrollment is not None:
        text += f"enrollment = {_toml_str(str(enrollment.resolve()))}\n"
    (app_dir / "pyproject.toml").write_text(text)
    return app_dir


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _prepare(config: TrainConfig, run_dir: Path, work_dir: Path, *, resume: bool = False) -> Path:
    """The config file the app reads; for a resume, the run directory's own."""
    check_config(config)
    if resume:
        check_resumable(run_dir)
        work_dir.mkdir(parents=True, exist_ok=True)
        return run_dir / runs.CONFIG_FILE
    if (run_dir / runs.CONFIG_FILE).exists():
        raise ConfigError(f"{run_dir} already holds a run; choose another --out")
    work_dir.mkdir(parents=True, exist_ok=True)
    config_file = work_dir / "securefed.toml"
    runs.atomic_write_text(config_file, runs.dumps_toml(config.to_dict()))
    return config_file


def node_state_dir(work_dir: Path, partition: int) -> Path:
    """Where the local deployment's node ``partition`` keeps its state."""
    return Path(work_dir).resolve() / "nodes" / f"node-{partition}"


def _enroll(config: TrainConfig, state_dirs: list[Path], work: Path) -> Path | None:
    """A malicious-mode run: enroll every node's users (keys kept in its state directory,
    reused by a resume) and write the enrollment directory into the work directory; the
    operator's step across machines (docs/deployment.md, 'Malicious server')."""
    if config.privacy.secagg_mode != "malicious":
        return None
    from securefed.flower.enrollment import DIRECTORY_FILE, enroll_partitions
    from securefed.training import load_split

    n_users = load_split(config).n_users
    return enroll_partitions(n_users, state_dirs, work / DIRECTORY_FILE)


def check_resumable(run_dir: Path) -> tuple[TrainConfig, int]:
    """The recorded config and partition count of a Flower run that can be resumed.

    Raises:
        ConfigError: ``run_dir`` is not an unfinished Flower run (``RunFinished`` when it
            completed its rounds).
    """
    config = check_resume(run_dir)
    if not (run_dir / FLOWER_FILE).exists():
        raise ConfigError(
            f"{run_dir} was not started by `securefed flower` (no {FLOWER_FILE}); resume it "
            "with `securefed train --resume`"
        )
    return config, len(read_flower_record(run_dir)["nodes"])


def run_simulation(
    config: TrainConfig,
    *,
    run_dir: str | Path,
    nodes: int,
    work_dir: str | Path,
    stage_timeout: float = 120.0,
    cpus_per_node: float = 1.0,
    transcript: bool = False,
    resume: bool = False,
    progress: Callable[[RoundRecord], None] | None = None,
) -> dict[str, Any]:
    """Run on Flower's simulation engine with ``nodes`` virtual SuperNodes; returns the summary.

    With ``resume`` the interrupted run in ``run_dir`` continues from its last checkpoint
    (``config`` must be its recorded one, :func:`check_resumable`; the nodes' state is
    under ``work_dir`` as when it started). ``progress`` gets each round's metrics line as
    the server writes it (:class:`MetricsFollower`).

    Raises:
        ConfigError: Flower or Ray is not installed, or the config is not distributable.
    """
    require_flwr()
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(
            "Flower's simulation engine needs Ray: pip install 'flwr[simulation]' (or ray)"
        ) from None
    from flwr.simulation import run_simulation as flwr_run_simulation

    from securefed.flower.apps import make_client_app, make_server_app

    run_dir, work = Path(run_dir), Path(work_dir)
    config_file = _prepare(config, run_dir, work, resume=resume)
    # The ClientApp's state-root layout: node p keeps its state in <state-root>/node-<p>.
    enrolled = _enroll(config, [node_state_dir(work, p) for p in range(nodes)], work)
    server = make_server_app(
        {
            "config-file": str(config_file),
            "run-dir": str(run_dir),
            "stage-timeout": stage_timeout,
            "transcript": transcript,
            "resume": resume,
            **({"enrollment": str(enrolled)} if enrolled is not None else {}),
        }
    )
    # Each node holds the operator's copy of the config: a server that sent other [privacy]
    # settings (a larger epsilon, a lower corruption bound, another mode) is refused.
    client_defaults = {"state-root": str(work / "nodes"), "pin-config": str(config_file)}
    if enrolled is not None:
        client_defaults["enrollment"] = str(enrolled)
    client = make_client_app(client_defaults)
    from threadpoolctl import threadpool_limits

    # Flower starts the ServerApp in a thread while its main thread starts Ray, which forks
    # processes; OpenBLAS's fork handler stops its thread pool, and a numpy call of the
    # ServerApp (the accountant's PRV, numpy dot) that is waiting on that pool then spins
    # forever (seen in CI: exec_blas with no BLAS threads left). One BLAS thread: no pool.
    with (
        quiet_flower_deprecations(),
        threadpool_limits(limits=1, user_api="blas"),
        _following(run_dir, progress, config.rounds),
    ):
        flwr_run_simulation(
            server_app=server,
            client_app=client,
            num_supernodes=nodes,
            backend_config={"client_resources": {"num_cpus": cpus_per_node, "num_gpus": 0.0}},
        )
    return _finished(run_dir)


class _NoDeprecationNotices(logging.Filter):
    """Drops Flower's own deprecation notices (``DEPRECATED FEATURE`` and the ``FEATURE
    UPDATE`` that follows it): they concern Flower APIs securefed calls (its Python
    ``run_simulation`` among them), nothing a user of securefed can act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg).lstrip()
        return not text.startswith(("DEPRECATED FEATURE", "FEATURE UPDATE"))


@contextlib.contextmanager
def quiet_flower_deprecations() -> Iterator[None]:
    """Within: Flower's deprecation notices and Python ``DeprecationWarning`` are not shown
    (in this process, and in the Ray workers started within, through ``PYTHONWARNINGS``),
    nor Ray's tip about a future default for accelerator variables. Flower's log records
    reach only Flower's own console handler (INFO and up): opacus configures the root logger
    when imported, which would print Flower's DEBUG records a second time. Every other
    Flower log line and warning is shown."""
    flwr_logger = logging.getLogger("flwr")
    notices = _NoDeprecationNotices()
    flwr_logger.addFilter(notices)
    propagate = flwr_logger.propagate
    flwr_logger.propagate = False
    previous = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(
        x for x in (previous, "ignore::DeprecationWarning") if x
    )
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings(
                "ignore", message="Tip: In future versions of Ray", category=FutureWarning
            )
            yield
    finally:
        flwr_logger.removeFilter(notices)
        flwr_logger.propagate = propagate
        if previous is None:
            os.environ.pop("PYTHONWARNINGS", None)
        else:
            os.environ["PYTHONWARNINGS"] = previous


class MetricsFollower:
    """Follows the metrics lines a Flower server appends to ``run_dir/metrics.jsonl`` while
    the run goes on in another process or thread (the ServerApp): ``progress`` gets a
    :class:`~securefed.training.RoundRecord` for each new line, from a background thread
    polling every ``poll`` seconds and once more when the follower stops. The lines the file
    holds when it starts (a resumed run's kept rounds) are not shown again; a line still
    being written (no newline yet) waits for the next poll; ``rounds_planned`` is the run's
    ``config.toml``'s (the server's resolved config) once it exists, else ``rounds``.
    """

    def __init__(
        self,
        run_dir: str | Path,
        progress: Callable[[RoundRecord], None],
        *,
        rounds: int | None = None,
        poll: float = 0.5,
    ) -> None:
        self.path = Path(run_dir) / runs.METRICS_FILE
        self.config_path = Path(run_dir) / runs.CONFIG_FILE
        self.progress = progress
        self.rounds = rounds
        self.poll = poll
        kept = self._lines()
        self._seen = set(kept)
        self._watch = LossWatch(self._parsed(line) or {} for line in kept)
        self._planned: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="securefed-metrics", daemon=True)

    def _lines(self) -> list[str]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError:
            return []
        return [line for line in text.split("\n")[:-1] if line.strip()]

    @staticmethod
    def _parsed(line: str) -> dict[str, Any] | None:
        """A metrics line's values (an aborted round's null loss as NaN); None for a line
        that is not one."""
        try:
            values = json.loads(line)
        except ValueError:
            return None
        if not (isinstance(values, dict) and "round" in values):
            return None
        return runs.nan_for_null(values)

    def _rounds_planned(self) -> int | None:
        if self._planned is None and self.config_path.exists():
            try:
                self._planned = int(load_config_file(self.config_path)["rounds"])
            except (OSError, ValueError, KeyError, TypeError):
                return self.rounds
        return self._planned if self._planned is not None else self.rounds

    def check(self) -> None:
        """Hand every line not seen before to ``progress``, in file order."""
        for line in self._lines():
            if line in self._seen:
                continue
            self._seen.add(line)
            values = self._parsed(line)
            if values is None:
                continue
            try:
                loss = values.get("loss", math.nan)
                warning = self._watch.see(int(values["round"]), loss, trained=math.isfinite(loss))
                self.progress(
                    RoundRecord(values, rounds_planned=self._rounds_planned(), warning=warning)
                )
            except Exception:  # a display must never stop the run it shows, nor the next line
                logger.exception("showing round %s of %s failed", values["round"], self.path)

    def _follow(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self.check()
            except Exception:
                logger.exception("following %s failed", self.path)

    def __enter__(self) -> MetricsFollower:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(Exception):
            self.check()


def _following(
    run_dir: Path, progress: Callable[[RoundRecord], None] | None, rounds: int
) -> contextlib.AbstractContextManager[Any]:
    if progress is None:
        return contextlib.nullcontext()
    return MetricsFollower(run_dir, progress, rounds=rounds)


def _finished(run_dir: Path) -> dict[str, Any]:
    """The finished run's summary with its yardsticks: the server holds no data, so the
    operator's command (which gave the nodes their dataset) adds random, MostPop and
    DP-MostPop from its own copy (:func:`securefed.training.add_yardsticks`)."""
    from securefed.training import add_yardsticks

    summary = run_dir / runs.SUMMARY_FILE
    if not summary.exists():
        raise ProtocolError(
            f"the Flower run ended without writing {summary}; see the logs in the work directory"
        )
    try:
        return add_yardsticks(run_dir)
    except (ConfigError, DataError, OSError) as exc:  # the run itself finished: keep it
        logger.warning("yardsticks not added to %s: %s", run_dir, exc)
        return json.loads(summary.read_text())


# ----------------------------------------------------------------------------- deployment


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


@dataclass
class LocalDeployment:
    """The processes of a local deployment (all bound to 127.0.0.1)."""

    work_dir: Path
    port: int  # the SuperLink's one HTTP port (Fleet, Control and Runtime APIs)
    superlink: subprocess.Popen | None = None
    supernodes: list[subprocess.Popen] = field(default_factory=list)
    # The long-lived ClientApp process of each SuperNode (``None`` in subprocess isolation).
    workers: list[subprocess.Popen | None] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    tls: bool = True  # every connection to the SuperLink is TLS (the run's own CA)
    authenticated: bool = True  # the SuperLink accepts registered SuperNode keys only
    # Stops the processes below if this process dies without stopping them (guard.py), and
    # the file it reads them from.
    guard: subprocess.Popen | None = None
    guard_record: Path | None = None

    def track(self, proc: subprocess.Popen) -> subprocess.Popen:
        """Record ``proc`` (a process group leader) for the guard; returns it."""
        if self.guard_record is not None:
            record_process(self.guard_record, proc.pid)
        return proc

    def node_state_dir(self, partition: int) -> Path:
        return node_state_dir(self.work_dir, partition)

    def kill_node(self, partition: int) -> None:
        """SIGKILL one SuperNode, its ClientApp process and everything they started (a
        crashed device)."""
        _kill(self.supernodes[partition], signal.SIGKILL)
        worker = self.workers[partition] if partition < len(self.workers) else None
        if worker is not None:
            _kill(worker, signal.SIGKILL)

    def stop(self) -> None:
        procs = [p for p in (*self.workers, *self.supernodes, self.superlink) if p is not None]
        # Our children: a pid is not reused before we reap it (a zombie's start time is None,
        # and its group is still ours while it has members).
        stop_recorded({p.pid: _start_time(p.pid) or "" for p in procs}, grace=10.0)
        for proc in procs:  # reap them
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        if self.guard_record is not None:  # its record gone, the guard exits within a period
            self.guard_record.unlink(missing_ok=True)
        if self.guard is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.guard.wait(timeout=5)
            if self.guard.poll() is None:
                self.guard.kill()
                self.guard.wait(timeout=5)


def _kill(proc: subprocess.Popen, sig: int) -> None:
    """Signal the process group started for ``proc`` (it runs in its own session; its
    children may outlive the leader)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _spawn(cmd: Sequence[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    fh = log.open("ab")
    return subprocess.Popen(
        list(cmd), stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def _bin(name: str) -> str:
    """A Flower console script next to this interpreter (or on PATH)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


@contextlib.contextmanager
def local_deployment(
    work_dir: str | Path,
    *,
    nodes: int,
    node_extra: dict[int, dict[str, str]] | None = None,
    insecure: bool = False,
    unregistered: Collection[int] = (),
    isolation: str = "process",
    idle_poll: float | None = DEFAULT_IDLE_POLL,
) -> Iterator[LocalDeployment]:
    """Start a SuperLink and ``nodes`` SuperNodes on 127.0.0.1; stop them all on exit.

    By default the SuperLink serves TLS with a certificate from a CA made for this deployment
    (``WORK/tls``; its private key is never written) and authenticates SuperNodes: each node
    gets its own P-384 key pair (``WORK/keys``, private keys 0600), its public key is
    registered with ``flwr supernode register`` before the node starts, and the SuperLink
    refuses any node whose key it does not know.

    Args:
        work_dir: Logs, Flower's home (``FLWR_HOME``), TLS files, node keys and the nodes'
            state directories.
        nodes: SuperNodes, one partition each.
        node_extra: Extra ``--node-config`` entries per partition (e.g. the stall hook).
        insecure: Debugging only: no TLS and no node authentication (``--insecure``).
        unregistered: Partitions whose SuperNode gets a key that is never registered (an
            outsider the SuperLink must refuse; for tests).
        isolation: ``"process"`` (default): beside each SuperNode one long-lived ClientApp
            process (:mod:`securefed.flower.worker`, log ``WORK/logs/worker-<p>.log``)
            serves every message; ``"subprocess"``: Flower starts a ClientApp process per
            message.
        idle_poll: Longest wait (s) of a SuperNode between polls of the SuperLink, reached
            when idle; after each message it starts at 20 ms
            (:mod:`securefed.flower.supernode`). ``None``: Flower's own fixed 3 s.

    Raises:
        ConfigError: ``nodes`` is not positive, ``isolation`` is not one of
            :data:`ISOLATION_MODES`, or ``unregistered`` names a partition that does not
            exist or is given with ``insecure``.
        ProtocolError: The SuperLink did not start or refused a node key registration.
    """
    require_flwr()
    if nodes < 1:
        raise ConfigError(f"nodes must be a positive integer, got {nodes!r}")
    _check_scheduling(isolation, idle_poll)
    outsiders = set(unregistered)
    if not outsiders <= set(range(nodes)):
        raise ConfigError(
            f"unregistered partitions must be in [0, {nodes}), got {sorted(outsiders)!r}"
        )
    if insecure and outsiders:
        raise ConfigError("unregistered nodes need node authentication; drop insecure=True")
    work = Path(work_dir).resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["FLWR_HOME"] = str(work / "flwr-home")
    # Their logs are for the operator: no DeprecationWarning about the libraries' own calls.
    env["PYTHONWARNINGS"] = ",".join(
        x for x in (env.get("PYTHONWARNINGS"), "ignore::DeprecationWarning") if x
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    # The node processes import the same securefed as this process (an editable install may
    # point elsewhere).
    env["PYTHONPATH"] = os.pathsep.join(
        x for x in (str(Path(securefed.__file__).resolve().parents[1]), env.get("PYTHONPATH")) if x
    )
    dep = LocalDeployment(work, free_port(), env=env, tls=not insecure, authenticated=not insecure)
    certs = None if insecure else make_local_certificates(work / "tls")
    try:
        guard = start_guard(work, env)
        if guard is not None:
            dep.guard, dep.guard_record = guard
        if certs is None:
            security = ["--insecure"]
        else:
            security = [
                "--ssl-ca-certfile",
                str(certs.ca_cert),
                "--ssl-certfile",
                str(certs.server_cert),
                "--ssl-keyfile",
                str(certs.server_key),
                "--enable-supernode-auth",
            ]
        dep.superlink = dep.track(
            _spawn(
                [
                    _bin("flower-superlink"),
                    *security,
                    "--disable-runtime-dependency-installation",
                    "--host",
                    LOOPBACK,
                    "--port",
                    str(dep.port),
                ],
                work / "logs" / "superlink.log",
                env,
            )
        )
        _wait_port(dep.port, dep.superlink, "SuperLink")
        _write_connection(work / "flwr-home", dep.port, certs)
        node_security: list[list[str]] = [["--insecure"] for _ in range(nodes)]
        if certs is not None:
            keys = [make_node_key(work / "keys", f"node-{p}") for p in range(nodes)]
            _register(dep, [k.public_key for p, k in enumerate(keys) if p not in outsiders])
            node_security = [
                [
                    "--root-certificates",
                    str(certs.ca_cert),
                    "--auth-supernode-private-key",
                    str(k.private_key),
                ]
                for k in keys
            ]
        # The nodes share this machine's cores: torch's default (a thread per core in each
        # node) makes their threads contend (a FedRAP ML-100K train stage 9.0 -> 5.9 s).
        threads = max(1, usable_cores() // nodes)
        for p in range(nodes):
            state = dep.node_state_dir(p)
            state.mkdir(parents=True, exist_ok=True)
            entries = {"partition-id": str(p), "num-partitions": str(nodes)}
            entries["state-dir"] = _toml_str(str(state))
            entries.update((node_extra or {}).get(p, {}))
            node_config = " ".join(f"{k}={v}" for k, v in entries.items())
            runtime_port = free_port()
            if idle_poll is None:
                launcher = [_bin("flower-supernode")]
            else:
                launcher = [sys.executable, "-m", "securefed.flower.supernode"]
                launcher += ["--idle-poll", repr(float(idle_poll))]
            node = _spawn(
                [
                    *launcher,
                    *node_security[p],
                    "--superlink",
                    f"{LOOPBACK}:{dep.port}",
                    "--isolation",
                    isolation,
                    "--host",
                    LOOPBACK,
                    "--port",
                    str(runtime_port),
                    "--node-config",
                    node_config,
                ],
                work / "logs" / f"supernode-{p}.log",
                env,
            )
            dep.supernodes.append(dep.track(node))
            worker = None
            if isolation == "process":
                worker = _spawn(
                    [
                        sys.executable,
                        "-m",
                        "securefed.flower.worker",
                        "--runtime-api-address",
                        f"{LOOPBACK}:{runtime_port}",
                        "--parent-pid",
                        str(node.pid),
                        "--threads",
                        str(threads),
                    ],
                    work / "logs" / f"worker-{p}.log",
                    env,
                )
            dep.workers.append(worker if worker is None else dep.track(worker))
        yield dep
    finally:
        dep.stop()


def _check_scheduling(isolation: str, idle_poll: float | None) -> None:
    if isolation not in ISOLATION_MODES:
        raise ConfigError(
            f"isolation must be one of {', '.join(ISOLATION_MODES)}, got {isolation!r}"
        )
    if idle_poll is not None and not 0 < idle_poll <= MAX_IDLE_POLL:
        raise ConfigError(f"idle_poll must be in (0, {MAX_IDLE_POLL}] seconds, got {idle_poll!r}")


def _register(dep: LocalDeployment, public_keys: Sequence[Path], timeout: float = 120.0) -> None:
    """``flwr supernode register KEY local-deployment`` for every key (concurrently)."""
    log = dep.work_dir / "logs" / "register.log"
    procs = [
        _spawn([_bin("flwr"), "supernode", "register", str(key), "local-deployment"], log, dep.env)
        for key in public_keys
    ]
    try:
        for key, proc in zip(public_keys, procs, strict=True):
            if proc.wait(timeout=timeout) != 0:
                raise ProtocolError(
                    f"the SuperLink did not register the node key {key.name} "
                    f"(exit code {proc.returncode}); see {log}"
                )
    finally:
        for proc in procs:
            if proc.poll() is None:
                _kill(proc, signal.SIGKILL)
                proc.wait(timeout=5)


def _write_connection(home: Path, port: int, certs: LocalCertificates | None) -> None:
    """Flower's connection config (``FLWR_HOME/config.toml``) for ``flwr run/supernode``."""
    home.mkdir(parents=True, exist_ok=True)
    security = (
        "insecure = true\n"
        if certs is None
        else f"root-certificates = {_toml_str(str(certs.ca_cert))}\n"
    )
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "local-deployment"\n\n'
        f'[superlink.local-deployment]\naddress = "{LOOPBACK}:{port}"\n{security}'
    )


def _wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ProtocolError(f"{what} exited with code {proc.returncode}; see its log")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex((LOOPBACK, port)) == 0:
                return
        time.sleep(0.2)
    raise ProtocolError(f"{what} did not listen on {LOOPBACK}:{port} within {timeout:g} s")


def submit(dep: LocalDeployment, app_dir: Path, *, timeout: float) -> subprocess.CompletedProcess:
    """``flwr run APP local-deployment --stream``: submit the app and follow it to the end."""
    with (dep.work_dir / "logs" / "flwr-run.log").open("ab") as fh:
        return subprocess.run(
            [_bin("flwr"), "run", str(app_dir), "local-deployment", "--stream"],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=dep.env,
            timeout=timeout,
            check=False,
        )


def run_local_deployment(
    config: TrainConfig,
    *,
    run_dir: str | Path,
    nodes: int,
    work_dir: str | Path,
    stage_timeout: float = 120.0,
    timeout: float = 3600.0,
    transcript: bool = False,
    insecure: bool = False,
    isolation: str = "process",
    idle_poll: float | None = DEFAULT_IDLE_POLL,
    resume: bool = False,
    eager_masking: bool = True,
    keys_ahead: bool = True,
    progress: Callable[[RoundRecord], None] | None = None,
) -> dict[str, Any]:
    """A whole run on a local deployment (see the module docstring); returns the summary.
    ``progress`` gets each round's metrics line as the server writes it
    (:class:`MetricsFollower`).

    ``insecure=True`` is for debugging only: no TLS and no SuperNode authentication.
    ``isolation`` and ``idle_poll`` are those of :func:`local_deployment`;
    ``eager_masking`` and ``keys_ahead`` those of
    :class:`~securefed.flower.server.ServerSettings`. With ``resume``
    the interrupted run in ``run_dir`` continues from its last checkpoint on a fresh
    SuperLink and SuperNodes, which find their users' state in ``work_dir`` (``config``
    and ``nodes`` as recorded: :func:`check_resumable`).
    """
    _check_scheduling(isolation, idle_poll)
    run_dir, work = Path(run_dir).resolve(), Path(work_dir).resolve()
    config_file = _prepare(config, run_dir, work, resume=resume)
    enrolled = _enroll(config, [node_state_dir(work, p) for p in range(nodes)], work)
    app = write_app(
        work / "app",
        config_file=config_file,
        run_dir=run_dir,
        stage_timeout=stage_timeout,
        transcript=transcript,
        resume=resume,
        enrollment=enrolled,
        eager_masking=eager_masking,
        keys_ahead=keys_ahead,
    )
    # Every node holds the operator's copy of the config (check_pinned): a server that sent
    # other [privacy] settings would be refused.
    extra: dict[int, dict[str, str]] = {
        p: {"pin-config": _toml_str(str(config_file))} for p in range(nodes)
    }
    if enrolled is not None:
        for p in range(nodes):
            extra[p]["enrollment"] = _toml_str(str(enrolled))
    with local_deployment(
        work,
        nodes=nodes,
        node_extra=extra,
        insecure=insecure,
        isolation=isolation,
        idle_poll=idle_poll,
    ) as dep:
        with _following(run_dir, progress, config.rounds):
            submit(dep, app, timeout=timeout)  # --stream follows the run to its end
        return _finished(run_dir)


__all__ = [
    "LocalDeployment",
    "MetricsFollower",
    "check_resumable",
    "local_deployment",
    "quiet_flower_deprecations",
    "run_local_deployment",
    "run_simulation",
    "submit",
    "write_app",
]
