"""Integral engines (dfmp2.df.integrals): blocks against libcint, the host engine's background thread
(order, clean shutdown when the consumer raises, when the producer raises, on Ctrl-C), engine
choice and its errors, the memory plan's engine terms, and the gpu4pyscf engine's glue through a
fake gpu4pyscf/CuPy on the CPU (the real one needs a CUDA GPU: the cuda channel and
scripts/bench_cuda.py --integrals)."""

import contextlib
import signal
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from pyscf import gto, lib
from pyscf.df import incore

from dfmp2 import linalg, memory
from dfmp2.benchmarks.timing import time_mp2_stage
from dfmp2.cli.main import main
from dfmp2.df import basis, integrals
from dfmp2.drivers import energy as energy_driver
from dfmp2.io import molecule
from dfmp2.io.xyz import read_xyz
from dfmp2.options import INTEGRAL_ENGINES, RunOptions
from dfmp2.scf import driver, pyscf_scf
from dfmp2.scf import jk as scf_jk
from dfmp2.timing import Timer

INPUTS = Path(__file__).resolve().parents[2] / "inputs"


@pytest.fixture(scope="module")
def water():
    mol = gto.M(atom="O 0 0 0; H 0 0.757 0.587; H 0 -0.757 0.587", basis="cc-pvdz", verbose=0)
    return mol, basis.make_auxmol(mol, basis.mp2_auxbasis(mol))


@pytest.fixture(scope="module")
def cpu():
    return linalg.get_backend("cpu")


def libcint_blocks(mol, auxmol, blocks):
    """Today's path, independent of the engines: PySCF's getints (s2ij) per block, unpacked by
    PySCF's unpack_tril on the host."""
    return list(integrals.iter_j3c(mol, auxmol, blocks))


def engine_blocks(engine, auxmol, blocks, dtype=torch.float64):
    out = []
    with engine.blocks(auxmol, blocks, dtype) as stream:
        for p0, p1, packed in stream:
            out.append((p0, p1, integrals.unpack(packed, engine.nao).clone(), packed.clone()))
    return out


# ---------------------------------------------------------------- host engine: the values


@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_host_blocks_bit_identical_to_libcint_in_order(water, cpu, depth):
    mol, auxmol = water
    blocks = integrals.aux_shell_blocks(auxmol, 17)
    assert len(blocks) > 4
    ref = libcint_blocks(mol, auxmol, blocks)
    got = engine_blocks(integrals.HostEngine(mol, cpu, depth=depth), auxmol, blocks)
    assert [(p0, p1) for p0, p1, _, _ in got] == [(p0, p1) for p0, p1, _ in ref]
    assert got[0][0] == 0 and got[-1][1] == auxmol.nao_nr()
    for (_, _, full, packed), (_, _, r) in zip(got, ref):
        assert torch.equal(full, torch.from_numpy(r))  # bit for bit
        assert packed.shape == (r.shape[0], integrals.npair(mol.nao_nr()))


def test_host_engine_runs_in_the_callers_thread_on_a_host_device(water, cpu):
    """On the host CPU the engine starts no thread (depth 0: the producer would share the cores
    with the transform it overlaps); a device that is not the host gets the producer thread."""
    mol, auxmol = water
    eng = integrals.select_engine("auto", mol, cpu)
    assert eng.name == "host" and eng.depth == 0 and eng.describe()["producer_threads"] == 0
    before = threading.active_count()
    with eng.blocks(auxmol, integrals.aux_shell_blocks(auxmol, 17)) as stream:
        next(stream)
        assert threading.active_count() == before
    assert integrals.host_default_depth(linalg.get_backend("trn1", simulate=True)) == integrals.QUEUE_DEPTH


