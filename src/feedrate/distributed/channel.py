"""``Channel``: feedrate's own collectives between the ranks of a job, on a gloo group of its
own with a bounded timeout, beside whatever group (NCCL or gloo) the training uses.

Every message is a plain-data object (a dict of JSON-like values). A rank whose own work fails
does not vanish from the collective: it sends a failure document instead of its answer, so the
others learn which rank failed and why; a rank that stops answering (killed, interrupted, not
calling at all) makes the others' call fail within the timeout with an error naming what was
awaited. No call waits forever.
"""

from __future__ import annotations

import contextlib
import ctypes
import pickle
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from feedrate.distributed import forks
from feedrate.distributed.group import Ranks, node_key, ranks_of
from feedrate.errors import FeedrateError
from feedrate.machine.facts import cpu_ids

#: The key a failure document carries in place of an answer.
FAILED = "feedrate_rank_failed"


class RankError(FeedrateError):
    """Another rank of the job failed, or stopped answering within the timeout. The message
    names the rank where it is known."""

    exit_code = 3


def failure(rank: int, exc: BaseException) -> dict[str, Any]:
    """The document a rank sends when its part failed: who, and the error in one line."""
    return {FAILED: described(exc), "rank": rank}


def described(exc: BaseException) -> str:
    """``Type: message``, or the type alone where the message is empty (Ctrl-C's)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def failed(document: Any) -> str | None:
    """The failure a document reports (``rank N failed: ...``), or None for an answer."""
    if isinstance(document, dict) and FAILED in document:
        return f"rank {document.get('rank')} failed: {document[FAILED]}"
    return None


#: How long the first contact waits for every rank to call (s): a rank that does not call
#: feedrate at the same point fails the others this soon, not after the job's own timeout.
JOIN_S = 120.0


class Channel:
    """Bounded collectives over a gloo group made for feedrate (see ``open``)."""

    def __init__(self, ranks: Ranks, group: Any, timeout_s: float, what: str) -> None:
        self.ranks, self._group, self.timeout_s, self.what = ranks, group, timeout_s, what

    @classmethod
    def open(cls, what: str, timeout_s: float, join_s: float = JOIN_S) -> Channel:
        """Collective: every rank of the job opens it at the same point. The first contact
        (which ranks share a node, and the CPUs each may run on) waits ``join_s`` at most;
        every call after it ``timeout_s`` at most. ``what`` names the work in errors."""
        forks.guard_forks()  # the workers feedrate forks next come right after these calls
        world, rank = dist.get_world_size(), dist.get_rank()
        unknown = Ranks(rank, world, 0, 1, 0, 1, (0,) * world)
        try:
            hello = dist.new_group(backend="gloo", timeout=timedelta(seconds=join_s))
        except RuntimeError as exc:
            raise Channel(unknown, None, join_s, what)._lost("reach every rank", exc) from exc
        first = cls(unknown, hello, join_s, what)
        try:  # the first group is closed whatever happens (a failed hello included)
            hellos = first.all_gather([node_key(), cpu_ids()])
            ranks = ranks_of(rank, [str(k) for k, _ in hellos], [ids for _, ids in hellos])
            group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        except RuntimeError as exc:
            raise first._lost("open its channel", exc) from exc
        finally:
            first.close()
        return cls(ranks, group, timeout_s, what)

    @property
    def group(self) -> Any:
        """The group the channel's calls go over; ``RankError`` once it is closed (a group of
        None would be the job's own)."""
        if self._group is None:
            raise RankError(f"rank {self.ranks.rank}'s channel for {self.what} is closed")
        return self._group

    def broadcast(self, obj: Any = None) -> Any:
        """Rank 0's ``obj`` on every rank (the others' ``obj`` is ignored)."""
        box = [obj if self.ranks.main else None]
        began = time.monotonic()
        try:
            dist.broadcast_object_list(box, src=0, group=self.group)
        except RuntimeError as exc:
            raise self._lost("hear from rank 0", exc, began) from exc
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        out: list[Any] = [None] * self.ranks.world
        began = time.monotonic()
        try:
            dist.all_gather_object(out, obj, group=self.group)
        except RuntimeError as exc:
            raise self._lost("hear from every rank", exc, began) from exc
        return out

    def gather_started(self, obj: Any) -> Pending:
        """``all_gather`` of ``obj`` begun, left running (``Pending``): the others' next call
        pairs with it."""
        try:
            return Pending(self, obj)
        except RuntimeError as exc:
            raise self._lost("reach the other ranks", exc) from exc

    def gate(self) -> Gate:
        """A new non-blocking barrier over the channel's ranks (``Gate``)."""
        return Gate(self)

    def close(self) -> None:
        """Not collective; once is enough (a second call does nothing)."""
        group, self._group = self._group, None
        if group is None or not dist.is_initialized():
            return
        # The job's own group destroyed first takes ours with it: nothing left to close.
        with contextlib.suppress(RuntimeError, ValueError, AssertionError):
            dist.destroy_process_group(group)

    def drop(self) -> None:
        """Closed, its group left as it is to the end of the process: a collective still runs
        on it (a ``Pending`` the others never joined: they wait in the job's own calls, a
        DDP all-reduce, for this rank). Destroyed, as the interpreter's end would, gloo waits
        for that collective: the rank never exits, and the others wait for it."""
        group, self._group = self._group, None
        if group is not None:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))  # never collected

    def _lost(self, doing: str, exc: BaseException, began: float | None = None) -> RankError:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        took = None if began is None else time.monotonic() - began
        if took is not None and took < 0.9 * self.timeout_s:  # not a timeout: a peer went
            other = f"rank {1 - self.ranks.rank}" if self.ranks.world == 2 else "another rank"
            return RankError(
                f"rank {self.ranks.rank} could not {doing} during {self.what}: {other} closed "
                f"its connection after {took:.0f} s (it failed, was killed or was interrupted; "
                f"the launcher's log says how) ({first[:300]})"
            )
        return RankError(
            f"rank {self.ranks.rank} could not {doing} during {self.what} within "
            f"{self.timeout_s:g} s: another rank failed, was interrupted, or does not call "
            f"feedrate at the same point ({first[:300]})"
        )


