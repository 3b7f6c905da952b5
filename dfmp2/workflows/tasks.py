"""Whole runs dealt over the ranks: the task-parallel commands (``interaction``'s 2N+1 runs, a CBS
bracket's bases) give each run to one rank, as a one-process run there, and gather the results on
every rank. (``frequencies`` deals its gradients the same way with tensors and a checkpoint of its
own: dfmp2.workflows.frequencies.)

Round k deals tasks k*N .. k*N + N - 1 to ranks 0 .. N - 1 (N ranks); after each round every rank
holds every result of the round (``World.gather_objects``). Each run is the one a single process
makes (its own one-process World: the same blocks, the same bits, at the same threads per
process), so the gathered results equal one process's. A task that fails with an InputError (or
one of its kinds) ends every rank at the end of its round: the rank of the first failed task
raises it (its one error line), the others PeerRefusedError (they exit 2 quietly); over several
ranks a device that cannot run or a kernel that failed counts as such an InputError. A rank that
dies ends the others at the next gather (RankLostError, the collective timeout).
"""

from __future__ import annotations

from dfmp2 import distributed
from dfmp2.errors import InputError, error_line
from dfmp2.linalg import DeviceUnavailableError, KernelError


def deal(ntasks: int, run_task, world=None, stage: str = "tasks") -> list:
    """The results of ``run_task(k, single_world)`` for k = 0 .. ntasks - 1, in task order, on every
    rank of ``world`` (default ``distributed.current()``). ``run_task`` runs task k as one process
    (``single_world``: a one-process World to pass down to ``pipeline.prepare_run``) and returns a
    picklable result. The ranks must have agreed on their input before (``World.agree``). One
    process: the tasks in turn, the first InputError raised as it comes."""
    world = world if world is not None else distributed.current()
    single = distributed.World()
    results: list = [None] * ntasks
    for r0 in range(0, ntasks, world.size):
        k = r0 + world.rank
        mine, error = None, None
        if k < ntasks:
            try:
                distributed.fault("task")
                mine = ("ok", run_task(k, single))
            except InputError as e:
                error, mine = e, ("failed", None)
            except (DeviceUnavailableError, KernelError) as e:  # ends every rank as an InputError does:
                if not world.distributed:  # one line from this rank, not one lost-contact line from each other
                    raise
                error, mine = InputError(error_line(e)), ("failed", None)
        round_ = world.gather_objects(mine, stage)
        failed = [r0 + j for j, got in enumerate(round_) if got is not None and got[0] == "failed"]
        if failed:
            if error is not None and failed[0] == k:
                raise error
            raise distributed.PeerRefusedError(f"task {failed[0] + 1} of {ntasks} failed on another rank")
        for j, got in enumerate(round_):
            if got is not None:
                results[r0 + j] = got[1]
    return results
