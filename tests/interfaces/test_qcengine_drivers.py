"""QCEngine's ``hessian`` and ``properties`` drivers, the input's ``id`` (and molecule id, extras,
protocols) kept in the AtomicResult, and Psi4's keyword names (freeze_core, df_basis_mp2,
mp2_type, scf_type, basis), all through ``qcengine.compute`` with our harness registered.
References: PySCF (its DF-MP2 relaxed density's dipole, second differences of its DF-MP2
energies) and ``dfmp2 frequencies``' own Hessian for the routing. Water, STO-3G."""

import numpy as np
import pytest

qcng = pytest.importorskip(
    "qcengine", reason='QCEngine harness: qcengine is not installed (pip install -e ".[qcschema]")'
)
from pyscf import gto, scf
from pyscf.lib.parameters import BOHR
from qcelemental.models import v1, v2

import dfmp2
import dfmp2.qcengine  # registers program "dfmp2"

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WATER = [("O", (0.0, 0.0, 0.1173)), ("H", (0.0, 0.7572, -0.4692)), ("H", (0.0, -0.7572, -0.4692))]


def doc(driver="energy", version=2, method="mp2", basis="sto-3g", keywords=None, **top) -> dict:
    """Water as an AtomicInput document (Bohr), v1's or v2's layout; ``top``: id, extras, protocols."""
    molecule = {"symbols": [s for s, _ in WATER], "geometry": [x / BOHR for _, xyz in WATER for x in xyz]}
    spec = {"driver": driver, "model": {"method": method, "basis": basis}, "keywords": keywords or {}}
    for k in ("extras", "protocols"):
        if k in top:
            spec[k] = top.pop(k)
    if "molecule_id" in top:
        molecule["id"] = top.pop("molecule_id")
    if version == 1:
        return {"schema_name": "qcschema_input", "schema_version": 1, "molecule": molecule, **spec, **top}
    v2_doc = {"schema_name": "qcschema_atomic_input", "schema_version": 2, "molecule": molecule}
    return {**v2_doc, "specification": spec, **top}


def ok(r):
    assert r.success, getattr(r, "error", None)
    return r


def pyscf_mol(coords=None, basis="sto-3g"):
    atoms = [(s, xyz) for s, xyz in WATER] if coords is None else list(zip([s for s, _ in WATER], coords))
    return gto.M(atom=atoms, basis=basis, unit="Angstrom" if coords is None else "Bohr", verbose=0)


# --- the input's id, the molecule's id, extras and protocols -----------------------------------


@pytest.mark.parametrize("version", [1, 2])
def test_the_inputs_id_molecule_id_extras_and_protocols_are_kept(version):
    d = doc(version=version, id="job-42", molecule_id="water-7", extras={"tag": "mine"}, protocols={"stdout": False})
    r = ok(qcng.compute(d, "dfmp2"))
    assert type(r) is (v1.AtomicResult if version == 1 else v2.AtomicResult)
    assert r.id == "job-42" and r.molecule.id == "water-7"
    assert r.stdout is None  # protocols.stdout false
    if version == 1:  # v1: the input's extras beside ours
        assert r.extras["tag"] == "mine" and "qcvars" in r.extras
    else:  # v2: the input as given, in input_data
        assert r.input_data.id == "job-42" and r.input_data.specification.extras == {"tag": "mine"}
    text = r.json() if version == 1 else r.model_dump_json()
    assert '"id":"job-42"' in text.replace(" ", "")


# --- Psi4's keyword names ------------------------------------------------------------------------


def test_psi4_keyword_names_run_as_dfmp2s_own():
    """freeze_core, df_basis_mp2, mp2_type df, scf_type df and basis (= model.basis), Psi4's names
    and case, give the run dfmp2's own names give (bit for bit), and freeze_core acts."""
    psi4 = {"FREEZE_CORE": "True", "df_basis_mp2": "cc-pvdz-ri", "mp2_type": "DF", "scf_type": "df", "basis": "STO-3G"}
    ours = {"frozen_core": True, "auxbasis": "cc-pvdz-ri", "scf_mode": "df"}
    a = ok(qcng.compute(doc(keywords=psi4), "dfmp2"))
    b = ok(qcng.compute(doc(keywords=ours), "dfmp2"))
    assert a.return_result == b.return_result
    assert a.extras["dfmp2"]["auxbasis"] == b.extras["dfmp2"]["auxbasis"] == "cc-pvdz-ri"
    c = ok(qcng.compute(doc(keywords={**ours, "freeze_core": False, "frozen_core": False}), "dfmp2"))
    assert abs(c.return_result - b.return_result) > 1e-5  # frozen core changes E(MP2)
    assert (b.properties.calcinfo_nalpha, c.properties.calcinfo_nalpha) == (5, 5)