def test_host_engine_on_the_cpu_reuses_one_block_buffer(water, cpu):
    """Depth 0 writes every block into one buffer (a fresh block of hundreds of MB costs its page
    faults each time): the blocks share memory, and each is libcint's while it is current."""
    mol, auxmol = water
    blocks = integrals.aux_shell_blocks(auxmol, 17)
    ref = list(integrals.iter_j3c_packed(mol, auxmol, blocks))
    eng = integrals.HostEngine(mol, cpu, depth=0)
    addresses = set()
    with eng.blocks(auxmol, blocks) as stream:
        for (p0, p1, packed), (q0, q1, r) in zip(stream, ref):
            assert (p0, p1) == (q0, q1) and torch.equal(packed, torch.from_numpy(r))
            addresses.add(packed.data_ptr())
    assert len(ref) > 2 and len(addresses) == 1


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_pia_rows_with_a_workspace_are_the_same_bits(water, cpu, dtype):
    """The transform's rows through reused buffers (``memory.Buffers``; blocks of different sizes, the
    largest not first, so a buffer grows) equal those through fresh tensors, bit for bit; the rows
    returned are new tensors (callers keep them)."""
    mol, auxmol = water
    nao = mol.nao_nr()
    C = torch.from_numpy(np.linalg.qr(np.random.default_rng(1).standard_normal((nao, nao)))[0]).to(dtype)
    co, cv = C[:, :5].contiguous(), C[:, 5:].contiguous()
    work = memory.Buffers(dtype)
    kept = []
    for sizes in ([7, 23, 11], [11]):
        for nb in sizes:
            packed = torch.from_numpy(next(integrals.iter_j3c_packed(mol, auxmol, [(0, 1, 0, 1)]))[2]).to(dtype)
            packed = packed.repeat(nb, 1) * torch.arange(1, nb + 1, dtype=dtype)[:, None]
            got = integrals.pia_rows(packed, nao, co, cv, cpu, work)
            assert torch.equal(got, integrals.pia_rows(packed, nao, co, cv, cpu))
            kept.append((got, got.clone()))
    assert all(torch.equal(a, b) for a, b in kept)  # no later call wrote into an earlier result
    assert work.store["unpacked"].numel() == 23 * nao * nao


def test_any_aux_basis_and_metric(water, cpu):
    """The JK-fit set goes through the same engine (the SCF's integrals); metric = libcint's."""
    mol, _ = water
    jk = basis.make_auxmol(mol, basis.default_auxbasis(mol, "jk"))
    eng = integrals.HostEngine(mol, cpu)
    blocks = integrals.aux_shell_blocks(jk, 40)
    got = engine_blocks(eng, jk, blocks)
    for (_, _, full, _), (_, _, r) in zip(got, libcint_blocks(mol, jk, blocks)):
        assert torch.equal(full, torch.from_numpy(r))
    full = np.concatenate([g[2].numpy() for g in got])  # PySCF's incore (other cintopt)
    np.testing.assert_allclose(full, incore.aux_e2(mol, jk).transpose(2, 0, 1), rtol=0, atol=1e-13)
    assert torch.equal(eng.metric(jk), torch.from_numpy(jk.intor("int2c2e", hermi=1)))
    d = eng.describe()
    assert d["engine"] == "host" and d["blocks"] == len(blocks) and d["compute_s"] > 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_unpack_is_pyscf_unpack_tril(dtype):
    """Both ways (PySCF's C unpack on the host in fp64, torch's gather elsewhere) copy exactly,
    with any leading dimensions, into a reused buffer, and for the SCF's JK factor."""
    nao = 11
    packed = torch.randn(3, integrals.npair(nao), dtype=torch.float64)
    ref = torch.from_numpy(lib.unpack_tril(packed.numpy())).to(dtype)
    p = packed.to(dtype)
    assert torch.equal(integrals.unpack(p, nao), ref)
    gather = torch.index_select(p, 1, integrals.unpack_index(nao, p.device)).reshape(3, nao, nao)
    assert torch.equal(gather, ref)  # the path a GPU takes
    assert torch.equal(integrals.unpack(p[1], nao), ref[1])  # (npair,) -> (nao, nao)
    assert torch.equal(integrals.unpack(p.reshape(3, 1, -1), nao), ref[:, None])
    assert torch.equal(integrals.unpack(p.T.contiguous().T, nao), ref)  # a strided input
    buf = torch.full((5, nao * nao), -1.0, dtype=dtype)
    full = integrals.unpack(p[:2], nao, out=buf[:2])
    assert torch.equal(full, ref[:2]) and full.data_ptr() == buf.data_ptr()
    assert (buf[2:] == -1).all()
    jk = scf_jk.JKFactor(p, nao, linalg.get_backend("cpu"), block=2, metric="cholesky")
    assert torch.equal(jk.unpack(p), ref) and torch.equal(jk.unpack(p[0]), ref[0])


