"""The one place for the process group: a run over several processes (torch.distributed).

A launcher (``torchrun``, or Slurm/MPI setting the same variables) starts one process per device
or per CPU socket with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in its
environment. ``join(device)`` makes the run's ``World`` from them: world size 1 (no launcher, or
a launcher with one process) is exactly the single-process program, no process group; otherwise
the process joins a group, gloo for a device whose arrays live in host memory (cpu), NCCL for a
CUDA device (one GPU per rank: ``cuda`` becomes ``cuda:LOCAL_RANK``; untested here, no GPU), and
a device that is neither (Trainium) is refused in one line.

Failure rules. Every collective has the group's timeout (``DFMP2_DIST_TIMEOUT_S``, default
``DEFAULT_TIMEOUT_S``). Input is checked on every rank before the group does any work; the ranks
then agree once (``World.agree``): if any rank refused its input, every rank exits 2 and only the
lowest refusing rank prints its ``error:`` line. After that, a rank that dies (its sockets close)
or raises (its process ends) makes the others' next communication fail: each says so in one line
(``RankLostError``) and exits 2; nothing waits longer than the timeout.

``DFMP2_TEST_FAULT=<point>:<rank>:<kill|raise|hang>[:<n>]`` (tests only): at ``fault(point)`` that
rank kills itself with SIGKILL, raises, or hangs (sleeps three timeouts), so the tests can fail a
rank in the middle of a stage; with ``n``, at its (n+1)-th pass there (after n pairs, say).
``RunOptions.dist_scf`` (``split_scf``): our DF-SCF split over the ranks (default) or replicated
on each. ``World.ordered_sum`` adds the ranks' partial sums in one fixed order (the split SCF's
J and K): the same bits as one process.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from dfmp2 import linalg
from dfmp2.errors import EXIT_USER_ERROR, InputError

TIMEOUT_ENV = "DFMP2_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 1800.0  # the longest one rank may wait for the others at one collective
FAULT_ENV = "DFMP2_TEST_FAULT"
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class RankLostError(InputError):
    """Another rank died, raised, or did not answer within the timeout: this rank stops too."""


class PeerRefusedError(InputError):
    """Another rank refused its input (that rank prints the error line; this one exits 2 quietly)."""


@dataclass
class World:
    """The run's processes. ``rank`` of ``size``; ``local_rank`` on its node; ``comm_backend``:
    'gloo', 'nccl' or None (one process); ``device``: this rank's device name; ``comm``: per stage,
    {'bytes': sent by this rank, 'seconds': spent in communication}."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    comm_backend: str | None = None
    device: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    comm: dict = field(default_factory=dict)
    agreed: bool = False
    refused: bool = False  # the ranks agreed that the input is refused: every rank stops here
    scf_split: bool = True  # our DF-SCF split over the ranks (RunOptions.dist_scf), set by check_options
    b_bytes: list = field(default_factory=list)  # each rank's B in bytes (the MP2 stage fills it)
    devices: list = field(default_factory=list)  # each rank's 'host device' (``summarize``)
    comm_total: dict = field(default_factory=dict)  # per stage, bytes sent by all ranks (``summarize``)
    pia_rows: list = field(default_factory=list)  # each rank's rows of (P|ia) (the MP2 stage fills it)
    group: object = None  # a group of the ranks (``split``): its torch ProcessGroup; None: every rank
    members: list = field(default_factory=list)  # the group's ranks in the launcher's numbering ([]: all)

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def wire_device(self) -> torch.device:
        """Where tensors go to be communicated: the host for gloo, the rank's GPU for NCCL."""
        return torch.device(self.device) if self.comm_backend == "nccl" else torch.device("cpu")

    def peer(self, r: int) -> int:
        """Rank ``r`` of this World in the launcher's numbering (torch.distributed's own)."""
        return self.members[r] if self.members else r

    def split(self, group_size: int) -> tuple[World, int, int]:
        """(this rank's group, its index, the number of groups) for groups of ``group_size``
        consecutive ranks (a task-parallel command's runs, one group a run: dfmp2.workflows.tasks).
        1: every rank a one-process World of its own. Every rank makes every group, in order
        (torch.distributed.new_group is collective; the whole World's group when there is one
        group). A group's World has not agreed yet: each run in it agrees on its own input within
        the group (``agree``), as a run over that many ranks does; it is never closed (``close``)."""
        if group_size == 1:
            return World(), self.rank, self.size
        import torch.distributed as dist

        ngroups = self.size // group_size
        g = self.rank // group_size
        if ngroups == 1:  # this World's own ranks and group (a group's runs dealt within it: a CBS bracket's)
            members, pg = list(self.members) or list(range(self.size)), self.group
        else:
            if self.members:
                raise ValueError("groups of a group of ranks: not supported (new_group takes every rank)")
            members, pg = list(range(g * group_size, (g + 1) * group_size)), None
            with self.talking("start", "forming groups of ranks"):
                for h in range(ngroups):
                    pg_h = dist.new_group(
                        list(range(h * group_size, (h + 1) * group_size)),
                        timeout=datetime.timedelta(seconds=self.timeout_s),
                        backend=self.comm_backend,
                    )
                    pg = pg_h if h == g else pg
        sub = World(
            rank=self.rank - g * group_size,
            size=group_size,
            local_rank=self.local_rank,
            comm_backend=self.comm_backend,
            device=self.device,
            timeout_s=self.timeout_s,
            scf_split=self.scf_split,
            group=pg,
            members=members,
        )
        return sub, g, ngroups

    def count(self, stage: str, nbytes: int, seconds: float) -> None:
        c = self.comm.setdefault(stage, {"bytes": 0, "seconds": 0.0})
        c["bytes"] += int(nbytes)
        c["seconds"] += seconds

    def describe(self) -> dict:
        """For the result: world size, communication backend, per-rank devices, communication."""
        return {
            "world_size": self.size,
            **({"group_of_ranks": list(self.members)} if self.members else {}),
            "backend": self.comm_backend,
            "devices": list(self.devices),
            "scf": "split" if split_scf(self) else "replicated",
            "B_bytes_per_rank": list(self.b_bytes),
            "pia_rows_per_rank": list(self.pia_rows),
            "timeout_s": self.timeout_s,
            "comm_rank0": {k: dict(v) for k, v in self.comm.items()},
            "comm_bytes_all_ranks": dict(self.comm_total),
        }

    # -------------------------------------------------------------- collectives
    @contextmanager
    def talking(self, stage: str, what: str):
        """Communication of ``stage``: a failure of the group (a rank gone, a timeout) becomes one
        RankLostError line."""
        try:
            yield
        except (RuntimeError, ValueError) as e:  # gloo/NCCL errors (DistBackendError is a RuntimeError)
            first = " ".join(str(e).split()).split(". This is typically")[0][-160:]
            raise RankLostError(
                f"rank {self.rank} of {self.size}: lost contact with the other ranks "
                f"while {what} in the {stage} stage (a rank died, failed or did not "
                f"answer within {self.timeout_s:g} s): {first}; the run stopped"
            ) from None

    def agree(self, error: BaseException | None, content: dict | None = None) -> None:
        """The ranks' one agreement on their input (before the group does any work): every rank
        passes the error it met (None: none) and, when it has one, the ``content`` it will compute
        ({what: value}, ``differing``). When any rank refused, this raises: the error itself on the
        lowest refusing rank (it prints it), PeerRefusedError on the others. When none refused but
        the ranks' contents differ, InputError on rank 0 (one line: what differs, between which
        ranks) and PeerRefusedError on the others, before any integral."""
        if not self.distributed or self.agreed:
            if error is not None:
                raise error
            return
        self.agreed = True
        import torch.distributed as dist

        mine = (error is None, digests(content) if error is None and content is not None else None)
        every = [None] * self.size
        with self.talking("input check", "agreeing on the input"):
            dist.all_gather_object(every, mine, group=self.group)
        refusing = [r for r, (ok, _) in enumerate(every) if not ok]
        if refusing:
            self.refused = True
            if error is not None and refusing[0] == self.rank:
                raise error
            raise PeerRefusedError(f"rank {refusing[0]} refused the input")
        problem = differing([d for _, d in every])
        if problem is None:
            return
        self.refused = True
        if self.rank:
            raise PeerRefusedError(problem[0])
        raise InputError(problem[0], option=problem[1])

    @contextmanager
    def agreeing(self):
        """Input checks that may refuse the run: an exception inside is agreed on (``agree``)
        before it leaves, so every rank stops together."""
        try:
            yield
        except Exception as e:
            self.agree(e)
            raise

    def all_reduce_sum(self, t: torch.Tensor, stage: str) -> torch.Tensor:
        """Sum of ``t`` over the ranks (every rank gets it), on ``t``'s device."""
        if not self.distributed:
            return t
        import torch.distributed as dist

        t0 = time.perf_counter()
        w = t.to(self.wire_device).contiguous()
        with self.talking(stage, "summing over the ranks"):
            dist.all_reduce(w, group=self.group)
        self.count(stage, w.numel() * w.element_size(), time.perf_counter() - t0)
        return w.to(t.device)

    def ordered_sum(self, parts, shape, dtype, device, stage: str) -> torch.Tensor:
        """Σ of every rank's ``parts`` (an iterable of tensors of ``shape``, this rank's in their
        global order; the ranks' in rank order) added one at a time in that order, on every rank:
        the same bits as one process adding all of them in order. Rank 0 adds its own as they
        come; rank r > 0 keeps its own, receives rank r - 1's running sum, adds its own to it and
        passes it on; the last rank broadcasts the total (N - 1 passes and one broadcast of
        ``shape``). One process: the running sum alone (zeros when there is nothing)."""
        total = None
        held = [] if self.rank else None
        for p in parts:
            if held is not None:
                held.append(p)
            elif total is None:
                total = p
            else:
                total += p
        if not self.distributed:
            return total if total is not None else torch.zeros(shape, dtype=dtype, device=device)
        import torch.distributed as dist

        if self.rank:
            total = torch.empty(shape, dtype=dtype, device=self.wire_device)
            self.shift(None, total, self.rank, self.rank - 1, stage)
            total = total.to(device)
            for p in held:
                total += p
        elif total is None:
            total = torch.zeros(shape, dtype=dtype, device=device)
        if self.rank + 1 < self.size:
            self.shift(total.to(self.wire_device).contiguous(), None, self.rank + 1, self.rank, stage)
        t0 = time.perf_counter()
        w = total.to(self.wire_device).contiguous()
        with self.talking(stage, "passing the sum over the ranks"):
            dist.broadcast(w, src=self.peer(self.size - 1), group=self.group)
        self.count(stage, w.numel() * w.element_size() if self.rank == self.size - 1 else 0, time.perf_counter() - t0)
        return w.to(device)

    def broadcast(self, tensors, src: int, stage: str) -> None:
        """Every tensor of ``tensors`` (contiguous, the same shapes on every rank) overwritten in
        place on every rank by rank ``src``'s (one process: nothing to do)."""
        if not self.distributed:
            return
        import torch.distributed as dist

        t0 = time.perf_counter()
        with self.talking(stage, f"receiving rank {src}'s block"):
            for t in tensors:
                w = t if t.device == self.wire_device else t.to(self.wire_device)
                dist.broadcast(w, src=self.peer(src), group=self.group)
                if w is not t:
                    t.copy_(w)
        sent = sum(t.numel() * t.element_size() for t in tensors) if self.rank == src else 0
        self.count(stage, sent, time.perf_counter() - t0)

    def gather_objects(self, obj, stage: str) -> list:
        """Every rank's ``obj`` (picklable), in rank order, on every rank (one process: [obj])."""
        if not self.distributed:
            return [obj]
        import pickle

        import torch.distributed as dist

        t0 = time.perf_counter()
        out = [None] * self.size
        with self.talking(stage, "gathering results from the ranks"):
            dist.all_gather_object(out, obj, group=self.group)
        self.count(stage, len(pickle.dumps(obj)), time.perf_counter() - t0)
        return out

    def shift(self, send: torch.Tensor | None, recv: torch.Tensor | None, to: int, frm: int, stage: str) -> None:
        """Send ``send`` to rank ``to`` while receiving ``recv`` (its shape known) from ``frm``;
        either may be None (nothing that way)."""
        self.post(send, recv, to, frm, stage).wait()

    def post(self, send, recv, to: int, frm: int, stage: str) -> Pending:
        """``shift`` started: the transfers go on (gloo's and NCCL's own threads) until
        ``wait()``, so the caller computes meanwhile; the seconds counted are those it waited."""
        import torch.distributed as dist

        t0 = time.perf_counter()
        with self.talking(stage, "passing blocks between ranks"):
            ops = []
            if send is not None and send.numel():
                ops.append(dist.P2POp(dist.isend, send, self.peer(to), group=self.group))
            if recv is not None and recv.numel():
                ops.append(dist.P2POp(dist.irecv, recv, self.peer(frm), group=self.group))
            reqs = dist.batch_isend_irecv(ops) if ops else []
        nbytes = send.numel() * send.element_size() if send is not None else 0
        self.count(stage, nbytes, time.perf_counter() - t0)
        return Pending(self, reqs, stage, send)

    STAGES = ("scf", "transform", "pair")

    def summarize(self) -> None:
        """After the stages, on every rank: each rank's host and device (``devices``) and the bytes
        all ranks sent per stage (``comm_total``)."""
        if not self.distributed:
            return
        import socket

        import torch.distributed as dist

        devices = [None] * self.size
        sent = torch.tensor(
            [float(self.comm.get(s, {}).get("bytes", 0)) for s in self.STAGES],
            dtype=torch.float64,
            device=self.wire_device,
        )
        with self.talking("result", "gathering the result"):
            dist.all_gather_object(devices, f"{socket.gethostname()} {self.device}", group=self.group)
            dist.all_reduce(sent, group=self.group)
        self.devices = devices
        self.comm_total = {s: int(b) for s, b in zip(self.STAGES, sent.tolist())}

    def close(self) -> None:
        """Leave the group after a run every rank finished, or after the ranks agreed to refuse the
        input (every rank is then at the same point); never after a failure, where a peer may be
        gone. Left to the interpreter's exit instead, gloo's threads sometimes aborted a refusing
        rank (SIGABRT, 'terminate called without an active exception': 2 runs in 7). A group of
        the ranks (``split``) leaves with the whole World."""
        if self.distributed and not self.members:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


