"""The JK factor's fixed groups (dfmp2.scf.jk_dist): the same operations in every rank count.

The runs over 2, 3 and 4 gloo ranks are in tests/system/test_distributed.py; here, in one process,
what they rest on: the groups and their owners, the rows' alignment, the fit against one TRSM, and
a rank's J/K partials continuing another rank's running sum to the one-process bits.
"""

import pytest
import torch
from pyscf import gto

from dfmp2 import linalg
from dfmp2.df import basis
from dfmp2.distributed import World
from dfmp2.scf import jk, jk_dist
from dfmp2.timing import Timer

WATER = "O 0 0 0.117; H 0 0.757 -0.467; H 0 -0.757 -0.467"


@pytest.fixture(scope="module")
def water():
    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    return mol, basis.make_auxmol(mol, basis.default_auxbasis(mol, "jk"))


def test_groups_and_owners(water):
    _, aux = water
    groups = jk_dist.fit_groups(aux)
    loc = aux.ao_loc_nr()
    assert groups[0][2] == 0 and groups[-1][3] == aux.nao_nr() and len(groups) >= 8
    for (s0, s1, p0, p1), nxt in zip(groups, groups[1:] + [None]):
        assert (loc[s0], loc[s1]) == (p0, p1) and (nxt is None or nxt[0] == s1)  # whole shells, contiguous
    biggest = max(g[3] - g[2] for g in groups)
    for size in (1, 2, 3, 4, 5):
        own = jk_dist.owners(groups, size)
        assert own == sorted(own) and own[0] == 0 and set(own) <= set(range(size))  # contiguous ranges
        rows = [sum(g[3] - g[2] for g, o in zip(groups, own) if o == r) for r in range(size)]
        assert max(rows) <= -(-aux.nao_nr() // size) + biggest
        world = World(rank=0, size=size)
        assert jk_dist.planned_rows(aux, world, True) >= max(rows)
    assert jk_dist.planned_rows(aux, World(rank=0, size=3), False) == aux.nao_nr()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_aligned_rows(dtype):
    per = jk_dist.ALIGN_BYTES // torch.empty((), dtype=dtype).element_size()
    for row0, width in [(0, 7), (3, 7), (5, 300), (11, 361)]:
        t = jk_dist.aligned_rows(4, width, row0, dtype, "cpu")
        assert t.shape == (4, width) and t.is_contiguous()
        assert (t.data_ptr() // t.element_size()) % per == (row0 * width) % per


def test_aligned_pair_views_share_one_buffer_each_row_aligned():
    """The mixed SCF's shared buffer (jk.deferred_unpacked): an fp64 and an fp32 (rows, width) view
    of one buffer, the fp32 one over its first half, each row where ``aligned_rows`` puts it."""
    for row0, width in [(0, 7), (3, 7), (5, 300), (11, 361)]:
        u64, u32 = jk_dist.aligned_pair(4, width, row0, "cpu")
        assert u64.shape == u32.shape == (4, width) and u64.dtype == torch.float64 and u32.dtype == torch.float32
        assert u64.untyped_storage().data_ptr() == u32.untyped_storage().data_ptr()
        assert (u64.data_ptr() // 8) % (jk_dist.ALIGN_BYTES // 8) == (row0 * width) % (jk_dist.ALIGN_BYTES // 8)
        assert (u32.data_ptr() // 4) % (jk_dist.ALIGN_BYTES // 4) == (row0 * width) % (jk_dist.ALIGN_BYTES // 4)
        end = u64.untyped_storage().data_ptr() + u64.untyped_storage().nbytes()
        assert u64.data_ptr() + u64.numel() * 8 <= end and u32.data_ptr() + u32.numel() * 4 <= end
        assert u32.data_ptr() < u64.data_ptr() + u64.numel() * 4  # the fp32 view: the first half


def test_fit_is_the_trsm():
    g = torch.Generator().manual_seed(3)
    n, w = 23, 17
    A = torch.randn((n, n), generator=g, dtype=torch.float64)
    L = torch.linalg.cholesky(A @ A.T + n * torch.eye(n, dtype=torch.float64))
    X = torch.randn((n, w), generator=g, dtype=torch.float64)
    groups = [(0, 0, 0, 5), (0, 0, 5, 6), (0, 0, 6, 14), (0, 0, 14, 23)]
    cpu = linalg.get_backend("cpu")
    fit = jk_dist.Fit(L, groups, [0] * 4, 0, World(), cpu)
    ref = torch.linalg.solve_triangular(L, X, upper=False)
    assert torch.allclose(fit.forward(X.clone()), ref, rtol=0, atol=1e-12)
    assert torch.allclose(fit.apply(X.clone()), L @ X, rtol=0, atol=1e-12)


class _Recorder:
    """A world whose ordered sum records the parts (and adds them as one process would)."""

    def ordered_sum(self, parts, shape, dtype, device, stage):
        self.parts = [p.clone() for p in parts]
        return World().ordered_sum(iter([p.clone() for p in self.parts]), shape, dtype, device, stage)


@pytest.mark.parametrize("layout", ["packed", "unpacked", "fp32"])
def test_rank_partials_continue_the_running_sum_bitwise(water, layout):
    """A 'rank' holding groups [a, G) of the factor (its rows copied to an aligned buffer of its
    own) makes the partials of one process bit for bit; added to the running sum of groups [0, a)
    they give the one-process J and K exactly. 'fp32': a mixed SCF's fp32 copy (its K by one GEMM
    per P on the CPU)."""
    mol, aux = water
    cpu = linalg.get_backend("cpu")
    built = "packed" if layout == "fp32" else layout
    full, _ = jk.build_jk_factor(mol, aux, cpu, torch.float64, Timer(cpu), layout=built)
    if layout == "fp32":
        full = jk.fp32_unpacked(full)
    groups = jk_dist.fit_groups(aux)
    assert len(full.groups) == len(groups) and full.groups[0] == (0, groups[0][3])
    a = len(groups) // 3
    r0 = groups[a][2]
    rows = full.B[r0:].reshape(full.naux - r0, -1)
    mine = jk_dist.aligned_rows(rows.shape[0], rows.shape[1], r0, full.B.dtype, "cpu").copy_(rows)
    local = [(p0 - r0, p1 - r0) for p0, p1 in full.groups[a:]]
    part = jk.JKFactor(mine.view((-1,) + full.B.shape[1:]), full.nao, cpu, full.block, full.metric, None, local, r0)
    C = torch.randn((mol.nao_nr(), 5), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    D = C @ C.T
    if layout != "packed":
        calls = [lambda f, w: _jk_both(f, w, C)]
    else:
        calls = [lambda f, w: f.coulomb(D, world=w), lambda f, w: f.exchanges([(C, None), (C[:, :3], 1)], world=w)]
    for call in calls:
        one, rest = _Recorder(), _Recorder()
        want = call(full, one)
        call(part, rest)
        assert len(rest.parts) == len(groups) - a
        for p, q in zip(one.parts[a:], rest.parts):
            assert torch.equal(p, q)
        total = one.parts[0].clone()
        for p in one.parts[1:a] + rest.parts:
            total += p
        if total.dim() == 1:  # J over the packed factor
            got = full.unpack(total)
        elif layout != "packed":  # J, then each K's lower triangle
            got = torch.cat([total[:1], torch.stack([jk._mirror(k) for k in total[1:]])])
        else:
            got = torch.stack([jk._mirror(k) for k in total])
        assert torch.equal(got, want)


def _jk_both(f, w, C):
    J, K = f.jk([(C, None), (C[:, :3], 1)], world=w)
    return torch.cat([J[None], K])


RANK_SCRIPT = """
import sys, torch
from dfmp2 import distributed, linalg
from dfmp2.scf import jk_dist
kind, out = sys.argv[1], sys.argv[2]
world = distributed.join("cpu")
g = torch.Generator().manual_seed(7)
n, w = 41, 29
A = torch.randn((n, n), generator=g, dtype=torch.float64)
M = torch.linalg.cholesky(A @ A.T + n * torch.eye(n, dtype=torch.float64))
if kind == "eigh":
    M = M @ M.T
X = torch.randn((n, w), generator=g, dtype=torch.float64)
parts = torch.randn((6, 3, 5), generator=g, dtype=torch.float64)
groups = [(0, 0, p0, p1) for p0, p1 in [(0, 4), (4, 11), (11, 12), (12, 20), (20, 33), (33, 41)]]
own = jk_dist.owners(groups, world.size)
mine = [k for k in range(len(groups)) if own[k] == world.rank]
row0 = groups[mine[0]][2] if mine else 0
rows = slice(row0, groups[mine[-1]][3] if mine else 0)
Xr = jk_dist.aligned_rows(rows.stop - rows.start, w, row0, torch.float64, "cpu").copy_(X[rows])
fit = jk_dist.Fit(M, groups, own, row0, world, linalg.get_backend("cpu"))
B = fit.forward(Xr) if kind == "cholesky" else fit.apply(Xr)
S = world.ordered_sum(iter(parts[mine]), (3, 5), torch.float64, "cpu", "scf")
torch.save({"rows": (rows.start, rows.stop), "B": B.clone(), "S": S}, f"{out}.{world.rank}")
world.close()
"""


@pytest.mark.slow  # 10 processes a metric, each importing dfmp2: minutes on 2 loaded cores
@pytest.mark.parametrize("kind", ["cholesky", "eigh"])
def test_fit_and_ordered_sum_over_ranks_bitwise(tmp_path, kind):
    """The fit (both metrics) and the ordered sum on 1, 2, 3 and 4 gloo ranks (started as a Slurm
    launcher would): every rank's rows and every rank's sum are one process's bit for bit."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    got = {}
    for size in (1, 2, 3, 4):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        procs = []
        for r in range(size):
            env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1", RANK=str(r), WORLD_SIZE=str(size))
            env.update(LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DFMP2_DIST_TIMEOUT_S="60")
            cmd = [sys.executable, str(script), kind, str(tmp_path / f"out{size}")]
            procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-2000:]
        outs = [torch.load(tmp_path / f"out{size}.{r}") for r in range(size)]
        B = torch.cat([o["B"] for o in outs if o["rows"][1] > o["rows"][0]])
        assert [o["rows"] for o in outs if o["rows"][1] > o["rows"][0]][-1][1] == B.shape[0] == 41
        got[size] = (B, [o["S"] for o in outs])
    B1, (S1,) = got[1]
    for size, (B, sums) in got.items():
        assert torch.equal(B, B1), size
        assert all(torch.equal(S, S1) for S in sums), size