def test_energy_through_thread_equals_same_thread(tmp_path):
    """The thread changes when blocks are computed, not what: the energy equals (bits) a run whose
    engine computes each block in the caller's thread (libcint, PySCF's unpack on the host)."""

    class SameThread(integrals.IntegralEngine):
        name = "same-thread"

        def metric(self, auxmol):
            return self.backend.to_device(integrals.metric_2c(auxmol), torch.float64)

        @contextlib.contextmanager
        def blocks(self, auxmol, shell_blocks, dtype=torch.float64):
            yield (
                (p0, p1, self.backend.to_device(packed, dtype))
                for p0, p1, packed in integrals.iter_j3c_packed(self.mol, auxmol, shell_blocks)
            )

    geom = read_xyz(INPUTS / "water_clusters" / "h2o_02.xyz")
    mol = molecule.build_molecule(geom, "cc-pvdz")
    auxmol = basis.make_auxmol(mol, basis.mp2_auxbasis(mol))
    ref = pyscf_scf.run_rhf(mol, "df")
    be = linalg.get_backend("cpu")
    opts = RunOptions(j3c_block_mb=0.5)  # several blocks
    res = {}
    for eng in (integrals.HostEngine(mol, be, depth=integrals.QUEUE_DEPTH), SameThread(mol, be)):
        plan = energy_driver.stage_plan(
            mol, auxmol, opts, be, "fp64", nocc=ref.channels[0].nocc, nvir=ref.nmo - ref.channels[0].nocc
        )
        got = energy_driver.mp2_stage(
            mol, auxmol, ref, backend=be, precision="fp64", plan=plan, timer=Timer(be), engine=eng
        )
        res[eng.name] = (float.hex(got.e_os), float.hex(got.e_ss))
        assert got.integrals["engine"] == eng.name
    assert plan.aux_block < auxmol.nao_nr()
    assert res["host"] == res["same-thread"]


# ---------------------------------------------------------------- host engine: shutdown


def _producers():
    """The host engine's producer threads alive now: none once a stream is closed (its close
    joins the thread, it does not leave it to finish later)."""
    return [t for t in threading.enumerate() if t.name.startswith("dfmp2-libcint") and t.is_alive()]


def test_consumer_raises_producer_stops(water, cpu):
    mol, auxmol = water
    blocks = integrals.aux_shell_blocks(auxmol, 10)
    with pytest.raises(ValueError, match="consumer"):
        with integrals.HostEngine(mol, cpu, depth=integrals.QUEUE_DEPTH).blocks(auxmol, blocks) as stream:
            for i, _ in enumerate(stream):
                assert len(_producers()) == 1
                if i == 1:
                    raise ValueError("consumer failed")
    assert _producers() == []


