"""An ASE calculator: the DF-MP2 energy of an ``ase.Atoms`` in eV, ``dfmp2 run`` underneath.

    from ase.build import molecule
    from dfmp2.ase import DFMP2Calculator
    atoms = molecule("H2O")
    atoms.calc = DFMP2Calculator(method="mp2", basis="cc-pvdz", frozen_core=True)
    atoms.get_potential_energy()          # eV: E(MP2) of `dfmp2 run` times ase.units.Hartree

Dipole (``atoms.get_dipole_moment()``, e·Å as ASE takes it): the relaxed dipole of the ``method``'s
energy (dfmp2.props; about the origin of the Atoms' coordinates, a density-fitted SCF), from the
gradient's densities when forces are computed in the same call, else from the density stage on the
last run's reference.

Parameters: ``method`` ('mp2', 'scs-mp2', 'sos-mp2' or a double hybrid such as 'b2plyp': which total
energy is the ASE energy; a double hybrid's dipole is its relaxed one),
``num_threads`` (torch's threads during each calculation, an int or 'max', as ASE's Psi4 calculator
takes it; default: as the process has them) and any ``dfmp2.options.RunOptions`` field (basis,
auxbasis, frozen_core, device, precision, scf_mode, memory_mb, charge, multiplicity, ...), type-
checked when set. Charge and multiplicity: the parameters when given, else the Atoms' total initial
charge and total initial magnetic moment (2S + 1 = |sum of moments| + 1), else neutral and the
lowest multiplicity. Forces (eV/Å): minus the analytic gradient of the ``method``'s energy
(``run_gradient``: RHF or UHF, density-fitted SCF, fp64 device; a double hybrid's, ``method`` any of
its names, RKS or UKS, with the gradient's own checks and refusals); stress raises
``PropertyNotImplementedError``.

Every calculation runs the whole energy run (``dfmp2.drivers.energy.run_energy``), SCF included. Our
DF-SCF (``scf_mode``
'df', the default) starts from the previous calculation's density when the atoms' symbols, charge,
multiplicity and the options are unchanged (its occupied orbitals re-orthonormalised at the new
geometry: ``reference.project_density``), else from PySCF's 'minao' guess; ``ran.scf.guess`` says
which. The previous density saves cycles on a small step (scripts/results/docstring-measurements.md).
``calc.result`` is the last ``dfmp2.io.result.Result`` (energies in Hartree, what ran, timings);
``calc.gradient_result`` the last ``GradientResult`` when forces were asked for.
Needs ``pip install "dfmp2[ase]"``.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
from ase.calculators.calculator import Calculator, PropertyNotImplementedError, all_changes
from ase.units import Bohr, Hartree

from dfmp2.errors import InputError

METHODS = {"mp2": "e_mp2", "scs-mp2": "e_scs_mp2", "sos-mp2": "e_sos_mp2"}  # -> Result.energies() key


def _double_hybrid(method) -> str | None:
    """The table's key of a double-hybrid ``method`` (dfmp2.mp2.double_hybrids: its energy is
    ``e_tot``, run as RunOptions.method; its forces dfmp2.grad.dh's), None for one of METHODS."""
    from dfmp2.mp2 import double_hybrids

    if method in METHODS:
        return None
    key = double_hybrids.canonical(method)  # InputError naming the method for an unknown name
    return None if key == "mp2" else key


def _option_names() -> set:
    from dfmp2.options import RunOptions

    return {f.name for f in dataclasses.fields(RunOptions)}