DIGEST_SHOWN = 40  # a value whose text is at most this long is quoted in the error line


def _canonical(value):
    """``value`` for hashing: floats by their bits (float.hex), arrays as nested lists, mappings
    with sorted keys; what JSON cannot hold, by its repr."""
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if hasattr(value, "tolist"):  # numpy and torch arrays, numpy scalars
        return _canonical(value.tolist())
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return repr(value)


def digests(content: dict) -> dict:
    """{what: (hash of the value bit for bit, the repr of a short plain value, else None)}: what the
    ranks gather to compare their inputs (``World.agree``), a few hundred bytes whatever the molecule."""
    out = {}
    for what, value in content.items():
        text = json.dumps(_canonical(value), sort_keys=True)
        plain = value is None or isinstance(value, (bool, int, float, str))  # shown exactly (repr)
        shown = repr(value) if plain and len(repr(value)) <= DIGEST_SHOWN and repr(value).isprintable() else None
        out[what] = (hashlib.sha256(text.encode()).hexdigest()[:20], shown)
    return out


def _ranks(ranks: list) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def differing(per_rank: list) -> tuple[str, str | None] | None:
    """(the error line, the RunOptions field or None) when the ranks' ``digests`` differ: the first
    thing that differs (rank 0's order: the molecule, then its basis sets, the options, the cpu
    BLAS choice), between which ranks, and anything else that differs; None when they all agree.
    A key 'option <field>' is the RunOptions field <field> (the CLI names its flag)."""
    per_rank = [d or {} for d in per_rank]
    order = list(dict.fromkeys(k for d in per_rank for k in d))
    found = []
    for what in order:
        groups: dict = {}
        for r, d in enumerate(per_rank):
            groups.setdefault(d.get(what, (None, "(none)"))[0], []).append(r)
        if len(groups) > 1:
            found.append((what, groups))
    if not found:
        return None
    what, groups = found[0]
    parts = []
    for ranks in groups.values():
        shown = per_rank[ranks[0]].get(what, (None, "(none)"))[1]
        parts.append(f"{_ranks(ranks)}: {shown}" if shown is not None else _ranks(ranks))
    also = f", and in {', '.join(w for w, _ in found[1:])}" if found[1:] else ""
    line = (
        f"the ranks did not read the same input: they differ in {what} ({' vs '.join(parts)}){also}; every rank "
        "must run the same molecule with the same options (a node-local copy that differs, or a file "
        "rewritten while the job started?)"
    )
    option = what.split(" ", 1)[1] if what.startswith("option ") else None
    return line, option


