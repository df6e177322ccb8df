"""One long-lived ClientApp process per SuperNode (Flower's ``process`` isolation mode).

Flower 1.42 runs a ``ClientApp`` in a fresh ``flwr-clientapp`` process per message (the
SuperNode's default ``--isolation subprocess``: its SuperExec starts one per task), so every
message of a round pays for a Python start, the torch import and rebuilding the node's model.
With ``flower-supernode --isolation process`` the SuperNode only queues tasks on its Runtime
API and leaves running them to an outside process; :func:`serve` is that process, kept alive
for as long as its SuperNode runs:

* it claims the SuperNode's ClientApp tasks one at a time (``AcquireTask``, as Flower's
  SuperExec does) and runs each one with Flower's own per-task functions
  (``pull_task_input``, ``push_message``, ``push_task_output`` of
  ``flwr.supernode.runtime.run_clientapp``; the pull with a shorter backoff), under the
  task's own token and with the task
  heartbeat Flower's ClientApp sends, so a task that fails ends as an error reply, as in a
  ``flwr-clientapp`` process;
* the app comes from the run's FAB (installed and loaded with Flower's functions once per
  FAB), so its modules, torch included, are imported once;
* securefed's ClientApp is told (:func:`securefed.flower.apps.keep_node_state_in_process`) to
  keep the node's model and the round's secrets in this process's memory between messages:
  never on disk, and no longer round-tripped through the SuperNode's ``Context.state``.

It exits when its SuperNode exits (``--parent-pid``). If it dies first, a claimed task fails
after Flower's task heartbeat expires (an error reply, a dropout to the server) and the
node's later messages are never answered (the server's stage timeout makes them dropouts).

    python -m securefed.flower.worker --runtime-api-address 127.0.0.1:9094 --parent-pid PID
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from typing import Any

logger = logging.getLogger(__name__)

#: Longest wait (s) between ``AcquireTask`` calls while the SuperNode has no task (loopback
#: HTTP); after each task the wait starts at 10 ms and doubles up to it.
DEFAULT_POLL = 0.1
FIRST_POLL = 0.01


class Worker:
    """Serves the ClientApp tasks of one SuperNode, one at a time, in this process.

    Args:
        runtime_api_address: The SuperNode's Runtime API (``--host``/``--port`` of
            ``flower-supernode``), plain HTTP on loopback as in Flower's own subprocess mode.
        poll: Longest wait (s) between ``AcquireTask`` calls while there is no task.
    """

    def __init__(self, runtime_api_address: str, *, poll: float = DEFAULT_POLL) -> None:
        from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
        from flwr.supercore.runtime import RuntimeHttpClient

        from securefed.flower import apps

        if not poll > 0:
            raise ValueError(f"poll must be positive, got {poll!r}")
        self.address = runtime_api_address
        self.poll = poll
        self.served = 0
        self._apps: dict[str, Any] = {}  # FAB hash -> loaded ClientApp
        self._client = RuntimeHttpClient.from_server_address(
            server_address=runtime_api_address,
            insecure=True,
            root_certificates=None,
            interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
            retry_invoker=_retry_invoker(),
        )
        apps.keep_node_state_in_process()

    def acquire(self) -> str | None:
        """Claim the oldest pending ClientApp task; its token, or ``None`` when none waits."""
        from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
        from flwr.supercore.constant import TaskType

        res = self._client.AcquireTask(
            AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
        )
        if res.HasField("task") and res.token:
            return str(res.token)
        return None

    def serve(self, *, max_tasks: int | None = None) -> None:
        """Claim and run tasks until stopped (or ``max_tasks`` have run)."""
        wait = FIRST_POLL
        while max_tasks is None or self.served < max_tasks:
            try:
                token = self.acquire()
            except Exception as ex:  # the SuperNode's API failed for longer than a retry
                logger.warning("could not ask the SuperNode for a task (%s); retrying", ex)
                token = None
                wait = self.poll
            if token is None:
                time.sleep(wait)
                wait = min(wait * 2, self.poll)
                continue
            self.run_task(token)
            wait = FIRST_POLL  # the round's next stage usually follows within a second

    def run_task(self, token: str) -> None:
        """Everything ``flwr-clientapp`` does for one task, minus starting a process."""
        from flwr.app import Message
        from flwr.app.error import Error
        from flwr.clientapp.client_app import LoadClientAppError
        from flwr.common.constant import ErrorCode, SubStatus
        from flwr.supercore.heartbeat import HeartbeatSender
        from flwr.supercore.interceptors import (
            RuntimeTokenHttpInterceptor,
            RuntimeVersionHttpInterceptor,
        )
        from flwr.supercore.runtime import RuntimeHttpClient
        from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

        start = time.perf_counter()
        client = RuntimeHttpClient.from_server_address(
            server_address=self.address,
            insecure=True,
            root_certificates=None,
            interceptors=[
                RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                RuntimeTokenHttpInterceptor(token),
            ],
            retry_invoker=_retry_invoker(),
        )
        heartbeat = HeartbeatSender(_task_heartbeat(client))
        message = reply = context = None
        sub_status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
        kind = "?"
        marks = [start]
        interrupted = False
        try:
            heartbeat.start()
            message, context, run, fab = _pull_task_input(client)
            kind = message.metadata.message_type
            app = self._load(run, fab)
            marks.append(time.perf_counter())
            reply = app(message=message, context=context)
            marks.append(time.perf_counter())
            sub_status, details = SubStatus.COMPLETED, ""
        except Exception as ex:  # as flwr-clientapp: the failure becomes an error reply
            code = ErrorCode.CLIENT_APP_RAISED_EXCEPTION
            reason = f"{type(ex)}:<'{ex}'>"
            if isinstance(ex, LoadClientAppError):
                code = ErrorCode.LOAD_CLIENT_APP_EXCEPTION
                reason = "An exception was raised when attempting to load `ClientApp`"
            logger.exception("the ClientApp raised an exception")
            details = reason
            if message is not None:
                reply = Message(Error(code=code, reason=reason), reply_to=message)
        except BaseException:  # stopping (the SuperNode exited): report nothing, just go
            interrupted = True
            raise
        finally:
            if not interrupted:
                try:
                    if reply is not None and context is not None:
                        push_message(client, reply, context)
                except Exception:
                    logger.exception("could not push the reply to the SuperNode")
                push_task_output(
                    client=client, context=context, sub_status=sub_status, details=details
                )
            if heartbeat.is_running:
                heartbeat.stop()
            client.close()
        self.served += 1
        marks.append(time.perf_counter())
        logger.info(
            "securefed worker pid=%d served %s message %d in %.2f s (%s; %s)",
            os.getpid(),
            kind,
            self.served,
            marks[-1] - start,
            "refused: an error reply" if reply is not None and reply.has_error() else sub_status,
            " + ".join(f"{b - a:.2f}" for a, b in zip(marks, marks[1:], strict=False)),
        )

    def _load(self, run: Any, fab: Any) -> Any:
        """The run's ClientApp, installed from its FAB and imported once per FAB."""
        app = self._apps.get(fab.hash_str)
        if app is None:
            from flwr.cli.install import install_from_fab
            from flwr.clientapp.utils import get_load_client_app_fn

            install_from_fab(fab.content, skip_prompt=True)
            load = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
            app = self._apps[fab.hash_str] = load(run.fab_id, run.fab_version, fab.hash_str)
        return app

    def close(self) -> None:
        self._client.close()


