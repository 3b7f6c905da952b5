"""Double-hybrid DFT: what our MP2 stage needs of each functional of the table (dfmp2.functionals).

A double hybrid's energy is

    E = E_DFT[ρ_KS] + c_OS E_OS + c_SS E_SS + E_disp

E_DFT: the self-consistent Kohn–Sham energy with the functional's hybrid part (a fraction of HF
exchange, scaled semilocal exchange and correlation; PySCF's DF-RKS/UKS on the host, libxc's
components through PySCF's xc strings); E_OS and E_SS: our DF-MP2 stage's opposite- and same-spin
sums on the KS orbitals and orbital energies (dfmp2.mp2.stage, the MP2-fit set matched to the
orbital basis); E_disp: the D3(BJ) or D4 term where the functional's definition has one, from the
field's packages (pyscf-dispersion's simple-dftd3 and dftd4 builds), parameters by name from their
tables, never typed in here. All energies in Hartree.

``FUNCTIONALS``, the one table, is dfmp2.functionals' (below options.py, which takes its names);
its names are read here too.
"""

from __future__ import annotations

from dfmp2.errors import InputError

# the table's names, read here as before
from dfmp2.functionals import ALIASES, FUNCTIONALS, METHODS, Dispersion, DoubleHybrid, canonical, get  # noqa: F401

DISPERSION_PACKAGE = "pyscf-dispersion"  # PyPI: simple-dftd3 and dftd4 built for PySCF (import pyscf.dispersion)


def check_dispersion_package(dh: DoubleHybrid) -> None:
    """Before any work: a functional with a dispersion term needs pyscf-dispersion; one InputError
    naming the package when it cannot be imported."""
    if dh.dispersion is None:
        return
    try:
        import pyscf.dispersion  # noqa: F401
        from pyscf.dispersion import dftd3, dftd4  # noqa: F401
    except ImportError:
        raise InputError(
            f"{dh.name}'s {dh.dispersion.label} dispersion needs the {DISPERSION_PACKAGE} package "
            f"(simple-dftd3 and dftd4 for PySCF), which is not installed: pip install {DISPERSION_PACKAGE} "
            "(or pip install 'dfmp2[dh]')",
            option="method",
        ) from None


def real_atoms(mol):
    """``mol`` without its ghost atoms (PySCF Mole): the real atoms' symbols and Bohr coordinates as
    they are, the charge; a placeholder basis (the dispersion packages read atoms, coordinates, charge).
    ``mol`` itself when it has no ghost atom. A ghost atom reaches the packages as element 0: dftd4
    then counts it as an atom of its charge model (the monomer's D4 energy of a counterpoise run went
    from -2.07e-4 to -1.5e-8 Eh), simple-dftd3 nearly ignores it (1e-10 Eh off)."""
    from pyscf import gto

    real = [i for i in range(mol.natm) if not gto.is_ghost_atom(mol.atom_symbol(i))]
    if len(real) == mol.natm:
        return mol
    coords = mol.atom_coords()  # Bohr
    atoms = [(mol.atom_symbol(i), coords[i].tolist()) for i in real]
    nelec = sum(gto.charge(a) for a, _ in atoms) - int(mol.charge)
    one_s = {a: [[0, [1.0, 1.0]]] for a, _ in atoms}  # a placeholder basis, never used (no warning)
    sub = gto.Mole(atom=atoms, unit="Bohr", basis=one_s, charge=mol.charge, spin=nelec % 2, verbose=0)
    sub.stdout = mol.stdout
    return sub.build(parse_arg=False)


def dispersion_model(mol, dh: DoubleHybrid):
    """pyscf-dispersion's model of ``dh``'s D3(BJ) or D4 term (its named parameters) on the real
    atoms of ``mol`` (``real_atoms``): the one the energy and the gradient (dfmp2.grad.dh) ask."""
    check_dispersion_package(dh)
    from pyscf.dispersion import dftd3, dftd4

    d, sub = dh.dispersion, real_atoms(mol)
    if d.version == "d4":
        return dftd4.DFTD4Dispersion(sub, d.parameters, atm=True)
    return dftd3.DFTD3Dispersion(sub, d.parameters, version=d.version, atm=d.atm)


def dispersion_energy(mol, dh: DoubleHybrid) -> tuple[float, dict]:
    """(E_disp in Hartree, its record) of the molecule ``mol`` (PySCF Mole, its geometry in Bohr
    inside) for ``dh``'s dispersion term, by the package's named parameters; (0.0, None) without one.
    Ghost atoms (a counterpoise run's partner) have no dispersion: the term is the real atoms' alone
    (``real_atoms``), for D3(BJ) and D4 alike."""
    if dh.dispersion is None:
        return 0.0, None
    from importlib.metadata import PackageNotFoundError, version

    d = dh.dispersion
    energy = float(dispersion_model(mol, dh).get_dispersion()["energy"])
    try:
        pkg = f"{DISPERSION_PACKAGE} {version(DISPERSION_PACKAGE)}"
    except PackageNotFoundError:  # pragma: no cover - an install without metadata
        pkg = DISPERSION_PACKAGE
    engine = "dftd4" if d.version == "d4" else "simple-dftd3"
    return energy, {
        "version": d.version,
        "label": d.label,
        "parameters": f"{engine} '{d.parameters}'",
        "three_body": d.atm,
        "package": pkg,
        "source": d.source,
        "energy": energy,
    }


def register(dh: DoubleHybrid) -> str:
    """Make ``dh.pyscf_xc`` known to PySCF (for a functional with changed libxc parameters:
    ``libxc.register_custom_functional_``, by the parameters' names, once per process, the same
    definition every time); returns the name to set as ``mf.xc``."""
    if not dh.custom:
        return dh.xc
    from pyscf.dft import libxc

    name = dh.pyscf_xc
    if name not in libxc._CUSTOM_FUNC_R:
        params = {int(libxc.XC_CODES[comp]): dict(values) for comp, values in dh.custom}
        libxc.register_custom_functional_(name, dh.xc, ext_params=params)
    return name


def record(dh: DoubleHybrid, e_dft: float, e_os: float, e_ss: float, disp: dict | None, ks: dict) -> dict:
    """The result's ``double_hybrid`` record: the functional's definition, the parts of its energy
    (Hartree: E_DFT, the scaled PT2 term, E_disp, the total) and the KS-SCF's grid and fitting set
    (``ks``: what ``pyscf_scf.run_ks`` recorded)."""
    e_pt2 = dh.c_os * e_os + dh.c_ss * e_ss
    e_disp = disp["energy"] if disp else 0.0
    return {
        "functional": dh.record(),
        "e_dft": e_dft,
        "e_pt2": e_pt2,
        "e_disp": e_disp,
        "e_total": e_dft + e_pt2 + e_disp,
        "dispersion": disp,
        "ks_scf": ks,
    }