class Pending:
    """Transfers under way (``World.post``); ``wait()`` ends them (a failure: RankLostError)."""

    def __init__(self, world: World, reqs: list, stage: str, keep):
        self.world, self.reqs, self.stage, self.keep = world, reqs, stage, keep  # keep: the send buffer alive

    def wait(self) -> None:
        t0 = time.perf_counter()
        with self.world.talking(self.stage, "passing blocks between ranks"):
            for req in self.reqs:
                req.wait()
        self.reqs, self.keep = [], None
        self.world.count(self.stage, 0, time.perf_counter() - t0)


_current = World()


def current() -> World:
    """The World this process joined (world size 1 when it joined none)."""
    return _current


def launched_world() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) from the launcher's variables, or None without them."""
    if "WORLD_SIZE" not in os.environ and "RANK" not in os.environ:
        return None
    try:
        size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise InputError("the launcher's RANK, WORLD_SIZE and LOCAL_RANK must be integers") from None
    if size < 1 or not 0 <= rank < size:
        raise InputError(f"the launcher's RANK {rank} is not within WORLD_SIZE {size}")
    return rank, size, local


def launcher_rank() -> int:
    """This process's RANK as the launcher set it (0 without one, or when it cannot be read): for
    the errors found before the ranks can agree (a usage error), which rank 0 alone prints."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def timeout_s() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InputError(f"{TIMEOUT_ENV}={raw!r} is not a positive number of seconds")
    return value


def rank_device(device: str, local_rank: int) -> tuple[str, str]:
    """(this rank's device name, communication backend) for ``device`` over several ranks;
    InputError for a device no backend here connects (Trainium) or a GPU index given by hand."""
    try:
        caps = linalg.device_capabilities(device)
    except ValueError as e:
        raise InputError(str(e), option="device") from None
    if caps.is_host:
        return device, "gloo"
    if caps.cuda_memory:
        if ":" in device:
            raise InputError(
                f"with several ranks give the device without an index: each rank takes "
                f"its own GPU (LOCAL_RANK), not '{device}'",
                option="device",
            )
        return f"{device}:{local_rank}", "nccl"
    raise InputError(
        f"device '{device}' cannot run over several processes yet (gloo connects CPU "
        "processes, NCCL CUDA GPUs); run one process",
        option="device",
    )


def _check_gpu_for_rank(device: str, local_rank: int) -> None:
    """InputError (one line) when this node has no GPU for the rank with ``local_rank`` (NCCL: one
    GPU per rank); before, torch.cuda.set_device died with a traceback."""
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if local_rank >= have:
        raise InputError(
            f"device '{device}' over several ranks takes one GPU per rank (cuda:LOCAL_RANK); this node's "
            f"rank with LOCAL_RANK {local_rank} finds {have} CUDA GPU(s)"
            + ("" if torch.backends.cuda.is_built() else " (this torch is built without CUDA)")
            + ": start at most one rank per GPU, or run on cpu",
            option="device",
        )


def join(device: str) -> World:
    """The World of this process (module docstring): joins the process group when a launcher
    started several processes; world size 1 otherwise. Called once, before any input is read."""
    global _current
    launch = launched_world()
    if launch is None or launch[1] == 1:
        _current = World()
        return _current
    rank, size, local = launch
    import torch.distributed as dist

    world = World(rank=rank, size=size, local_rank=local, timeout_s=timeout_s())
    try:
        world.device, world.comm_backend = rank_device(device, local)
        if world.comm_backend == "nccl":
            _check_gpu_for_rank(device, local)
    except InputError as e:
        world.device, world.comm_backend = "cpu", "gloo"  # join all the same, to agree on it
        _current = world
        _init(dist, world)
        try:
            world.agree(e)  # raises: e on the lowest refusing rank, PeerRefusedError on the others
        except PeerRefusedError:
            world.close()
            raise SystemExit(EXIT_USER_ERROR) from None
        except BaseException:
            world.close()  # every rank is here: leave the group in order (a refusing rank's gloo abort)
            raise
    _current = world
    _init(dist, world)
    return world


def _init(dist, world: World) -> None:
    if dist.is_initialized():
        return
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise InputError(f"a run over {world.size} ranks needs {' and '.join(missing)} (torchrun sets them)")
    kw = {}
    if world.comm_backend == "nccl":  # one GPU per rank (untested here: no GPU)
        torch.cuda.set_device(torch.device(world.device))
        kw = {"device_id": torch.device(world.device)}
    timeout = datetime.timedelta(seconds=world.timeout_s)
    with world.talking("start", "joining the process group"):
        store = _store(world.rank, world.size, world.timeout_s)
        _gate(store, world)
        dist.init_process_group(
            world.comm_backend,
            store=dist.PrefixStore("default_pg", store),  # as init_process_group's own env:// store
            rank=world.rank,
            world_size=world.size,
            timeout=timeout,
            **kw,
        )


# The gate before the process group (``_gate``): every rank checks in at the launcher's store,
# a rank that could not start (its command line refused, before it could join) leaves its reason
# there (``announce_failure``), so the others end in seconds, not at the join timeout.
GATE_POLL_S = 0.05


def _gate_key(name: str) -> str:
    return f"dfmp2/gate/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{name}"


def _store(rank: int, size: int, timeout: float):
    """The launcher's key-value store (MASTER_ADDR:MASTER_PORT; rank 0 hosts it, or torchrun's
    agent), as init_process_group's env:// rendezvous makes it."""
    import torch.distributed as dist

    delta = datetime.timedelta(seconds=timeout)
    store, _, _ = next(dist.rendezvous("env://", rank, size, timeout=delta))
    store.set_timeout(delta)
    return store


