"""The memory planner: stage estimates, block choice, the in-memory / out-of-core decision and
the minimum-feasible error, all from shapes (no SCF here)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dfmp2 import memory
from dfmp2.errors import MemoryLimitError, error_line
from dfmp2.memory import human, plan_memory, stage_estimates

# (H2O)4 / cc-pVDZ / cc-pVDZ-RI and a (H2O)40-sized problem
SMALL = dict(nao=96, nocc=20, nvir=76, naux=336, itemsize=8)
LARGE = dict(nao=960, nocc=160, nvir=760, naux=3360, itemsize=8)


def test_plenty_of_memory_keeps_b_in_memory():
    p = plan_memory(**LARGE, limit_mb=1e6, aux_shell_max=9)
    assert not p.out_of_core and p.disk_mb == 0
    assert set(p.stages_mb) == set(memory.STAGES)
    assert p.peak_mb == max(p.stages_mb.values()) == p.in_memory_mb
    assert p.occ_block == memory.OCC_BLOCK_MAX
    b_mb = 3360 * 160 * 760 * 8 / 1e6
    assert p.b_mb == pytest.approx(b_mb)
    assert p.stages_mb["pair"] > b_mb  # B is resident in the pair step
    d = p.to_dict()
    assert d["out_of_core"] is False and d["storage"] == "auto" and d["shapes"]["naux"] == 3360


def test_a_gpu_takes_every_occupied_orbital_in_one_block_where_memory_allows():
    """The occupied block's bound is the device's unless given: OCC_BLOCK_MAX_GPU on a GPU (its pair
    step's GEMMs grow with the block), OCC_BLOCK_MAX on a CPU; the plan shrinks it to fit."""
    from dfmp2.linalg import device_capabilities

    gpu, cpu = device_capabilities("cuda"), device_capabilities("cpu")
    assert memory.occ_block_max(None, gpu) == memory.OCC_BLOCK_MAX_GPU > memory.OCC_BLOCK_MAX
    assert memory.occ_block_max(None, cpu) == memory.OCC_BLOCK_MAX and memory.occ_block_max(5, gpu) == 5
    p = plan_memory(**LARGE, limit_mb=1e6, aux_shell_max=9, occ_block_max=memory.occ_block_max(None, gpu))
    assert p.occ_block == LARGE["nocc"]
    tight = plan_memory(**LARGE, limit_mb=p.peak_mb * 0.5, aux_shell_max=9, occ_block_max=memory.OCC_BLOCK_MAX_GPU)
    assert tight.occ_block < LARGE["nocc"] and tight.peak_mb <= p.peak_mb * 0.5


def test_b_goes_to_disk_with_the_same_blocks_when_it_does_not_fit():
    im = plan_memory(**LARGE, limit_mb=1e6, aux_shell_max=9)
    disk = plan_memory(**LARGE, limit_mb=1e6, aux_shell_max=9, storage="disk")
    assert disk.peak_mb < 0.75 * im.peak_mb
    p = plan_memory(**LARGE, limit_mb=disk.peak_mb, aux_shell_max=9)
    assert p.out_of_core and p.peak_mb <= disk.peak_mb
    assert (p.aux_block, p.occ_block) == (im.aux_block, im.occ_block)  # same arithmetic
    assert p.disk_mb == pytest.approx(p.b_mb)  # fp64: fitted in place
    assert p.stages_mb["pair"] < 0.5 * p.b_mb  # Bi, Bj and two read ahead of 10 blocks


def test_fp32_out_of_core_needs_disk_for_fp64_pia_too():
    p = plan_memory(**dict(LARGE, itemsize=4), limit_mb=2000, aux_shell_max=9)
    assert p.out_of_core
    assert p.disk_mb == pytest.approx(3360 * 160 * 760 * (4 + 8) / 1e6)


def test_tight_limit_shrinks_blocks_and_below_minimum_fails_with_it():
    p = plan_memory(**LARGE, limit_mb=600, aux_shell_max=9)
    assert p.out_of_core and p.peak_mb <= 600
    assert p.occ_block < memory.OCC_BLOCK_MAX or p.aux_block < plan_memory(**LARGE, limit_mb=1e6).aux_block
    at_min = plan_memory(**LARGE, limit_mb=p.min_mb, aux_shell_max=9)
    assert at_min.peak_mb <= p.min_mb
    with pytest.raises(MemoryLimitError, match=r"needs at least 376 MB .*with B on disk.*raise the memory limit") as e:
        plan_memory(**LARGE, limit_mb=0.99 * p.min_mb, aux_shell_max=9)
    assert "--" not in str(e.value) and "--memory" in error_line(e.value)  # the CLI names the option


def test_forced_storage():
    assert plan_memory(**SMALL, limit_mb=1e6, storage="disk").out_of_core
    assert not plan_memory(**SMALL, limit_mb=1e6, storage="memory").out_of_core
    im = plan_memory(**SMALL, limit_mb=1e6)
    with pytest.raises(MemoryLimitError, match="with B in memory"):
        plan_memory(**SMALL, limit_mb=im.b_mb, storage="memory")
    with pytest.raises(ValueError):
        plan_memory(**SMALL, limit_mb=1e6, storage="tape")


def test_fixed_occ_block_from_a_checkpoint():
    p = plan_memory(**LARGE, limit_mb=3000, occ_block=5, aux_shell_max=9)
    assert p.occ_block == 5
    with pytest.raises(MemoryLimitError, match="occupied block 64 \\(from the checkpoint\\)"):
        plan_memory(**LARGE, limit_mb=500, occ_block=64, aux_shell_max=9)


def test_estimates_grow_with_blocks():
    base = dict(LARGE, fit_itemsize=8, out_of_core=True)
    a = stage_estimates(**base, aux_block=20, occ_block=4)
    b = stage_estimates(**base, aux_block=40, occ_block=8)
    assert all(b[k] >= a[k] for k in a) and b["transform"] > a["transform"] and b["pair"] > a["pair"]


@settings(max_examples=60, deadline=None)
@given(
    nao=st.integers(2, 2000),
    nocc=st.integers(1, 400),
    vir_extra=st.integers(1, 2000),
    aux_ratio=st.floats(1.0, 6.0),
    itemsize=st.sampled_from([4, 8]),
    limit=st.floats(0.01, 1e5),
    storage=st.sampled_from(["auto", "memory", "disk"]),
)
def test_plan_fits_or_fails_below_the_minimum(nao, nocc, vir_extra, aux_ratio, itemsize, limit, storage):
    shapes = dict(nao=nao, nocc=nocc, nvir=vir_extra, naux=max(1, int(aux_ratio * nao)), itemsize=itemsize)
    try:
        p = plan_memory(**shapes, limit_mb=limit, storage=storage, aux_shell_max=7)
    except MemoryLimitError as e:
        smallest = plan_memory(**shapes, limit_mb=1e12, storage=storage, aux_shell_max=7).min_mb
        assert limit < smallest
        assert human(smallest) in str(e)
        plan_memory(**shapes, limit_mb=smallest, storage=storage, aux_shell_max=7)  # feasible
        return
    assert p.peak_mb <= limit
    assert 1 <= p.occ_block <= min(nocc, memory.OCC_BLOCK_MAX)
    assert 1 <= p.aux_block <= shapes["naux"]
    # auto keeps B in memory when the shape-chosen blocks fit; otherwise it goes to disk, where
    # the blocks may then shrink (so in_memory_mb of the final blocks can be below the limit).
    if storage == "disk":
        assert p.out_of_core
    elif storage == "memory" or p.in_memory_mb > limit:
        assert p.out_of_core == (storage != "memory")


def _files(root, files: dict):
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_cgroup_v2_limit_left_is_the_smallest_over_the_ancestors(tmp_path):
    """The default limit read /proc/meminfo only: a container's cgroup limit
    was ignored."""
    _files(
        tmp_path,
        {
            "proc": "0::/job/step\n",
            "cg/memory.max": "max\n",
            "cg/memory.current": "9\n",
            "cg/job/memory.max": "3000000000\n",
            "cg/job/memory.current": "1000000000\n",
            "cg/job/step/memory.max": "max\n",
            "cg/job/step/memory.current": "5\n",
        },
    )
    assert memory.cgroup_mb(tmp_path / "cg", tmp_path / "proc") == pytest.approx(2000)
    _files(tmp_path, {"cg/job/step/memory.max": "1500000000\n", "cg/job/step/memory.current": "500000000\n"})
    assert memory.cgroup_mb(tmp_path / "cg", tmp_path / "proc") == pytest.approx(1000)
    _files(tmp_path, {"proc": "0::/elsewhere\n"})  # a namespace that shows only the root
    assert memory.cgroup_mb(tmp_path / "cg", tmp_path / "proc") is None


def test_cgroup_v1_limit_and_its_unlimited_value(tmp_path):
    _files(
        tmp_path,
        {
            "proc": "5:cpu,cpuacct:/x\n4:memory:/job\n0::/\n",
            "cg/memory/memory.limit_in_bytes": "9223372036854771712\n",
            "cg/memory/memory.usage_in_bytes": "551567360\n",
        },
    )
    assert memory.cgroup_mb(tmp_path / "cg", tmp_path / "proc") is None
    _files(
        tmp_path,
        {"cg/memory/job/memory.limit_in_bytes": "2000000000\n", "cg/memory/job/memory.usage_in_bytes": "2500000000\n"},
    )
    assert memory.cgroup_mb(tmp_path / "cg", tmp_path / "proc") == 0  # over its limit: nothing left


def test_available_host_memory_is_the_smallest_limit(monkeypatch):
    monkeypatch.setattr(memory, "meminfo_mb", lambda: 64000.0)
    monkeypatch.setattr(memory, "rlimit_mb", lambda: None)
    monkeypatch.setattr(memory, "cgroup_mb", lambda: None)
    assert memory.available_mb("cpu") == 64000
    monkeypatch.setattr(memory, "cgroup_mb", lambda: 3000.0)
    assert memory.available_mb("cpu") == 3000
    monkeypatch.setattr(memory, "rlimit_mb", lambda: 1200.0)
    assert memory.available_mb("cpu") == 1200


@pytest.mark.heavy
def test_ulimit_v_bounds_the_default_limit():
    """A real RLIMIT_AS in a child process (the test process keeps its own limits)."""
    import resource
    import subprocess
    import sys

    code = "from dfmp2 import memory; print(memory.rlimit_mb(), memory.available_mb('cpu'), memory.meminfo_mb())"
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (4 << 30,) * 2),
    )
    assert p.returncode == 0, p.stderr
    left, avail, meminfo = map(float, p.stdout.split())
    assert 0 < left < (4 << 30) / 1e6 and avail <= min(left, meminfo)


def test_the_default_limit_is_shared_by_the_ranks_of_a_node(monkeypatch):
    """Without --memory, torchrun's ranks on one node divide the host's default limit
    (LOCAL_WORLD_SIZE); a GPU's memory is its rank's own; --memory stays per rank."""
    monkeypatch.setattr(memory, "available_mb", lambda device: 10_000.0)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert memory.default_limit_mb("cpu") == memory.DEFAULT_FRACTION * 10_000.0
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert memory.local_ranks() == 4
    assert memory.default_limit_mb("cpu") == memory.DEFAULT_FRACTION * 10_000.0 / 4
    assert memory.default_limit_mb("cuda") == memory.DEFAULT_FRACTION * 10_000.0
    kw = dict(nao=100, nocc=10, nvir=90, naux=400, itemsize=8, fit_itemsize=8, aux_shell_max=9)
    assert memory.plan_memory(**kw, limit_mb=None, device="cpu").limit_mb == memory.DEFAULT_FRACTION * 10_000.0 / 4
    assert memory.plan_memory(**kw, limit_mb=5000.0, device="cpu").limit_mb == 5000.0
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "x")
    assert memory.local_ranks() == 1