@pytest.mark.parametrize(
    "keywords, fragment",
    [
        ({"mp2_type": "conv"}, "dfmp2 computes density-fitted MP2 only"),
        ({"mp2_type": "cd"}, "use mp2_type 'df'"),
        ({"frozen_core": True, "freeze_core": False}, "keywords frozen_core and freeze_core set the same thing"),
        ({"auxbasis": "cc-pvdz-ri", "df_basis_mp2": "def2-svp-ri"}, "auxbasis and df_basis_mp2"),
        ({"scf_mode": "exact", "scf_type": "df"}, "scf_mode and scf_type"),
        ({"basis": "cc-pvdz"}, 'keyword basis "cc-pvdz" conflicts with model.basis'),
        ({"freeze_core": -1}, "keyword freeze_core must be true or false"),
        ({"scf_type": "cd"}, "keyword scf_type must be one of df"),
        ({"freeze": True}, "unknown keyword 'freeze'; use auxbasis"),
    ],
)
def test_psi4_keywords_that_do_not_map_or_conflict_are_refused_in_one_line(no_scf, keywords, fragment):
    f = qcng.compute(doc(keywords=keywords), "dfmp2")
    assert not f.success and f.error.error_type == "input_error", f.error
    line = f.error.error_message.rsplit("\n", 1)[-1]  # after QCEngine's header: dfmp2's one line
    assert fragment in line, f.error.error_message
    if "unknown" in fragment:  # the refusal names Psi4's names too
        psi4 = line.split("Psi4's", 1)[1]
        assert all(name in psi4 for name in ("freeze_core", "df_basis_mp2", "mp2_type", "scf_type", "basis"))


# --- driver 'properties' -------------------------------------------------------------------------


def _pyscf_relaxed_dipole(run: dict, method_scales=None) -> np.ndarray:
    """The relaxed DF-MP2 dipole (e·a0) of PySCF's DF-RHF + dfmp2_native on the run's fitting sets."""
    from pyscf.mp import dfmp2_native

    mol = pyscf_mol()
    mf = scf.RHF(mol).density_fit(auxbasis=run["jk_auxbasis"])
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-9
    mf.kernel()
    dm = dfmp2_native.DFMP2(mf, auxbasis=run["auxbasis"]).make_rdm1(relaxed=True, ao_repr=True)
    return np.asarray(scf.hf.dip_moment(mol, dm, unit="AU", verbose=0))


@pytest.mark.parametrize("version", [1, 2])
def test_properties_driver_returns_the_energy_and_the_relaxed_mp2_dipole(version):
    r = ok(qcng.compute(doc("properties", version), "dfmp2"))
    mu = np.asarray(r.return_result["dipole"])
    assert np.array_equal(mu, np.asarray(r.properties.mp2_dipole_moment))
    assert r.properties.scf_dipole_moment is not None and r.properties.return_energy is not None
    assert r.extras["qcvars"]["CURRENT DIPOLE"] == r.extras["qcvars"]["MP2 DIPOLE"] == mu.tolist()
    e = ok(qcng.compute(doc("energy", version), "dfmp2"))
    assert abs(r.properties.return_energy - e.return_result) <= 1e-10
    ref = _pyscf_relaxed_dipole(r.extras["dfmp2"])
    assert np.abs(mu - ref).max() <= 1e-6, (mu, ref)
    assert abs(mu[2]) > 0.3  # water's dipole along z


def test_properties_driver_refusals_come_before_the_scf(no_scf):
    f = qcng.compute(doc("properties", keywords={"scf_mode": "exact"}), "dfmp2")
    assert not f.success and "density-fitted SCF" in f.error.error_message
    d = doc("properties")
    d["specification"]["model"]["properties"] = ["quadrupole"]  # Psi4's list: dfmp2 has the dipole
    f = qcng.compute(d, "dfmp2")
    assert not f.success and "model.properties" in f.error.error_message and "dipole" in f.error.error_message


