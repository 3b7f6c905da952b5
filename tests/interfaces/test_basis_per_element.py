"""Per-element and custom orbital basis sets (issue 61): ``basis={"O": "cc-pvdz", "H": "sto-3g"}``,
the text ``"O:cc-pvdz,H:sto-3g"`` (CLI, QCSchema model.basis), ``keywords.basis_map``, PySCF
shells (``gto.basis.parse``), a PySCF Mole with a dict basis, and the ASE calculator. References:
PySCF's RHF (density-fitted) and DF-MP2 on the same dict basis with the fitting sets spelled out
here (those PySCF's own ``df.make_auxbasis`` picks: checked too), to 1e-9 Eh."""

import dataclasses
import json

import pytest
from click.testing import CliRunner
from pyscf import df, gto, scf
from pyscf.mp import dfmp2 as pyscf_dfmp2

import dfmp2
from dfmp2 import distributed
from dfmp2.errors import InputError
from dfmp2.io import checkpoint, molecule
from dfmp2.io.xyz import read_xyz
from dfmp2.options import RunOptions

WATER = "O 0 0 0.119; H 0 0.757 -0.477; H 0 -0.757 -0.477"
PER_ELEMENT = {"O": "cc-pvdz", "H": "sto-3g"}
JK = {"O": "cc-pvdz-jkfit", "H": "def2-svp-jkfit"}  # PySCF's make_auxbasis for this dict basis
RI = {"O": "cc-pvdz-ri", "H": "def2-svp-ri"}  # ... and with mp2fit=True
H_STO3G = """H    S
      3.42525091             0.15432897
      0.62391373             0.53532814
      0.16885540             0.44463454
"""


@pytest.fixture
def water_xyz(tmp_path):
    path = tmp_path / "water.xyz"
    path.write_text("3\n\nO 0 0 0.119\nH 0 0.757 -0.477\nH 0 -0.757 -0.477\n")
    return path


def _pyscf(basis, jk, ri):
    """(E_HF, E_corr) of PySCF's DF-RHF + DF-MP2 on ``basis`` with fitting sets ``jk``, ``ri``."""
    mol = gto.M(atom=WATER, basis=basis, verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis=jk)
    mf.conv_tol = 1e-12
    mf.run()
    return mf.e_tot, pyscf_dfmp2.DFMP2(mf).set(with_df=df.DF(mol, auxbasis=ri)).kernel(with_t2=False)[0]


def test_per_element_basis_equals_pyscf(water_xyz):
    mol = gto.M(atom=WATER, basis=PER_ELEMENT, verbose=0)
    assert df.make_auxbasis(mol) == JK and df.make_auxbasis(mol, mp2fit=True) == RI
    r = dfmp2.energy(water_xyz, basis=PER_ELEMENT, cpu_blas="torch")
    e_hf, e_corr = _pyscf(PER_ELEMENT, JK, RI)
    assert abs(r.e_hf - e_hf) <= 1e-9 and abs(r.e_corr - e_corr) <= 1e-9, (r.e_hf - e_hf, r.e_corr - e_corr)
    d = r.to_dict()  # what ran: the basis and both fitting sets per element
    assert d["basis"] == "H:sto-3g,O:cc-pvdz"
    assert d["auxbasis"] == "cc-pvdz-ri (O) + def2-svp-ri (H)"
    assert d["jk_auxbasis"] == "cc-pvdz-jkfit (O) + def2-svp-jkfit (H)"
    # a PySCF Mole with the dict basis: the same run
    r2 = dfmp2.energy(mol, cpu_blas="torch")
    assert r2.basis == r.basis and abs(r2.e_corr - r.e_corr) <= 1e-12


@pytest.mark.heavy
def test_custom_shells_equal_pyscf(water_xyz):
    basis = {"O": "cc-pvdz", "H": gto.basis.parse(H_STO3G)}
    r = dfmp2.energy(water_xyz, basis=basis, cpu_blas="torch")
    # shells have no matched fitting set: the stated fallbacks (dfmp2.df.basis), PySCF given the same
    assert r.basis == "H:(given shells),O:cc-pvdz"
    assert r.jk_auxbasis == "cc-pvdz-jkfit (O) + def2-universal-jkfit (H)"
    assert r.auxbasis == "cc-pvdz-ri (O) + def2-tzvpp-ri (H)"
    e_hf, e_corr = _pyscf(
        basis, {"O": "cc-pvdz-jkfit", "H": "def2-universal-jkfit"}, {"O": "cc-pvdz-ri", "H": "def2-tzvpp-ri"}
    )
    assert abs(r.e_hf - e_hf) <= 1e-9 and abs(r.e_corr - e_corr) <= 1e-9