def test_producer_raises_same_exception_reaches_caller(water, cpu, monkeypatch):
    mol, auxmol = water
    real = integrals._Libcint.__call__
    raised = []

    def failing(self, s0, s1, out=None):
        if s0 > 0:
            raised.append(OSError(5, "libcint failed on a block"))
            raise raised[-1]
        return real(self, s0, s1, out)

    monkeypatch.setattr(integrals._Libcint, "__call__", failing)
    seen = []
    with pytest.raises(OSError) as info:
        with integrals.HostEngine(mol, cpu, depth=integrals.QUEUE_DEPTH).blocks(
            auxmol, integrals.aux_shell_blocks(auxmol, 10)
        ) as stream:
            for p0, _p1, _ in stream:
                seen.append(p0)
    assert info.value is raised[0] and seen == [0]
    assert _producers() == []


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt for the test's duration, as in an interactive run: pytest
    started as a background job of a shell without job control inherits SIGINT ignored."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_ctrl_c_while_waiting_stops_the_producer(water, cpu, monkeypatch, sigint_raises):
    """A real SIGINT while the caller waits for a slow block: KeyboardInterrupt in the caller at
    once, the producer stops after the block it is on, nothing hangs."""
    mol, auxmol = water
    real = integrals._Libcint.__call__

    def slow(self, s0, s1, out=None):
        time.sleep(0.3)
        return real(self, s0, s1, out)

    monkeypatch.setattr(integrals._Libcint, "__call__", slow)
    main_id = threading.get_ident()
    timer = threading.Timer(0.1, lambda: signal.pthread_kill(main_id, signal.SIGINT))
    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        with integrals.HostEngine(mol, cpu, depth=integrals.QUEUE_DEPTH).blocks(
            auxmol, integrals.aux_shell_blocks(auxmol, 10)
        ) as stream:
            timer.start()
            for _ in stream:
                pass
    assert time.perf_counter() - t0 < 3
    assert _producers() == []
    timer.join()


def test_keyboard_interrupt_in_the_loop_stops_the_producer(water, cpu):
    mol, auxmol = water
    with pytest.raises(KeyboardInterrupt):
        with integrals.HostEngine(mol, cpu, depth=1).blocks(auxmol, integrals.aux_shell_blocks(auxmol, 10)) as stream:
            for _ in stream:
                raise KeyboardInterrupt
    assert _producers() == []


# ---------------------------------------------------------------- choice and errors