def _wait_count(store, name: str, size: int, timeout: float) -> bool:
    """Whether the counter ``name`` reached ``size`` within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while store.add(_gate_key(name), 0) < size:
        if time.monotonic() > deadline:
            return False
        time.sleep(GATE_POLL_S)
    return True


def _gate(store, world: World) -> None:
    """Every rank checked in (or the join timeout: RankLostError); a rank that announced it could
    not start ends the others: rank 0 prints the lowest such rank's reason (InputError), the
    others exit 2 quietly."""
    store.add(_gate_key("count"), 1)
    if not _wait_count(store, "count", world.size, world.timeout_s):
        raise RankLostError(
            f"rank {world.rank} of {world.size}: not every rank started within {world.timeout_s:g} s "
            f"({TIMEOUT_ENV}); the run stopped"
        )
    failed = [r for r in range(world.size) if store.check([_gate_key(f"failed/{r}")])]
    reason = store.get(_gate_key(f"failed/{failed[0]}")).decode() if failed else ""
    store.add(_gate_key("seen"), 1)
    if not failed:
        return
    if world.rank:
        raise SystemExit(EXIT_USER_ERROR)
    raise InputError(f"rank {failed[0]} of {world.size} could not start: {reason}")


def announce_failure(reason: str) -> None:
    """A launched rank that ends before it joins the group (its command line refused) says so at
    the launcher's store, so the ranks waiting for it end at once (``_gate``); rank 0, the store's
    host, stays until every rank has read it (at most the join timeout). Nothing without a
    launcher of several processes, or when the store cannot be reached."""
    try:
        launch = launched_world()
        if launch is None or launch[1] == 1 or not {"MASTER_ADDR", "MASTER_PORT"} <= set(os.environ):
            return
        rank, size, _ = launch
        timeout = timeout_s()
        store = _store(rank, size, timeout)
        store.set(_gate_key(f"failed/{rank}"), reason)
        store.add(_gate_key("count"), 1)
        store.add(_gate_key("seen"), 1)
        if rank == 0:
            _wait_count(store, "seen", size, timeout)
    except Exception:  # the others then end at their join timeout, as before
        return


_fault_calls: dict = {}  # passes through each fault point (the hook's optional fourth field)


def fault(point: str) -> None:
    """The test hook of the module docstring (``DFMP2_TEST_FAULT``); nothing when unset."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    where, rank, how, after = (spec.split(":") + ["", "", ""])[:4]
    if where == point and str(_current.rank) == rank:
        _fault_calls[point] = _fault_calls.get(point, 0) + 1
        if after and _fault_calls[point] <= int(after):  # '<point>:<rank>:<how>:<n>': after n passes
            return
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "hang":  # alive but silent: the others' timeout must end them
            time.sleep(_current.timeout_s * 3)
        if how == "refuse":  # an expected error (one line), as a bad input on that rank would give
            raise InputError(f"test refusal at {point} on rank {rank}")
        raise RuntimeError(f"test fault at {point} on rank {rank}")