#: Backoff (s) while a message's objects are not yet on the SuperNode: first and cap. This
#: process claims a task as soon as the SuperNode creates it, which is before the SuperNode
#: has pulled the message's objects from the SuperLink; Flower's own 1 s first backoff
#: (10 s cap), hidden behind a process start when each message has its own process, would
#: be paid on most messages here. Tries are bounded by Flower's time limit, not counted.
PULL_BACKOFF = (0.01, 0.05)


def _pull_task_input(client: Any) -> tuple[Any, Any, Any, Any]:
    """Flower's ``run_clientapp.pull_task_input`` with :data:`PULL_BACKOFF`."""
    from flwr.app import Message
    from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
    from flwr.proto.node_pb2 import Node  # pylint: disable=E0611
    from flwr.proto.runtime_pb2 import (  # pylint: disable=E0611
        PullAppMessagesRequest,
        PullTaskInputRequest,
    )
    from flwr.supercore.inflatable.inflatable_protobuf_utils import (
        make_confirm_message_received_fn_protobuf,
        make_pull_object_fn_protobuf,
    )
    from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
    from flwr.supercore.task_identity import TaskIdentity

    res = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id = res.task_id
    TaskIdentity.run_id = res.run.run_id
    TaskIdentity.node_id = res.context.node_id
    context = context_from_proto(res.context)
    run = run_from_proto(res.run)
    fab = fab_from_proto(res.fab)
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("No messages received from Runtime API")
    node = Node(node_id=context.node_id)
    tree = pulled.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree,
        make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(
            client.ConfirmMessageReceived, node, context.run_id
        ),
        return_type=Message,
        initial_backoff=PULL_BACKOFF[0],
        backoff_cap=PULL_BACKOFF[1],
        max_tries_per_object=None,  # Flower's time limit (PULL_MAX_TIME) bounds the wait
    )
    message.metadata.__dict__["_message_id"] = tree.object_id  # as Flower sets it
    return message, context, run, fab


#: Seconds a Runtime API call is retried (connection errors, 502-504) before it fails.
RETRY_SECONDS = 60.0