class DFMP2Calculator(Calculator):
    """ASE calculator of DF-MP2 / SCS-MP2 / SOS-MP2 total energies (eV); see the module docstring."""

    implemented_properties: ClassVar[list] = ["energy", "free_energy", "forces", "dipole"]
    default_parameters: ClassVar[dict] = {"method": "mp2", "num_threads": None}
    discard_results_on_any_change = False  # set() decides: a change of method alone reuses the run

    def __init__(self, restart=None, *, label=None, atoms=None, directory=".", **kwargs):
        self.result = self.gradient_result = self.energy_run = None
        self._scf_density = None  # (what it belongs to, Reference.density()) of the last calculation
        super().__init__(restart=restart, label=label, atoms=atoms, directory=directory, **kwargs)

    def set(self, **kwargs):
        """Set parameters (ASE's ``set``): ``method`` or RunOptions fields. An unknown name or a
        value of the wrong type is an InputError now, not at the first energy."""
        unknown = sorted(set(kwargs) - _option_names() - {"method", "num_threads", "parameters"})
        if unknown:
            raise InputError(
                f"DFMP2Calculator has no parameter {', '.join(unknown)}; use method, num_threads or one of "
                f"{', '.join(sorted(_option_names()))}"
            )
        old = (self.parameters or {}).get("method", "mp2")
        method = kwargs.get("method", old)
        if method not in METHODS and _double_hybrid(method) is None:
            raise InputError(f"unknown method {method!r}; use one of {', '.join(METHODS)}", option="method")
        if "num_threads" in kwargs:
            from dfmp2.interfaces.api import torch_threads

            with torch_threads(kwargs["num_threads"]):  # checked now, not at the first energy
                pass
        changed = super().set(**kwargs)
        self.run_options()  # type-check what was set
        if set(changed) - {"method", "num_threads"} or _double_hybrid(old) != _double_hybrid(method):  # another run
            self.reset()
        elif changed and "energy" in self.results:  # the same run, another of its energies
            self._store_energy()
        return changed

    def reset(self):
        super().reset()
        self.result = self.gradient_result = self.energy_run = None

    def _store_energy(self) -> None:
        """The method's energy (eV) from the last run; its forces (eV/Å) when the last gradient
        was of this method (another method's gradient is computed when asked for)."""
        method = self.parameters["method"]
        energy = self.result.energies()[METHODS.get(method, "e_tot")] * Hartree
        self.results = {"energy": energy, "free_energy": energy}
        gr = self.gradient_result
        if gr is not None and gr.result is self.result and gr.method == (_double_hybrid(method) or method):
            self.results["forces"] = -gr.gradient * (Hartree / Bohr)
        dip = (self.result.properties or {}).get("dipole")
        if dip is not None and dip["method"] == method:
            self.results["dipole"] = np.asarray(dip["relaxed"]["au"]) * Bohr

    def run_options(self):
        """The RunOptions of the parameters (``method`` only when it is a double hybrid)."""
        from dfmp2.options import RunOptions

        dh = _double_hybrid(self.parameters.get("method", "mp2"))
        return RunOptions(
            **{k: v for k, v in self.parameters.items() if k not in ("method", "num_threads")},
            **({"method": dh} if dh else {}),
        )

    def get_property(self, name, atoms=None, allow_calculation=True):
        if name not in self.implemented_properties:
            raise PropertyNotImplementedError(
                f"DFMP2Calculator computes energies and forces: '{name}' is not implemented"
            )
        return super().get_property(name, atoms, allow_calculation)

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        """Run ``dfmp2 run`` on the Atoms: results['energy'] = results['free_energy'] = the
        ``method``'s total energy in eV (Hartree * ase.units.Hartree); with 'forces' asked for,
        ``dfmp2 gradient``: results['forces'] (natm, 3) eV/Å = -gradient * Hartree / Bohr; with
        'dipole', results['dipole'] (3,) e·Å, the relaxed dipole of the ``method``'s energy (its
        -dE/dF) about the origin of the Atoms' coordinates: from the gradient's own densities when
        forces were computed too, else the density stage on the last run (``_dipole``; nothing
        recomputed when the Atoms did not change)."""
        same_run = not system_changes and self.energy_run is not None
        if same_run and "dipole" in properties and "forces" not in properties:  # the last run's dipole only
            super().calculate(atoms, properties, system_changes)
            self._dipole()
            return
        super().calculate(atoms, properties, system_changes)
        from dfmp2.interfaces.api import torch_threads

        with torch_threads(self.parameters.get("num_threads")):
            self._run(properties)

    def _run(self, properties) -> None:
        """``calculate``'s run on ``self.atoms``: the energy, with 'forces' the gradient, with
        'dipole' the dipole; the results stored."""
        options = self.run_options()
        geom = geometry_from_atoms(self.atoms, options.charge, options.multiplicity)
        key = (geom.symbols, geom.charge, geom.multiplicity, options)
        guess = self._scf_density[1] if self._scf_density and self._scf_density[0] == key else None
        if "forces" in properties:
            from dfmp2.drivers.gradient import run_gradient

            self.gradient_result = run_gradient(geom, options, method=self.parameters["method"], guess=guess)
            done = self.gradient_result.energy_run
        else:
            from dfmp2.drivers.energy import prepare, run_energy

            done = run_energy(prepare(geom, options), guess=guess)
        self.result, self.energy_run = done.result, done
        self._scf_density = (key, done.ref.density())  # the next geometry's SCF starts from this density
        if "dipole" in properties:
            self._dipole()
        self._store_energy()

    def _dipole(self) -> None:
        """The relaxed dipole of the ``method``'s energy on the last run into ``result.properties``
        and results (``props.stage``): from the last gradient's densities when it was this run's
        and this method's, else from the density stage on the run's reference."""
        from dfmp2.props import stage as props_stage

        done, method, gr = self.energy_run, self.parameters["method"], self.gradient_result
        job = done.job
        if gr is not None and gr.result is self.result and gr.method == (_double_hybrid(method) or method):
            record = props_stage.record(job.mol, gr.parts.densities, ("dipole",), method)
        else:
            props_stage.check_properties(dataclasses.replace(job.options, properties=("dipole",)), job.unrestricted)
            plan = props_stage.density_plan(job, job.options.memory_mb)
            args = (job.mol, done.ref, job.auxmol, job.jk_auxmol, job.backend, ("dipole",), method, plan)
            record = props_stage.property_stage(*args)
        self.result.properties = {**(self.result.properties or {}), **record}
        self._store_energy()