def check_options(options, world: World) -> None:
    """What a run over several ranks cannot do yet, refused before any work (InputError); a run's
    ``ranks_per_run`` other than 1 or its World's size (a run goes over all of its World's ranks:
    only a task-parallel command makes groups, ``check_groups``)."""
    if options.ranks_per_run not in (1, world.size):
        raise InputError(
            f"--ranks-per-run {options.ranks_per_run} does not fit a run over {world.size} rank(s): only "
            "interaction, a CBS bracket, frequencies and regress give their runs to groups of ranks; any "
            "other run goes over every rank (leave the option out)",
            option="ranks_per_run",
        )
    if not world.distributed:
        return
    world.scf_split = options.dist_scf == "split"
    if options.storage == "disk":
        raise InputError(
            f"B on disk is not supported over several ranks yet ({world.size} here): each "
            "rank keeps its share of B in memory",
            option="storage",
        )


def check_groups(options, world: World) -> int:
    """The group size of a task-parallel command's runs (``options.ranks_per_run``; InputError
    when it does not divide the World's ranks): each run goes to a group of that many ranks
    (``World.split``)."""
    g = options.ranks_per_run
    if g > world.size or world.size % g:
        raise InputError(
            f"--ranks-per-run {g} must divide the number of ranks ({world.size} here) into groups of "
            f"{g}: start a multiple of {g} ranks (torchrun --nproc-per-node), or give a divisor of {world.size}",
            option="ranks_per_run",
        )
    return g


