"""One background transfer engine: queued all-reduces run in issue order on a thread.

Strategies that overlap communication with compute (``async``, ``bucketed``
with ``--progress thread``) hand each buffer to the engine (``submit``) and
later ``wait`` for its handle. Why a thread rather than non-blocking
collectives: Open MPI advances ``Iallreduce`` only inside MPI calls
(docs/strategies.md, "Overlap") and its non-blocking algorithms (libnbc) were measured 2-3x
slower across nodes than the blocking tuned all-reduce; async S=1 on 2
emulated nodes x 4 ranks at 1 Gbit/s took 2.38 s per step on ``Iallreduce``
against 1.13 s for flat. Horovod runs its collectives on a background thread
for the same reason.

1. ``TransferEngine(comm)`` duplicates ``comm`` (``Communicator.dup``, a
   collective: every rank opens its engines in the same order) and starts one
   thread. Its collectives then never interleave with the main thread's
   (runner barriers, gathers, validation): MPI matches collectives per
   communicator by issue order, which two threads would make differ between
   ranks. mpi4py initialises MPI with ``MPI_THREAD_MULTIPLE``.
2. ``submit(tensor)`` queues a sum of ``tensor`` over all ranks, in place.
   Transfers run one at a time in the order submitted, which is the same on
   every rank because every rank submits in the same order.
3. The path (``TRANSFER_PATHS``) decides what runs a transfer:

   * ``thread``: the backend's blocking tuned all-reduce on the engine's
     communicator, at link speed. Open MPI busy-polls inside blocking
     calls, so while a transfer runs the thread keeps a core busy that the
     compute of a CPU workload may need. Under Horovod, which runs every op
     on a background thread of its own (``Communicator.progresses_itself``),
     ``submit`` hands the tensor to Horovod at once (``iallreduce``), so
     Horovod negotiates and fuses queued transfers as it does its own
     gradients, and the engine's thread only waits for them in order;
     Horovod does not say when an op began, so ``start`` is the later of
     ``queued`` and the previous transfer's ``end``.
   * ``ring``: the project's pipelined ring (``commbench.comm.ring``:
     reduce-scatter + all-gather on non-blocking point-to-point messages),
     each message tested between sleeps that double up to ``poll_s``: light on the CPU, at
     the price of up to ``poll_s`` of latency per segment. Needs
     point-to-point messages (``comm.supports_p2p``; not Horovod on Gloo).
   * ``hier``: the two-level all-reduce (``commbench.comm.hierarchical``):
     reduce-scatter in the node, the shards across nodes on the ring, all-gather
     in the node. Each node link carries ``2(n-1)/n`` of the tensor for ``n``
     nodes where a flat ring's busiest link carries ``2(p-1)/p`` for ``p``
     ranks: on 2 nodes x 4 ranks, 1 against 1.75. Unpipelined (``HIER_SEGMENT``:
     the engine runs one transfer at a time; the node's phases are the
     backend's blocking collectives, not libnbc's non-blocking ones), the
     ring's messages waited for as on the ``ring`` path. Only
     where the engine's thread is the library's one caller
     (not ``comm.progresses_itself``: its groups are made on that thread).
4. Every transfer is stamped on this rank's clock (``commbench.timing.now``):
   ``queued`` when submitted, ``start`` when the engine began it (later than
   ``queued`` while earlier transfers still run), ``end`` when it finished.
   Durations only; clocks of two ranks are never compared.
   For tensors on a GPU (an engine opened with ``events``, the device clock of
   ``commbench.timing``) the host's stamps say when work was queued, not when it
   ran, so the transfer is also stamped with events: ``ready`` on the submitting
   (compute) stream as it is submitted (complete once the kernels that produce the
   tensor have run: the gradient-ready stamp), ``start_mark`` and ``end_mark`` on
   the engine's own stream, which waits for ``ready`` before ``start_mark``, and
   for the collective before ``end_mark`` (the wait for a library's work is made
   there, not on the compute stream: ``Handle.wait_on_device``, so ``end_mark``
   completes when the library's work does, not when the host sees it). Events are
   read when the step ends (``Transfer.seconds``, ``StepTimer.device_comm``).
5. ``submit(tensor, after)`` runs ``after`` on the engine's thread once the
   sum is in (bucketed unpacks its bucket there), so the owner's thread
   need not poll to use a finished transfer. ``submit(tensor, run=op)`` runs
   ``op(tensor)`` there instead of the all-reduce, in the same order and with
   the same stamps: the ZeRO strategies' reduce-scatters and all-gathers on
   the engine communicator's world group (``Communicator.world_group``).
6. ``Transfer.test``/``wait`` re-raise a transfer's error on the caller's
   thread. ``close`` runs what is queued, stops the thread and frees the
   communicator; whoever opens an engine closes it (it is also a context
   manager).

Example::

    with TransferEngine(comm, path="thread") as engine:
        t = engine.submit(buffer)
        ...  # compute
        t.wait()
        print(t.end - t.start)
"""

from __future__ import annotations