def geometry_from_atoms(atoms, charge=None, multiplicity=None):
    """A ``dfmp2.io.xyz.Geometry`` of an ``ase.Atoms`` (positions in Ångström). Charge and
    multiplicity: the arguments, else the Atoms' total initial charge and magnetic moment
    (InputError when either is not a whole number, or the Atoms are periodic)."""
    from dfmp2.io.xyz import Geometry

    if any(atoms.pbc):
        raise InputError("DFMP2Calculator takes molecules: the Atoms are periodic (pbc); set pbc=False")
    if len(atoms) == 0:
        raise InputError("the Atoms object has no atoms")
    q, m = float(np.sum(atoms.get_initial_charges())), float(np.sum(atoms.get_initial_magnetic_moments()))
    for name, value in (("charge", q), ("magnetic moment", m)):
        if abs(value - round(value)) > 1e-8:
            raise InputError(
                f"the Atoms' total initial {name} {value:g} is not a whole number; set "
                f"{'charge' if name == 'charge' else 'multiplicity'} on the calculator",
                option="charge" if name == "charge" else "multiplicity",
            )
    if charge is None and round(q) != 0:
        charge = int(round(q))
    if multiplicity is None and round(m) != 0:
        multiplicity = abs(int(round(m))) + 1
    return Geometry(
        symbols=tuple(atoms.get_chemical_symbols()),
        coords_angstrom=np.asarray(atoms.get_positions(), dtype=float),
        charge=charge,
        multiplicity=multiplicity,
        source=f"ase.Atoms ({atoms.get_chemical_formula()})",
    )