def test_auto_is_host_on_cpu_and_recorded(tmp_path):
    res = CliRunner().invoke(main, ["run", str(INPUTS / "water.xyz"), "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    assert "integrals: host (auto: device 'cpu' is not a CUDA GPU)" in res.output
    import json

    ran = json.loads((tmp_path / "r.json").read_text())["ran"]["integrals"]
    assert ran["engine"] == "host" and ran["why"].startswith("auto: device 'cpu'") and ran["blocks"] >= 1


def test_cli_choices_are_the_engines():
    assert INTEGRAL_ENGINES == integrals.ENGINES


def test_explicit_gpu4pyscf_fails_before_the_work(monkeypatch):
    monkeypatch.setattr(pyscf_scf, "run_rhf", lambda *a, **k: pytest.fail("the SCF ran"))
    monkeypatch.setattr(pyscf_scf, "run_uhf", lambda *a, **k: pytest.fail("the SCF ran"))
    monkeypatch.setattr(driver, "run_scf", lambda *a, **k: pytest.fail("the SCF ran"))
    res = CliRunner().invoke(main, ["run", str(INPUTS / "water.xyz"), "--integrals", "gpu4pyscf"])
    assert res.exit_code == 2, res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in res.output
    assert "gpu4pyscf" in errors[0] and "not a CUDA GPU" in errors[0] and "--integrals host" in errors[0]
    assert 'pip install -e ".[cuda13]"' in errors[0]


class FakeCudaBackend:
    """A CPU backend whose capabilities say CUDA memory (the choice only asks the capabilities)."""

    def __init__(self):
        self._be = linalg.get_backend("cpu")
        self.name, self.device = "cuda", self._be.device
        self.caps = linalg.device_capabilities("cuda")

    def __getattr__(self, k):
        return getattr(self._be, k)


def test_not_importable_names_the_install_command(water, monkeypatch):
    monkeypatch.setitem(sys.modules, "gpu4pyscf", None)  # import fails
    mol, _ = water
    with pytest.raises(integrals.EngineUnavailableError) as info:
        integrals.select_engine("gpu4pyscf", mol, FakeCudaBackend())
    assert 'pip install -e ".[cuda13]"' in str(info.value) and "not importable" in str(info.value)
    eng = integrals.select_engine("auto", mol, FakeCudaBackend())
    assert eng.name == "host" and "gpu4pyscf not usable" in eng.why
    with pytest.raises(ValueError, match="unknown integral engine"):
        integrals.select_engine("libint", mol, FakeCudaBackend())


# ---------------------------------------------------------------- memory plan


def test_memory_plan_knows_the_engines():
    kw = dict(nao=200, nocc=20, nvir=180, naux=800, itemsize=8, fit_itemsize=8, limit_mb=1e6, aux_shell_max=9)
    legacy = memory.plan_memory(**kw)  # host engine by default
    cpu2 = memory.plan_memory(**kw, queue_depth=2)
    cpu4 = memory.plan_memory(**kw, queue_depth=4)
    gpu_host = memory.plan_memory(**kw, device="cuda")
    gpu_g4p = memory.plan_memory(**kw, device="cuda", engine="gpu4pyscf")
    assert len({p.aux_block for p in (legacy, cpu2, cpu4, gpu_host, gpu_g4p)}) == 1  # same blocks, same bits
    a, pair = cpu2.aux_block, 200 * 201 // 2
    # on the CPU the ring is in the plan; two more packed buffers add 2 * a * npair * 8 bytes
    assert cpu4.stages_mb["transform"] - cpu2.stages_mb["transform"] == pytest.approx(2 * a * pair * 8 / 1e6)
    assert cpu2.integrals == {"engine": "host", "queue_depth": 2, "host_mb": 0.0}
    # on a GPU the pinned ring is host memory, outside the GPU's plan
    assert gpu_host.integrals["host_mb"] == pytest.approx(2 * a * pair * 8 / 1e6)
    assert gpu_g4p.integrals == {"engine": "gpu4pyscf", "queue_depth": 0, "host_mb": 0.0}
    assert gpu_g4p.stages_mb["transform"] > gpu_host.stages_mb["transform"]


# ---------------------------------------------------------------- DLPack and the gpu4pyscf glue


def test_dlpack_shares_memory_on_the_cpu():
    a = np.arange(6.0).reshape(2, 3)
    t = integrals.to_torch(a, "cpu")
    a[1, 2] = 42.0
    assert t[1, 2].item() == 42.0 and t.dtype == torch.float64
    with pytest.raises(ValueError, match="expected cuda"):
        integrals.to_torch(a, "cuda")


def fake_gpu4pyscf(monkeypatch, shuffle_seed=0, with_compressed=True):
    """CuPy and gpu4pyscf.df.int3c2e_bdiv stand-ins on numpy, computing with PySCF, and returning
    what gpu4pyscf's compressed_aux_e2 returns: (npair_nz, naux) over the shell pairs that survive
    screening, rows/cols in PySCF's AO order, in gpu4pyscf's order (sorted shells, pairs of
    different shells in either orientation, pairs within a shell in both)."""
    rng = np.random.default_rng(shuffle_seed)
    calls = {"int2c2e": 0, "compressed": 0}

    def int2c2e(auxmol):
        calls["int2c2e"] += 1
        return auxmol.intor("int2c2e")

    def compressed_aux_e2(mol, auxmol):
        calls["compressed"] += 1
        full = incore.aux_e2(mol, auxmol)  # (nao, nao, naux)
        loc = mol.ao_loc_nr()
        rows, cols = [], []
        for i in range(mol.nbas):
            for j in range(i + 1):
                ii, jj = np.arange(loc[i], loc[i + 1]), np.arange(loc[j], loc[j + 1])
                if abs(full[loc[i] : loc[i + 1], loc[j] : loc[j + 1]]).max() < 1e-14:
                    continue  # screened out
                r, c = np.meshgrid(ii, jj, indexing="ij")
                if i != j and rng.random() < 0.5:
                    r, c = c, r
                rows.append(r.ravel())
                cols.append(c.ravel())
        rows, cols = np.concatenate(rows), np.concatenate(cols)
        perm = rng.permutation(len(rows))
        rows, cols = rows[perm], cols[perm]
        return np.ascontiguousarray(full[rows, cols]), rows, cols

    cupy = types.ModuleType("cupy")
    cupy.__version__ = "fake"
    cupy.ascontiguousarray = np.ascontiguousarray
    cupy.cuda = types.SimpleNamespace(
        Device=lambda i: contextlib.nullcontext(), ExternalStream=lambda ptr: contextlib.nullcontext()
    )
    g4p = types.ModuleType("gpu4pyscf")
    g4p.__version__ = "fake"
    df = types.ModuleType("gpu4pyscf.df")
    bdiv = types.ModuleType("gpu4pyscf.df.int3c2e_bdiv")
    bdiv.int2c2e = int2c2e
    if with_compressed:
        bdiv.compressed_aux_e2 = compressed_aux_e2
    df.int3c2e_bdiv = bdiv
    g4p.df = df
    for name, mod in (("cupy", cupy), ("gpu4pyscf", g4p), ("gpu4pyscf.df", df), ("gpu4pyscf.df.int3c2e_bdiv", bdiv)):
        monkeypatch.setitem(sys.modules, name, mod)
    # CuPy on torch's current CUDA stream is the real engine's; a CPU tensor has no stream
    monkeypatch.setattr(integrals.Gpu4pyscfEngine, "_stream", lambda self: contextlib.nullcontext())
    return calls


def test_gpu4pyscf_glue_blocks_match_libcint(water, monkeypatch):
    calls = fake_gpu4pyscf(monkeypatch)
    mol, auxmol = water
    eng = integrals.select_engine("auto", mol, FakeCudaBackend())
    assert eng.name == "gpu4pyscf" and eng.why.startswith("auto: gpu4pyscf importable")
    blocks = integrals.aux_shell_blocks(auxmol, 23)
    ref = libcint_blocks(mol, auxmol, blocks)
    got = engine_blocks(eng, auxmol, blocks)
    assert [(p0, p1) for p0, p1, _, _ in got] == [(p0, p1) for p0, p1, _ in ref]
    for (_, _, full, _), (_, _, r) in zip(got, ref):
        r = torch.from_numpy(r)
        assert (full - r).abs().max() <= 1e-12 * r.abs().max()
    assert calls["compressed"] == len(blocks)
    assert torch.allclose(eng.metric(auxmol), torch.from_numpy(auxmol.intor("int2c2e")), rtol=0, atol=1e-12)
    assert "gpu4pyscf fake" in eng.describe()["library"]
    assert eng.block_mb(512.0) == integrals.GPU4PYSCF_BLOCK_MB  # fewer, larger blocks
    assert next(b for *_, b in engine_blocks(eng, auxmol, blocks, torch.float32)).dtype == torch.float32


def test_gpu4pyscf_glue_energy_matches_host(monkeypatch):
    fake_gpu4pyscf(monkeypatch, shuffle_seed=3)
    geom = read_xyz(INPUTS / "water.xyz")
    mol = molecule.build_molecule(geom, "cc-pvdz")
    auxmol = basis.make_auxmol(mol, basis.mp2_auxbasis(mol))
    ref = pyscf_scf.run_rhf(mol, "df")
    be = linalg.get_backend("cpu")
    e = {}
    for eng in (integrals.HostEngine(mol, be), integrals.Gpu4pyscfEngine(mol, FakeCudaBackend())):
        plan = energy_driver.stage_plan(
            mol,
            auxmol,
            RunOptions(j3c_block_mb=0.3),
            be,
            "fp64",
            nocc=ref.channels[0].nocc,
            nvir=ref.nmo - ref.channels[0].nocc,
            engine=eng,
        )
        got = energy_driver.mp2_stage(
            mol, auxmol, ref, backend=be, precision="fp64", plan=plan, timer=Timer(be), engine=eng
        )
        e[eng.name] = got.e_os + got.e_ss
        assert got.integrals["engine"] == eng.name
    assert abs(e["gpu4pyscf"] - e["host"]) < 1e-12


def test_jk_factor_engine_auto_keeps_host_explicit_is_shared(water, monkeypatch):
    """'auto' that picks gpu4pyscf for the MP2 integrals keeps libcint for the JK factor (its many
    per-group calls; select_jk_engine's docstring); an explicit engine runs both; on a CPU auto is
    host for both, one engine."""
    fake_gpu4pyscf(monkeypatch)
    mol, _ = water
    fake = FakeCudaBackend()
    eng = integrals.select_engine("auto", mol, fake)
    jk_eng = integrals.select_jk_engine("auto", eng, mol, fake)
    assert (eng.name, jk_eng.name) == ("gpu4pyscf", "host") and "JK factor" in jk_eng.why
    explicit = integrals.select_engine("gpu4pyscf", mol, fake)
    assert integrals.select_jk_engine("gpu4pyscf", explicit, mol, fake) is explicit
    cpu = linalg.get_backend("cpu")
    for choice in ("auto", "host"):
        host = integrals.select_engine(choice, mol, cpu)
        assert integrals.select_jk_engine(choice, host, mol, cpu) is host


def test_jk_factor_through_gpu4pyscf_one_call_per_group_same_bits(water, monkeypatch):
    """The JK factor asks the gpu4pyscf engine for one block per fixed fit group (its block size,
    not the host's 64 MB: one call each pays gpu4pyscf's set-up), and the factor is the host
    engine's (the fake's values are libcint's through PySCF's incore.aux_e2: the same to 1e-13)."""
    from dfmp2.scf import jk_dist

    calls = fake_gpu4pyscf(monkeypatch, shuffle_seed=5)
    mol, _ = water
    aux = basis.make_auxmol(mol, basis.default_auxbasis(mol, "jk"))
    cpu = linalg.get_backend("cpu")
    host, _ = scf_jk.build_jk_factor(mol, aux, cpu, torch.float64, Timer(cpu), block_mb=0.05)
    eng = integrals.Gpu4pyscfEngine(mol, FakeCudaBackend())
    got, _ = scf_jk.build_jk_factor(mol, aux, cpu, torch.float64, Timer(cpu), block_mb=0.05, engine=eng)
    assert calls["compressed"] == len(jk_dist.fit_groups(aux)) == eng.stats["blocks"]
    assert host.B.shape == got.B.shape and (host.B - got.B).abs().max() <= 1e-12 * host.B.abs().max()


def test_gpu4pyscf_too_old_names_what_is_missing(water, monkeypatch):
    fake_gpu4pyscf(monkeypatch, with_compressed=False)
    with pytest.raises(integrals.EngineUnavailableError, match=r"lacks int3c2e_bdiv.compressed_aux_e2"):
        integrals.select_engine("gpu4pyscf", water[0], FakeCudaBackend())


def test_aux_subset_is_those_shells(water):
    mol, auxmol = water
    s0, s1, p0, p1 = integrals.aux_shell_blocks(auxmol, 20)[2]
    sub = integrals._aux_subset(auxmol, s0, s1)
    assert sub.nao_nr() == p1 - p0 and auxmol.nbas > s1 - s0
    np.testing.assert_allclose(incore.aux_e2(mol, sub), incore.aux_e2(mol, auxmol)[:, :, p0:p1], rtol=0, atol=1e-13)


def test_cuda_protocol_refills_a_buffer_only_after_its_copy(water, monkeypatch):
    """With a GPU the copy from a pinned buffer is asynchronous: the producer may write into a
    buffer again only after the event that ends its last copy (the backend's last_transfer) has
    been waited for. Checked with a stand-in backend that records those events."""
    mol, auxmol = water
    real_slot, real_call = integrals._Slot, integrals._Libcint.__call__
    monkeypatch.setattr(integrals, "_Slot", lambda numel, pinned: real_slot(numel, False))  # no CUDA here
    copies = []  # (buffer address, event) per transfer

    class Event:
        done = False

        def synchronize(self):
            self.done = True

    class Backend(FakeCudaBackend):
        def to_device(self, x, dtype=None):
            self.last_transfer = Event()
            copies.append((x.data_ptr(), self.last_transfer))
            return self._be.to_device(x, dtype).clone()

    def checked(self, s0, s1, out=None):
        if out is not None:  # the engine's ring (None: the reference below)
            assert all(ev.done for ptr, ev in copies if ptr == out.ctypes.data), "buffer refilled during its copy"
        return real_call(self, s0, s1, out)

    monkeypatch.setattr(integrals._Libcint, "__call__", checked)
    eng = integrals.HostEngine(mol, Backend(), depth=2)
    assert eng.pinned
    blocks = integrals.aux_shell_blocks(auxmol, 10)
    got = engine_blocks(eng, auxmol, blocks)
    assert len(got) == len(blocks) > 2 and len({p for p, _ in copies}) == 2
    for (_, _, full, _), (_, _, r) in zip(got, libcint_blocks(mol, auxmol, blocks)):
        assert torch.equal(full, torch.from_numpy(r))


# ---------------------------------------------------------------- on a GPU (cuda channel)


@pytest.mark.cuda
def test_cuda_host_engine_pinned_blocks_bit_identical(water):
    mol, auxmol = water
    eng = integrals.HostEngine(mol, linalg.get_backend("cuda"))
    assert eng.pinned
    blocks = integrals.aux_shell_blocks(auxmol, 17)
    for (p0, p1, full, _), (q0, q1, r) in zip(engine_blocks(eng, auxmol, blocks), libcint_blocks(mol, auxmol, blocks)):
        assert (p0, p1) == (q0, q1) and full.is_cuda and torch.equal(full.cpu(), torch.from_numpy(r))


@pytest.mark.cuda
def test_cuda_gpu4pyscf_engine_against_libcint_and_host():
    pytest.importorskip("gpu4pyscf", reason="cuda channel: gpu4pyscf is not installed (pip install -e '.[cuda13]')")
    geom = read_xyz(INPUTS / "water_clusters" / "h2o_02.xyz")
    mol = molecule.build_molecule(geom, "cc-pvdz")
    auxmol = basis.make_auxmol(mol, basis.mp2_auxbasis(mol))
    be = linalg.get_backend("cuda")
    eng = integrals.select_engine("auto", mol, be)
    assert eng.name == "gpu4pyscf"
    blocks = integrals.aux_shell_blocks(auxmol, 40)
    for (_, _, full, _), (_, _, r) in zip(engine_blocks(eng, auxmol, blocks), libcint_blocks(mol, auxmol, blocks)):
        r = torch.from_numpy(r)
        assert (full.cpu() - r).abs().max() <= 1e-12 * r.abs().max()
    j2c = torch.from_numpy(auxmol.intor("int2c2e"))
    assert (eng.metric(auxmol).cpu() - j2c).abs().max() <= 1e-12 * j2c.abs().max()
    ref = pyscf_scf.run_rhf(mol, "df")
    e = {}
    for engine in (integrals.HostEngine(mol, be), eng):
        _, e_os, e_ss, _, ran = time_mp2_stage_with(mol, auxmol, ref, be, engine)
        e[ran["integrals"]["engine"]] = e_os + e_ss
    assert abs(e["gpu4pyscf"] - e["host"]) < 1e-10


def time_mp2_stage_with(mol, auxmol, ref, backend, engine):
    return time_mp2_stage(mol, auxmol, ref, RunOptions(device=backend.name), backend, engine=engine)