def _retry_invoker() -> Any:
    """Flower's retry policy for Runtime API calls (transport errors and 502/503/504 retried
    with exponential backoff), but bounded to :data:`RETRY_SECONDS`, and a 401 (a refused
    task token) fails that call only: Flower's policy retries forever and answers a 401 by
    sending SIGINT to its own process, right for a ``flwr-clientapp`` that serves one task,
    wrong for this one, which serves them all."""
    import httpx
    from flwr.supercore.retry import RetryInvoker, exponential

    retry_codes = {httpx.codes.BAD_GATEWAY, httpx.codes.SERVICE_UNAVAILABLE}
    retry_codes.add(httpx.codes.GATEWAY_TIMEOUT)

    def give_up(exc: Exception) -> bool:
        if isinstance(exc, httpx.HTTPStatusError):
            return exc.response.status_code not in retry_codes
        return False

    return RetryInvoker(
        wait_gen_factory=lambda: exponential(max_delay=5),
        recoverable_exceptions=(httpx.TransportError, httpx.HTTPStatusError),
        max_tries=None,
        max_time=RETRY_SECONDS,
        should_giveup=give_up,
    )


def _task_heartbeat(client: Any) -> Any:
    """Flower's task heartbeat, except that a refused one does not interrupt this process
    (``flwr-clientapp`` raises SIGINT in itself: it serves one task, this process many)."""
    import httpx
    from flwr.proto.runtime_pb2 import SendTaskHeartbeatRequest  # pylint: disable=E0611

    def beat() -> bool:
        try:
            return bool(client.SendTaskHeartbeat(SendTaskHeartbeatRequest()).success)
        except httpx.HTTPError:
            return False

    return beat


def _wait_listening(address: str, parent_pid: int | None, timeout: float = 120.0) -> None:
    """Wait until the SuperNode's Runtime API accepts connections (it starts first)."""
    import socket

    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex((host.strip("[]"), int(port))) == 0:
                return
        if parent_pid is not None and not _alive(parent_pid):
            raise SystemExit(f"the SuperNode (pid {parent_pid}) exited before its Runtime API")
        time.sleep(0.1)
    raise SystemExit(f"the SuperNode's Runtime API at {address} did not listen in {timeout:g} s")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_with(parent_pid: int) -> None:
    """Raise KeyboardInterrupt in this process's main thread once ``parent_pid`` (its
    SuperNode) is gone: Flower's parent monitor sends SIGINT, which a process started in the
    background by a non-interactive shell inherits as ignored, so SIGINT's handler is put
    back (and unblocked) first (found in a walkthrough: seven workers outlived their killed
    SuperNodes for minutes, holding their nodes' round secrets)."""
    from flwr.supercore.app_utils import start_parent_process_monitor

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # nor blocked by its launcher
    start_parent_process_monitor(parent_pid)


def main(argv: list[str] | None = None) -> None:
    try:
        _main(argv)
    except KeyboardInterrupt:
        # Its SuperNode exited (the parent monitor interrupts this process): at any point,
        # importing torch included (found in a walkthrough: a SuperNode refused by the
        # SuperLink for a certificate its CA did not sign left a KeyboardInterrupt traceback
        # from inside torch's import in the worker's log, under the SuperNode's own reason).
        print(
            f"securefed worker pid={os.getpid()} stops: its SuperNode exited (see its log)",
            file=sys.stderr,
        )


def _main(argv: list[str] | None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--runtime-api-address", required=True, help="The SuperNode's HOST:PORT.")
    ap.add_argument("--parent-pid", type=int, help="Exit when this process (the SuperNode) does.")
    ap.add_argument("--poll", type=float, default=DEFAULT_POLL, help="Idle AcquireTask period.")
    ap.add_argument(
        "--threads",
        type=int,
        help="torch threads (default: torch's, one per core); set it to the cores over the "
        "nodes when several nodes share a machine, or their threads contend",
    )
    args = ap.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        ap.error(f"--threads must be a positive integer, got {args.threads}")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not every poll of the SuperNode
    logging.getLogger("torch").setLevel(logging.WARNING)  # nor torch's statistics at exit
    if args.parent_pid is not None:
        stop_with(args.parent_pid)
    _wait_listening(args.runtime_api_address, args.parent_pid)
    import securefed
    import securefed.flower.apps
    import securefed.flower.node  # noqa: F401  (torch and the model code, once, before any task)

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)

    logger.info(
        "securefed worker pid=%d for the SuperNode at %s (securefed from %s)",
        os.getpid(),
        args.runtime_api_address,
        os.path.dirname(securefed.__file__),
    )
    worker = Worker(args.runtime_api_address, poll=args.poll)
    try:
        worker.serve()
    finally:
        worker.close()


if __name__ == "__main__":
    main()
