"""Whole runs dealt over the ranks: the task-parallel commands (``interaction``'s 2N+1 runs, a CBS
bracket's bases, ``compare``, ``regress``) give each run to one rank, as a one-process run there,
or to a group of ranks (``RunOptions.ranks_per_run``: runs too large for one rank, each split over
its group as a run over that many ranks), and gather the results on every rank. (``frequencies``
deals its gradients the same way with tensors and a checkpoint of its own:
dfmp2.workflows.frequencies.)

With groups of G consecutive ranks (``World.split``; G = 1: every rank its own group), round k
deals tasks k*M .. k*M + M - 1 to groups 0 .. M - 1 (M = N / G groups); after each round every rank
holds every result of the round (``World.gather_objects``: each group's first rank sends it).
Each run is the one a single process (G = 1) or G ranks make, and those give one process's bits
(the split SCF and the pair step over ranks: dfmp2.distributed), so the gathered results equal one
process's at the same threads per process.

Failures. A task that a rank refuses with an InputError (or one of its kinds) ends every rank at
the end of its round: the lowest rank that refused the first failed task raises it (its one error
line), the others PeerRefusedError (they exit 2 quietly). Over several ranks a device that cannot
run or a kernel that failed on a rank of its own counts as such an InputError (one line from that
rank, not a lost-contact line from each other rank). In a group, each run first agrees on its
input within the group (``World.agree``, as any run over ranks does), so a refusal there is one
line too; an error after that agreement ends its process, as in any run over ranks, and the
group's other ranks, waiting in the run's own communication, stop at once (RankLostError). A
rank that dies ends the others at their next communication (RankLostError, the collective
timeout at the latest).
"""

from __future__ import annotations

from dfmp2 import distributed
from dfmp2.errors import InputError, error_line
from dfmp2.linalg import DeviceUnavailableError, KernelError


def deal(ntasks: int, run_task, world=None, stage: str = "tasks", group_size: int = 1) -> list:
    """The results of ``run_task(k, task_world)`` for k = 0 .. ntasks - 1, in task order, on every
    rank of ``world`` (default ``distributed.current()``). ``run_task`` runs task k on
    ``task_world`` (a one-process World, or with ``group_size`` > 1 this rank's group of that many
    ranks: ``World.split``; pass it down to ``dfmp2.drivers.energy.prepare``) and returns a picklable
    result, the same on every rank of a group. The ranks must have agreed on their input before
    (``World.agree``) and ``group_size`` divide their number (``distributed.check_groups``). One
    process: the tasks in turn, the first InputError raised as it comes."""
    world = world if world is not None else distributed.current()
    task_world, group, ngroups = world.split(group_size)
    lead = task_world.rank == 0
    results: list = [None] * ntasks
    for r0 in range(0, ntasks, ngroups):
        k = r0 + group
        mine, error = None, None
        if k < ntasks:
            try:
                task_world.agreed = task_world.refused = False  # a group agrees on each run's input anew
                with task_world.agreeing():  # in a group: agreed with the others' input check (``agree``)
                    distributed.fault("task")
                result = run_task(k, task_world)
                mine = ("ok", k, result if lead else None)  # the group's first rank sends its run's result
            except distributed.PeerRefusedError as e:  # a rank of the group refused the run's input
                error, mine = e, ("failed", k, False)
            except InputError as e:
                if task_world.distributed and not task_world.refused:  # after the group agreed: as a run
                    raise  # over several ranks, this process ends (the group's others: RankLostError)
                error, mine = e, ("failed", k, True)
            except (DeviceUnavailableError, KernelError) as e:  # one rank's: ends every rank as an InputError
                if not world.distributed or task_world.distributed:  # one process; in a group: the process ends
                    raise
                error, mine = InputError(error_line(e)), ("failed", k, True)
        round_ = world.gather_objects(mine, stage)
        failed = [(got[1], not got[2], r) for r, got in enumerate(round_) if got is not None and got[0] == "failed"]
        if failed:
            first, _, who = min(failed)  # the first failed task, the rank that refused it itself first
            world.refused = True  # every rank stops here together: the group is left in order (World.close)
            if error is not None and who == world.rank:
                raise error
            raise distributed.PeerRefusedError(f"task {first + 1} of {ntasks} failed on another rank")
        for got in round_:
            if got is not None and got[2] is not None:
                results[got[1]] = got[2]
    return results


def per_group(ntasks: int, world, group_size: int = 1) -> list:
    """How many of ``ntasks`` each group of ``group_size`` ranks runs (``deal``), in group order."""
    ngroups = max(1, world.size // group_size)
    return [len(range(g, ntasks, ngroups)) for g in range(ngroups)]