import queue
import threading
from functools import partial
from types import TracebackType
from typing import Any, Callable

import torch

from commbench.comm.base import Communicator, Handle, lacks_p2p
from commbench.comm.hierarchical import hierarchical_allreduce
from commbench.comm.ring import POLL_S, poll, ring_allreduce
from commbench.timing import DeviceEvents, mark_seconds, now

#: how the engine runs a transfer; ``thread`` is the default (at link speed, blocking)
TRANSFER_PATHS = ("thread", "ring", "hier")
#: what each path runs, as records say it (``knobs.collective``)
PATH_COLLECTIVE = {"thread": "blocking allreduce on the engine thread",
                   "ring": "ring on the engine thread, polled",
                   "hier": "two-level all-reduce on the engine thread"}
#: the ``hier`` path's segment: above any transfer, so it never pipelines (one transfer at a
#: time on the engine's thread, its node's phases Open MPI's blocking collectives)
HIER_SEGMENT = 1 << 62
#: ``--transfer auto`` (the default): each strategy's measured path where the backend has it
AUTO_PATH = "auto"
TRANSFER_CHOICES = (AUTO_PATH, *TRANSFER_PATHS)
DEFAULT_TRANSFER_PATH = AUTO_PATH


def resolve_path(comm: Communicator, path: str, preferred: str) -> str:
    """The path ``path`` names: itself, or for ``auto`` the strategy's ``preferred`` one
    where ``comm`` can run it (the ring needs point-to-point messages), else ``thread``."""
    if path != AUTO_PATH:
        return path
    return preferred if preferred != "ring" or comm.supports_p2p else "thread"


def check_transfer_path(comm: Communicator, path: str) -> None:
    """Raise ValueError, naming the cause, if transfer ``path`` cannot run on ``comm``."""
    if path == AUTO_PATH:
        return
    if path not in TRANSFER_PATHS:
        raise ValueError(f"unknown transfer path {path!r}; choose from "
                         f"{', '.join(TRANSFER_CHOICES)}")
    if path == "ring" and not comm.supports_p2p:
        raise ValueError(lacks_p2p(comm, "--transfer ring", "--transfer thread"))
    if path == "hier" and comm.progresses_itself:
        raise ValueError(f"--transfer hier: the {comm.name} backend runs its operations on "
                         "a thread of its own, and the two-level all-reduce's node groups "
                         "would be made and used from the engine's thread beside it; use "
                         "--transfer thread or ring, or the mpi backend")


def engine_paths(comm: Communicator) -> list[str]:
    """The paths an engine can run on ``comm`` that run differently there: ``hier`` only
    across several nodes with more than one rank on some node (else it is the ring)."""
    out = []
    for path in TRANSFER_PATHS:
        try:
            check_transfer_path(comm, path)
        except ValueError:
            continue
        if path == "hier" and (comm.topo.nodes < 2 or max(comm.topo.local_sizes) < 2):
            continue
        out.append(path)
    return out


class Transfer(Handle):
    """One queued all-reduce: its stamps, and ``test``/``wait`` as for a collective's handle.

    ``start`` and ``end`` are None until the engine has begun and finished it.
    """

    __slots__ = ("tensor", "after", "queued", "start", "end", "error", "_done", "handle", "run",
                 "ready", "start_mark", "end_mark")

    def __init__(self, tensor: torch.Tensor, after: Callable[[], None] | None = None,
                 ready: Any = None) -> None:
        self.tensor = tensor
        self.after = after
        self.handle: Handle | None = None  # the library's own, where it runs the op itself
        #: another path than the engine's, or the owner's own collective (``submit``'s ``run``)
        self.run: Callable[[torch.Tensor], None] | None = None
        self.queued = now()
        self.start: float | None = None
        self.end: float | None = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        #: on a device: an event on the submitting stream (the tensor is ready once it has
        #: completed); the engine's events as it began and finished (None on the host)
        self.ready = ready
        self.start_mark: Any = None
        self.end_mark: Any = None

    @property
    def on_device(self) -> bool:
        """Whether the transfer is stamped with device events (``start_mark``, ``end_mark``)."""
        return self.ready is not None

    def seconds(self) -> float:
        """The finished transfer's duration on the clock that stamped it: the device's
        between its events, else the host's."""
        if self.on_device:
            return mark_seconds(self.start_mark, self.end_mark)
        return self.end - self.start

    def test(self) -> bool:
        """True once finished; re-raises the transfer's error if it failed."""
        if not self._done.is_set():
            return False
        if self.error is not None:
            raise self.error
        return True

    def wait(self) -> None:
        """Block until finished; re-raises the transfer's error if it failed."""
        self._done.wait()
        self.test()


