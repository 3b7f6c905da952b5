"""``dfmp2 frequencies`` of linear molecules: 3N - 5 modes (five rigid-body modes projected out, the
linear rotor's thermochemistry), also for a geometry linear only to an optimisation's convergence.
References are independent of the code under test: ASE's ``IdealGasThermo(geometry='linear')`` and
PySCF's ``thermo`` on the same Hessian for the thermochemistry; ASE's ``Vibrations`` (its own finite
differences, no projection) over our ASE calculator for the DF-MP2 frequencies (heavy).

The fast tests differentiate a model potential (``model``: bond springs and a bending term for each
inner atom, invariant under translation and rotation, gradients by torch's autograd) in place of the
DF-MP2 gradients."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from pyscf.hessian import thermo as pyscf_thermo

from dfmp2.cli.main import main
from dfmp2.io.xyz import Geometry, read_xyz
from dfmp2.options import RunOptions
from dfmp2.workflows import frequencies as F

pytestmark = pytest.mark.usefixtures("one_torch_thread")

INPUTS = Path(__file__).resolve().parents[2] / "inputs"
HF_XYZ = INPUTS / "hydrogen_fluoride.xyz"
# ASE's g2 geometries (ase.build.molecule), along z, Å
CO2 = (("C", "O", "O"), [[0, 0, 0], [0, 0, 1.178658], [0, 0, -1.178658]])
HCN = (("C", "N", "H"), [[0, 0, -0.511747], [0, 0, 0.664461], [0, 0, -1.580746]])
HF = (("F", "H"), [[0, 0, 0.093389], [0, 0, -0.840502]])
OPTIONS = RunOptions(basis="sto-3g")


def geometry(case, shift=None) -> Geometry:
    x = np.array(case[1], dtype=np.float64)
    if shift is not None:
        x = x + np.asarray(shift)
    return Geometry(tuple(case[0]), x, charge=0, multiplicity=1)


def model(geom: Geometry, k_bond: float = 0.5, k_bend: float = 0.15):
    """A stand-in for the gradient evaluations: E = Σ ½ k_bond (r_ij - r_ij⁰)² over every pair, plus
    Σ ½ k_bend |u_ba + u_bc|² over each inner atom b of the chain (u: unit vectors to the neighbours
    along the line; zero when straight), both at the reference ``geom``: E and its gradient
    (Eh, Eh/bohr) at the displaced geometry, no dipole."""
    x0 = torch.tensor(np.asarray(geom.coords_angstrom) / F.BOHR)
    order = np.argsort(x0[:, 2].numpy())  # the chain along z
    pairs = [(i, j) for i in range(geom.natm) for j in range(i)]
    r0 = {p: torch.linalg.norm(x0[p[0]] - x0[p[1]]) for p in pairs}

    def energy(x):
        e = sum(0.5 * k_bond * (torch.linalg.norm(x[i] - x[j]) - r0[(i, j)]) ** 2 for i, j in pairs)
        for a, b, c in zip(order, order[1:], order[2:]):
            u, v = x[a] - x[b], x[c] - x[b]
            e = e + 0.5 * k_bend * torch.sum((u / torch.linalg.norm(u) + v / torch.linalg.norm(v)) ** 2)
        return e

    def evaluate(g, world):
        x = torch.tensor(np.asarray(g.coords_angstrom) / F.BOHR, requires_grad=True)
        e = energy(x)
        (grad,) = torch.autograd.grad(e, x)
        return [float(e.detach()), *grad.numpy().ravel(), math.nan, math.nan, math.nan], None

    return evaluate


@pytest.mark.parametrize(
    "case,group,sigma", [(HF, "Coov", 1), (CO2, "Dooh", 2), (HCN, "Coov", 1)], ids=["HF", "CO2", "HCN"]
)
def test_a_linear_molecule_has_3n_minus_5_modes(case, group, sigma):
    """Refused before; now five rigid-body modes projected out (zero to rounding), 3N - 5 real
    vibrations, the point group C∞v or D∞h and its σ (1 or 2)."""
    geom = geometry(case)
    res = F.frequencies(geom, OPTIONS, ir=False, evaluate=model(geom))
    assert res.linear and res.frequencies.shape == (3 * geom.natm - 5,)
    assert (res.frequencies > 100).all() and res.imaginary == 0
    assert res.modes.shape == (3 * geom.natm - 5, geom.natm, 3)
    assert res.zero_modes["projected"].shape == res.zero_modes["unprojected"].shape == (5,)
    assert np.abs(res.zero_modes["projected"]).max() < 1.0
    assert res.point_group == group and res.thermo["sym_number"][0] == sigma
    if geom.natm == 3:  # the two bends degenerate
        assert res.frequencies[0] == pytest.approx(res.frequencies[1], abs=1e-6)


LINEAR_INPUTS = {"acetylene", "carbon_monoxide", "dinitrogen", "hydrogen_chloride", "hydrogen_cyanide"}
LINEAR_INPUTS |= {"hydrogen_fluoride"}


@pytest.mark.parametrize("path", sorted(INPUTS.glob("*.xyz")), ids=lambda p: p.stem)
def test_the_shipped_molecules_linear_or_not(path):
    """The shipped linear molecules (diatomics, HCN, acetylene) are linear; none of the others."""
    mol = F.io_molecule.build_molecule(read_xyz(path), "sto-3g")
    assert F.analysis_molecule(mol)[1] == (path.stem in LINEAR_INPUTS)


def test_a_geometry_linear_to_convergence_keeps_both_bends():
    """CO2 with its carbon 0.002 bohr off the line (an optimiser's convergence): PySCF's own test of
    linearity (a moment below 1e-9 amu·bohr²) calls it nonlinear, and its projection of a third
    rotation takes out a bend (2 modes left, the finding); ours: linear, both bends (within
    0.5 cm⁻¹ of the straight molecule's) and the two stretches."""
    straight = geometry(CO2)
    bent = geometry(CO2, shift=[[0.002 * F.BOHR, 0, 0], [0, 0, 0], [0, 0, 0]])
    res = F.frequencies(bent, OPTIONS, ir=False, evaluate=model(straight))
    ref = F.frequencies(straight, OPTIONS, ir=False, evaluate=model(straight))
    mol = F.io_molecule.build_molecule(bent, "sto-3g")
    theirs = np.asarray(F.harmonic(mol, res.hessian)["freq_wavenumber"])
    assert theirs.shape == (3,)  # PySCF at the bent geometry: 3N - 6, a bend lost
    assert res.linear and res.frequencies.shape == (4,)
    assert np.allclose(res.frequencies, ref.frequencies, rtol=0, atol=0.5)
    assert res.point_group == "Dooh" and res.thermo["sym_number"][0] == 2
    off = geometry(CO2, shift=[[0.02 * F.BOHR, 0, 0], [0, 0, 0], [0, 0, 0]])  # 0.02 bohr: bent
    far = F.frequencies(off, OPTIONS, ir=False, evaluate=model(straight))
    assert not far.linear and far.frequencies.shape == (3,)


def test_thermochemistry_of_a_linear_molecule_against_ase_and_pyscf():
    """CO2 (D∞h, σ 2): S, H - E0 and G - E0 equal ASE's IdealGasThermo(geometry='linear') on our
    frequencies, with PySCF's masses (its rotational terms: RT and R ln(8π²IkT/σh²) + R) to 1e-7
    relative; and every quantity equals PySCF's own harmonic_analysis and thermo on the same
    Hessian (it detects D∞h itself on the straight molecule) to 1e-12."""
    from types import SimpleNamespace

    from ase import Atoms
    from ase.thermochemistry import IdealGasThermo
    from ase.units import Hartree, invcm
    from ase.units import kB as kB_eV

    geom = geometry(CO2)
    res = F.frequencies(geom, OPTIONS, ir=False, evaluate=model(geom))
    th = {k: float(np.asarray(v[0]).ravel()[0]) for k, v in res.thermo.items() if k != "rot_const"}
    mol = F.io_molecule.build_molecule(geom, "sto-3g")
    atoms = Atoms(geom.symbols, positions=geom.coords_angstrom, masses=mol.atom_mass_list(isotope_avg=True))
    ase = IdealGasThermo(res.frequencies * invcm, "linear", atoms=atoms, symmetrynumber=2, spin=0)
    T, p = 298.15, 101325.0
    e0 = th["E0"]
    assert th["S_tot"] * Hartree == pytest.approx(ase.get_entropy(T, p, verbose=False), rel=1e-7)
    assert (th["H_tot"] - e0) * Hartree == pytest.approx(ase.get_enthalpy(T, verbose=False), rel=1e-7)
    assert (th["G_tot"] - e0) * Hartree == pytest.approx(ase.get_gibbs_energy(T, p, verbose=False), rel=1e-7)
    assert th["H_rot"] * Hartree == pytest.approx(kB_eV * T, rel=1e-7)  # RT, not 3/2 RT
    natm = geom.natm
    ha = pyscf_thermo.harmonic_analysis(mol, res.hessian.reshape(natm, 3, natm, 3).transpose(0, 2, 1, 3))
    assert np.allclose(ha["freq_wavenumber"].real, res.frequencies, rtol=0, atol=1e-8)
    theirs = pyscf_thermo.thermo(SimpleNamespace(mol=mol, e_tot=e0), ha["freq_au"], T, p)
    assert theirs["sym_number"][0] == 2
    for k, v in th.items():
        assert v == pytest.approx(float(np.asarray(theirs[k][0]).ravel()[0]), rel=1e-12, abs=1e-14), k


def test_the_cli_says_linear_and_counts_the_modes(tmp_path, monkeypatch):
    """`dfmp2 frequencies` of the shipped hydrogen fluoride: one mode, the JSON says `linear: true`
    and `vibrational_modes: 1`, five zero modes; the table's caption says it is linear."""
    geom = read_xyz(HF_XYZ)
    evaluate = model(geom)
    monkeypatch.setattr(F, "evaluate_gradient", lambda g, o, m, w, p=None, log=None: evaluate(g, w))
    out = tmp_path / "f.json"
    r = CliRunner().invoke(main, ["frequencies", str(HF_XYZ), "--basis", "sto-3g", "--no-ir", "-q", "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["linear"] is True and d["vibrational_modes"] == 1 and len(d["frequencies"]) == 1
    assert len(d["zero_modes"]["projected"]) == 5 and d["point_group"] == "Coov"
    assert "linear" in r.stdout


def _ase_frequencies(geom: Geometry, basis: str, tmp_path) -> np.ndarray:
    """ASE's Vibrations (central differences of 0.005 Å, no projection) over our ASE calculator."""
    from ase import Atoms
    from ase.vibrations import Vibrations

    from dfmp2.ase import DFMP2Calculator

    atoms = Atoms(list(geom.symbols), positions=geom.coords_angstrom)
    atoms.calc = DFMP2Calculator(basis=basis)
    vib = Vibrations(atoms, name=str(tmp_path / "vib"), delta=0.005)
    vib.run()
    f = vib.get_frequencies()
    return np.sort(np.real(f[np.abs(np.imag(f)) < 1e-9]))


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["hydrogen_fluoride", "carbon_dioxide"])
def test_dfmp2_frequencies_of_linear_molecules_against_ase_vibrations(name, tmp_path):
    """The acceptance of issue 61: `dfmp2 frequencies` (MP2/cc-pVDZ, its JSON) of the shipped HF
    gives 1 real mode and CO2 (ASE's g2 geometry) 4, each within 1 cm⁻¹ of ASE's Vibrations over
    our calculator (the 3N - 5 highest of its 3N)."""
    if name == "hydrogen_fluoride":
        path = HF_XYZ
    else:
        path = tmp_path / "co2.xyz"
        rows = [f"{s} {x:.6f} {y:.6f} {z:.6f}" for s, (x, y, z) in zip(*CO2)]
        path.write_text("3\nCO2, ASE g2 geometry\n" + "\n".join(rows) + "\n")
    out = tmp_path / "f.json"
    r = CliRunner().invoke(main, ["frequencies", str(path), "--basis", "cc-pvdz", "--no-ir", "-q", "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    geom = read_xyz(path)
    nmode = 3 * geom.natm - 5
    ours = np.array(d["frequencies"])
    assert d["linear"] is True and d["vibrational_modes"] == nmode and ours.shape == (nmode,) and (ours > 0).all()
    theirs = _ase_frequencies(geom, "cc-pvdz", tmp_path)[-nmode:]
    assert np.allclose(ours, theirs, rtol=0, atol=1.0), (ours, theirs)