@pytest.mark.heavy
def test_properties_driver_of_scs_mp2_is_its_own_relaxed_dipole():
    """SCS-MP2's dipole is the derivative of E(SCS-MP2): the gradient's own relaxed density with
    method scs-mp2 (dfmp2.gradient, a separate route) gives the same; mp2_dipole_moment stays empty."""
    r = ok(qcng.compute(doc("properties", method="scs-mp2"), "dfmp2"))
    mu = np.asarray(r.return_result["dipole"])
    assert r.properties.mp2_dipole_moment is None
    assert r.extras["qcvars"]["SCS-MP2 DIPOLE"] == mu.tolist()
    gr = dfmp2.gradient(pyscf_mol(), method="scs-mp2", properties=("dipole",))
    want = np.asarray(gr.result.properties["dipole"]["relaxed"]["au"])
    assert np.abs(mu - want).max() <= 1e-8
    mp2 = np.asarray(ok(qcng.compute(doc("properties"), "dfmp2")).return_result["dipole"])
    assert np.abs(mu - mp2).max() > 1e-5


# --- driver 'hessian' ----------------------------------------------------------------------------


def test_hessian_driver_refusals_come_before_the_scf(no_scf):
    d = doc("hessian")
    d["molecule"]["real"] = [True, True, False]  # a ghost atom: dfmp2 frequencies refuses it
    f = qcng.compute(d, "dfmp2")
    assert not f.success and f.error.error_type == "input_error" and "ghost" in f.error.error_message


@pytest.mark.heavy
@pytest.mark.parametrize("version", [2])
def test_hessian_driver_returns_dfmp2_frequencies_hessian(version):
    """return_result and return_hessian: (3N, 3N) Eh/bohr², the Hessian ``dfmp2.frequencies``
    builds (to QCEngine's rounding of the geometry); its harmonic frequencies are that run's; two
    elements against second differences of PySCF's DF-MP2 energies on the same fitting sets
    (independent)."""
    from pyscf.hessian import thermo
    from pyscf.mp import dfmp2_native

    r = ok(qcng.compute(doc("hessian", version, keywords={"freeze_core": True}), "dfmp2"))
    H = np.asarray(r.return_result)
    assert H.shape == (9, 9) and np.array_equal(H, np.asarray(r.properties.return_hessian))
    assert np.array_equal(H, H.T)
    assert np.asarray(r.properties.return_gradient).shape == (3, 3)
    assert r.extras["qcvars"]["MP2 TOTAL HESSIAN"] == H.tolist()
    fr = dfmp2.frequencies(pyscf_mol(), frozen_core=True, ir=False)
    # QCEngine's Molecule rounds the geometry to 1e-8 bohr: gradients ~1e-10 apart, over 2h = 0.01
    assert np.abs(H - fr.hessian).max() <= 1e-7
    assert abs(r.properties.return_energy - fr.energy) <= 1e-9
    mol = pyscf_mol()
    freq = thermo.harmonic_analysis(mol, H.reshape(3, 3, 3, 3).transpose(0, 2, 1, 3))["freq_wavenumber"]
    assert np.allclose(freq, fr.frequencies, atol=1e-3)  # cm^-1
    assert np.allclose(r.extras["dfmp2"]["frequencies"], freq, atol=1e-6)
    # independent: d²E/dx² of PySCF's DF-RHF + DF-MP2 (frozen core) by second differences
    ran = r.extras["dfmp2"]
    x0 = np.array([xyz for _, xyz in WATER]) / BOHR
    h = 0.005

    def energy(x):
        m = pyscf_mol(x)
        mf = scf.RHF(m).density_fit(auxbasis=fr.first.result.jk_auxbasis)
        mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-9
        mf.kernel()
        return dfmp2_native.DFMP2(mf, frozen=1, auxbasis=fr.first.result.auxbasis).run().e_tot

    e0 = energy(x0)
    for atom, xyz in [(0, 2), (1, 1)]:
        i = 3 * atom + xyz
        xp, xm = x0.copy(), x0.copy()
        xp[atom, xyz] += h
        xm[atom, xyz] -= h
        fd = (energy(xp) - 2 * e0 + energy(xm)) / h**2
        assert abs(H[i, i] - fd) <= 5e-5, (i, H[i, i], fd)
    assert ran["method"] == "mp2"


def test_hessian_input_on_the_command_line_refuses_an_energy_checkpoint(tmp_path, no_scf):
    """`dfmp2 run h.json --checkpoint`: one energy checkpoint cannot hold the Hessian's 6N + 1
    geometries; one error line, exit 2, no file left."""
    import json

    from click.testing import CliRunner

    from dfmp2.cli.main import main

    path, ck = tmp_path / "h.json", tmp_path / "ck.h5"
    path.write_text(json.dumps(doc("hessian", 1)))
    res = CliRunner().invoke(main, ["run", str(path), "--checkpoint", str(ck), "-q"])
    assert res.exit_code == 2 and "driver 'hessian' keeps no checkpoint file" in res.output, res.output
    assert "Traceback" not in res.output and not ck.exists()