class TransferEngine:
    """Runs queued in-place all-reduces in issue order on one thread and communicator."""

    def __init__(self, comm: Communicator, path: str = "thread",
                 poll_s: float = POLL_S, events: DeviceEvents | None = None) -> None:
        """``events``: the device clock of the tensors it will reduce, where they are on a
        GPU (transfers then carry device events, point 4 above); None in host memory."""
        if path not in TRANSFER_PATHS:  # auto is the strategy's to resolve
            raise ValueError(f"unknown transfer path {path!r} for the engine; one of "
                             f"{', '.join(TRANSFER_PATHS)}")
        check_transfer_path(comm, path)
        if not poll_s > 0:
            raise ValueError(f"poll_s must be > 0, got {poll_s}")
        self.path = path
        self.poll_s = poll_s
        self._wait = partial(poll, poll_s=poll_s)  # the ring's messages, on ring and hier
        self.comm = comm.dup()  # a collective: every rank opens its engines alike
        self._runs: dict[str, Callable[[torch.Tensor], None]] = {
            "thread": self.comm.allreduce, "ring": self._ring, "hier": self._hier}
        #: hand transfers to the library's own background thread as they are submitted
        self._handoff = path == "thread" and self.comm.progresses_itself
        self._queue: queue.SimpleQueue[Transfer | None] = queue.SimpleQueue()
        self._closed = False
        self.events = events
        #: the engine's own stream: its events, and its waits for the library's work
        self._stream = events.new_stream() if events is not None else None
        # A daemon: a main thread that dies without closing must not hang in exit.
        self._thread = threading.Thread(target=self._loop, name=f"commbench-transfer-{path}",
                                        daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        """The engine's thread (tests check that ``close`` ends it)."""
        return self._thread

    def submit(self, tensor: torch.Tensor, after: Callable[[], None] | None = None,
               path: str | None = None,
               run: Callable[[torch.Tensor], None] | None = None) -> Transfer:
        """Queue an in-place sum of ``tensor`` over all ranks; do not touch it until done.

        ``after`` runs on the engine's thread once the sum is in (after ``end`` is
        stamped, before the transfer counts as done): e.g. unpacking a bucket into its
        gradients while the main thread computes, as DDP's comm-hook futures do.
        ``path`` runs this one transfer on another of ``TRANSFER_PATHS`` (same thread,
        communicator and order): bucketed's ``by-size`` sends each bucket on the path
        its probe priced cheapest for its size.
        ``run`` runs this one transfer as ``run(tensor)`` in place of an all-reduce (same
        thread, order and stamps; on this thread also where the library runs the
        engine's all-reduces itself): a collective of the engine communicator's, such as
        a reduce-scatter on ``self.comm.world_group()`` (the ZeRO strategies).
        """
        if self._closed:
            raise RuntimeError("transfer engine: submit after close")
        if run is not None and path is not None:
            raise ValueError("transfer engine: a transfer takes a path or a run, not both")
        t = Transfer(tensor, after, self.events.mark() if self.events is not None else None)
        if run is not None:
            t.run = run
        elif path is not None and path != self.path:
            if self._handoff:
                raise ValueError(f"transfer engine: the library runs this engine's "
                                 f"transfers itself; no {path} path beside it")
            check_transfer_path(self.comm, path)
            t.run = self._runs[path]
        if self._handoff and t.run is None:
            t.handle = self.comm.iallreduce(tensor)
        self._queue.put(t)
        return t

    def _ring(self, tensor: torch.Tensor) -> None:
        ring_allreduce(self.comm, tensor, wait=self._wait)

    def _hier(self, tensor: torch.Tensor) -> None:
        hierarchical_allreduce(self.comm, tensor, segment_bytes=HIER_SEGMENT,
                               ring_wait=self._wait)

    def _execute(self, t: Transfer) -> None:
        """Run ``t``'s all-reduce on this thread: its own run, else the engine's path."""
        (t.run or self._runs[self.path])(t.tensor)

    def _run_on_device(self, t: Transfer) -> None:
        """Run (or wait for) ``t`` with the engine's stream current, so that the library's
        wait orders the engine's stream after its work, not the compute stream; stamp it
        with events there: begun once its tensor is ready (and the transfer before it has
        ended, the stream's order), ended behind the library's work on that stream; then
        the host waits for it."""
        with self.events.using(self._stream):
            self._stream.wait_event(t.ready)
            t.start_mark = self.events.mark(self._stream)
            if t.handle is None:
                self._execute(t)
            else:
                t.handle.wait_on_device()
            t.end_mark = self.events.mark(self._stream)
            if t.handle is not None:
                t.handle.wait()

    def _loop(self) -> None:
        last_end = 0.0
        while True:
            t = self._queue.get()
            if t is None:
                return
            t.start = now() if t.handle is None else max(t.queued, last_end)
            try:
                if t.ready is not None:
                    self._run_on_device(t)
                elif t.handle is None:
                    self._execute(t)
                else:
                    t.handle.wait()
                t.end = last_end = now()
                if t.after is not None:
                    t.after()
            except BaseException as e:  # noqa: BLE001 - re-raised by the owner's wait
                t.error = e
            if t.end is None:
                t.end = now()
            t._done.set()

    def close(self) -> None:
        """Finish what is queued, stop the thread, free the communicator (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join()
        self.comm.close()

    def __enter__(self) -> TransferEngine:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