def rank_options(options, world: World):
    """``options`` for this rank: its own device (NCCL: cuda:LOCAL_RANK)."""
    if not world.distributed or options.device == world.device:
        return options
    import dataclasses

    return dataclasses.replace(options, device=world.device)


def check_plan(plan, world: World) -> None:
    """A plan the ranks cannot run yet (B on disk), refused before any work (InputError)."""
    if world.distributed and plan.out_of_core:
        raise InputError(
            f"B does not fit in memory on each of the {world.size} ranks (plan: "
            f"{plan.in_memory_mb:,.0f} MB in memory, limit {plan.limit_mb:,.0f} MB) and B on "
            "disk is not supported over several ranks yet; use more ranks or more memory",
            option="memory_mb",
        )


@contextmanager
def command(world: World):
    """Around a command on every rank: an error before the ranks agreed on their input is agreed
    on now (the lowest refusing rank raises it, the others exit 2 quietly: one error line); the
    group is left after a run every rank finished."""
    try:
        yield
    except PeerRefusedError:
        world.close()
        raise SystemExit(EXIT_USER_ERROR) from None
    except Exception as e:
        if world.distributed and not world.agreed:
            try:
                world.agree(e)  # raises: e itself on the lowest refusing rank, PeerRefusedError on the others
            except PeerRefusedError:
                world.close()
                raise SystemExit(EXIT_USER_ERROR) from None
            except BaseException:
                if world.refused:
                    world.close()
                raise
        if world.refused:  # every rank reached the agreement and stops: the group is left in order
            world.close()
        raise
    else:
        world.close()


def split_scf(world: World) -> bool:
    """Whether our DF-SCF splits its JK factor over the ranks (``RunOptions.dist_scf``, default
    'split': fixed groups of the factor's rows, J and K added in group order over the ranks,
    dfmp2.scf.jk_dist), or every rank runs the whole SCF ('replicated'). Both give one process's
    orbitals bit for bit, so E(HF), E_OS and E_SS bit-identical to a 1-rank run (at equal threads
    per process and BLAS choice)."""
    return world.distributed and world.scf_split


UNLIMITED_MB = 1e15  # the plan over several ranks: blocks as one process without a limit


def plan_options(options, world: World):
    """The options the memory plan is made with: over several ranks, B in memory with the blocks a
    single process chooses from the shapes (the same blocks, so the same bits); the per-rank
    limit is checked after (dfmp2.mp2.dist.per_rank_plan)."""
    if not world.distributed:
        return options
    import dataclasses

    return dataclasses.replace(options, memory_mb=UNLIMITED_MB, storage="memory")
