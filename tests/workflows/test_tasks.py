"""dfmp2.workflows.tasks.deal's failure rules, without processes: a World of 2 ranks whose gather
is faked (this rank 0; rank 1's task succeeds: ('ok', its task, its result))."""

import pytest

from dfmp2 import distributed
from dfmp2.errors import InputError
from dfmp2.linalg import KernelError
from dfmp2.workflows import tasks


def _two_ranks(monkeypatch):
    world = distributed.World(rank=0, size=2)
    monkeypatch.setattr(world, "gather_objects", lambda mine, stage: [mine, ("ok", 1, "rank 1's")])
    return world


def test_a_kernel_failure_over_ranks_ends_every_rank_as_an_input_error(monkeypatch):
    """Over several ranks a KernelError in a task is this rank's one InputError line (the others
    get PeerRefusedError at the same gather), not a crash the others see as a lost rank."""

    def task(k, single):
        raise KernelError("pair kernel failed on cuda:0")

    with pytest.raises(InputError, match="pair kernel failed on cuda:0") as e:
        tasks.deal(2, task, _two_ranks(monkeypatch))
    assert not isinstance(e.value, KernelError)


def test_a_kernel_failure_in_one_process_is_raised_as_it_is():
    def task(k, single):
        raise KernelError("pair kernel failed")

    with pytest.raises(KernelError):
        tasks.deal(2, task, distributed.World())


def test_results_in_task_order(monkeypatch):
    assert tasks.deal(2, lambda k, single: f"task {k}", _two_ranks(monkeypatch)) == ["task 0", "rank 1's"]


def test_runs_per_group():
    """``per_group``: task k on group k mod M, M = ranks / group size."""
    world = distributed.World(rank=0, size=4)
    assert tasks.per_group(5, world) == [2, 1, 1, 1]
    assert tasks.per_group(5, world, 2) == [3, 2]
    assert tasks.per_group(5, world, 4) == [5]
    assert tasks.per_group(3, distributed.World()) == [3]