def test_basis_forms_are_one_canonical_option():
    forms = [PER_ELEMENT, {"h": "sto-3g", "O": "cc-pvdz"}, "O:cc-pvdz,H:sto-3g", " H : sto-3g , O:cc-pvdz "]
    opts = [RunOptions(basis=b) for b in forms]
    assert all(o == opts[0] for o in opts) and opts[0].basis == {"H": "sto-3g", "O": "cc-pvdz"}
    # the ranks' agreement and a checkpoint's fingerprint see one value, whatever the form
    digests = {distributed.digests({"option basis": o.basis})["option basis"] for o in opts}
    assert len(digests) == 1
    assert dataclasses.replace(opts[0], basis=forms[2]) == opts[0]
    assert RunOptions(basis="default:cc-pvdz,H:6-31g(d,p)").basis == {"default": "cc-pvdz", "H": "6-31g(d,p)"}
    assert RunOptions(basis={"default": "cc-pvdz"}).basis == "cc-pvdz"
    shells = RunOptions(basis={"H": gto.basis.parse(H_STO3G), "O": "cc-pvdz"}).basis
    json.dumps(shells)  # JSON-able: the checkpoint's fingerprint and the ranks' digests
    assert shells["H"][0][0] == 0
    fp = checkpoint.fingerprint(
        mol=gto.M(atom=WATER, basis=shells, verbose=0),
        basis=shells,
        auxbasis="x",
        scf_mode="df",
        frozen_core=False,
        precision="fp64",
        device="cpu",
        simulate=False,
        nfrozen=0,
        nocc=5,
        nvir=2,
        naux=10,
    )
    assert "sto" not in fp["basis"] and fp["basis"].startswith("{")


@pytest.mark.parametrize(
    ("basis", "message"),
    [
        ("O:cc-pvdz", "has no entry for H"),
        ("O:cc-pvdz,H:nope", "'nope' is not defined for H"),
        ("Q:cc-pvdz,default:sto-3g", "'Q' is not an element symbol"),
        ("O:cc-pvdz,H:sto-3g,h:x", "H is given twice"),
        ("O:cc-pv[dt]z,H:sto-3g", "basis bracket"),
        ("O:,H:sto-3g", "is not 'element:basis'"),
        ({"O": "cc-pvdz", "H": [["s", 1.0]]}, "must be a name or PySCF shells"),
        ({"O": "cc-pvdz", "H": [[0, [1.0]]]}, "must be a name or PySCF shells"),
        ({"O": "cc-pvdz", "H": [[0, [-1.0, 1.0]]]}, "must be a name or PySCF shells"),
        ({"O": "cc-pvdz", "H": [[9, [1.0, 1.0]]]}, "must be a name or PySCF shells"),
    ],
)
def test_unresolvable_basis_is_one_input_error(water_xyz, basis, message):
    with pytest.raises(InputError, match=message) as err:
        opts = RunOptions(basis=basis)
        molecule.build_molecule(read_xyz(water_xyz), opts.basis)
    assert err.value.option == "basis" and "\n" not in str(err.value)


def test_cli_per_element_basis_and_its_error(water_xyz, tmp_path):
    from dfmp2.cli.main import main

    res = CliRunner().invoke(main, ["run", str(water_xyz), "-q", "--basis", "O:cc-pvdz,H:nope"])
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines() == [
        "error: basis 'nope' is not defined for H; choose another basis (--basis)"
    ]
    out = tmp_path / "r.json"
    res = CliRunner().invoke(
        main, ["run", str(water_xyz), "-q", "--basis", "O:cc-pvdz,H:sto-3g", "--cpu-blas", "torch", "--json", str(out)]
    )
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert d["basis"] == "H:sto-3g,O:cc-pvdz" and d["auxbasis"] == "cc-pvdz-ri (O) + def2-svp-ri (H)"


def test_qcschema_basis_map_and_per_element_text():
    pytest.importorskip("qcelemental")
    from dfmp2.interfaces.qcschema import parse_input

    def inp(basis, keywords):
        return {
            "schema_name": "qcschema_input",
            "schema_version": 1,
            "driver": "energy",
            "model": {"method": "mp2", "basis": basis},
            "keywords": keywords,
            "molecule": {"symbols": ["O", "H", "H"], "geometry": [0, 0, 0.22, 0, 1.43, -0.9, 0, -1.43, -0.9]},
        }

    _, _, _, opts = parse_input(inp("cc-pvdz", {"basis_map": {"H": "sto-3g"}}), "in.json")
    assert opts.basis == {"default": "cc-pvdz", "H": "sto-3g"}
    _, _, _, opts = parse_input(inp("O:cc-pvdz,H:sto-3g", {}), "in.json")
    assert opts.basis == {"H": "sto-3g", "O": "cc-pvdz"}
    with pytest.raises(InputError, match="basis_map must be"):
        parse_input(inp("cc-pvdz", {"basis_map": "sto-3g"}), "in.json")


@pytest.mark.heavy
def test_ase_calculator_takes_a_per_element_basis():
    pytest.importorskip("ase")
    from ase.build import molecule as ase_molecule

    from dfmp2.ase import DFMP2Calculator

    atoms = ase_molecule("H2O")
    atoms.calc = DFMP2Calculator(basis=PER_ELEMENT, cpu_blas="torch")
    atoms.get_potential_energy()
    assert atoms.calc.result.basis == "H:sto-3g,O:cc-pvdz"
    assert atoms.calc.result.auxbasis == "cc-pvdz-ri (O) + def2-svp-ri (H)"


def test_each_element_gets_its_own_basis_ecp():
    import numpy as np

    from dfmp2.io.xyz import Geometry

    hi = Geometry(symbols=("H", "I"), coords_angstrom=np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 1.61]]))
    mol = molecule.build_molecule(hi, RunOptions(basis="I:def2-svp,H:cc-pvdz").basis)
    assert mol.ecp == {"I": "def2-svp"} and mol.atom_nelec_core(1) == 28
    with pytest.raises(InputError, match="made for an effective core potential on I"):
        molecule.build_molecule(hi, {"I": "def2-svp", "H": "cc-pvdz"}, ecp="none")