class Pending:
    """``Channel.all_gather`` as two collectives that gloo's own threads run (sizes, then the
    pickled objects, as ``all_gather_object`` does: the other ranks' call pairs with it),
    polled from Python (``wait``). No thread of the process waits inside torch's C++ for it:
    one that did, woken as the interpreter ended, took the process down with SIGABRT
    (``pthread_exit`` through pybind11's frames) instead of the user's exit status."""

    def __init__(self, channel: Channel, obj: Any) -> None:
        self._channel, world = channel, channel.ranks.world
        self._data = pickle.dumps(obj)
        self._sizes = torch.zeros(world, dtype=torch.long)
        mine = torch.tensor([len(self._data)], dtype=torch.long)
        parts = [self._sizes[i].unsqueeze(0) for i in range(world)]
        self._work = dist.all_gather(parts, mine, group=channel.group, async_op=True)
        self._out: torch.Tensor | None = None
        self.result: list[Any] | None = None
        self._began = time.monotonic()

    def wait(self, seconds: float) -> bool:
        """Whether it ended within ``seconds`` (``result``: every rank's object, in rank
        order); ``RankError`` where the group failed."""
        end = time.monotonic() + seconds
        while not self._step():
            if time.monotonic() >= end:
                return False
            time.sleep(0.005)
        return True

    def _step(self) -> bool:
        if self.result is not None:
            return True
        if not self._work.is_completed():
            return False
        try:
            self._work.wait()  # done: raises what failed it
        except RuntimeError as exc:
            raise self._channel._lost("hear from every rank", exc, self._began) from exc
        world, top = self._channel.ranks.world, int(self._sizes.max())
        if self._out is None:  # the sizes came: the objects, padded to the largest
            mine = torch.zeros(top, dtype=torch.uint8)
            mine[: len(self._data)] = torch.frombuffer(bytearray(self._data), dtype=torch.uint8)
            self._out = torch.empty(top * world, dtype=torch.uint8)
            parts = [self._out[top * i : top * (i + 1)] for i in range(world)]
            self._work = dist.all_gather(parts, mine, group=self._channel.group, async_op=True)
            return False
        raw = self._out.numpy().tobytes()
        self.result = [
            pickle.loads(raw[top * i : top * i + int(self._sizes[i])]) for i in range(world)
        ]
        return True


class Gate:
    """A barrier that does not block. Each rank arrives once, at its first call (or
    ``arrive``), and every call says whether all ranks have: a measurement's ``steady`` hook,
    so that each rank times the others' steady state, not their start-up. A rank must arrive
    even when its part fails before asking (``arrive`` in a ``finally``): the channel's next
    collective comes after this barrier on every rank."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._work: Any = None

    def __call__(self) -> bool:
        self.arrive()
        return bool(self._work.is_completed())

    def arrive(self) -> None:
        if self._work is not None:
            return
        try:
            self._work = dist.barrier(group=self._channel.group, async_op=True)
        except RuntimeError as exc:
            raise self._channel._lost("meet the other ranks", exc) from exc
