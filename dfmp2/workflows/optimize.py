"""``dfmp2 optimize``: geometry optimisation with geomeTRIC (Wang & Song, J. Chem. Phys. 144,
214108 (2016); PyPI ``geometric``) over our analytic gradient (``run_gradient``): of DF-MP2, SCS- or
SOS-MP2, or of a double hybrid (``method`` a key of dfmp2.functionals' table).

geomeTRIC's custom-engine interface takes the energy (Hartree) and gradient (Hartree/Bohr) at
coordinates in Bohr; its TRIC internal coordinates and default step control are used, with the
convergence criteria below (geomeTRIC's 'GAU' set, the largest gradient component tightened to
GMAX). Every evaluated geometry goes to the trajectory (multi-frame XYZ, Ångström, energy in the
comment line) as it comes. ``max_steps`` counts energy and gradient evaluations (the input
geometry's is the first). Not converged in ``max_steps``: OptimizationError (one line, with the
OptimizationResult so far, ``converged`` False) after the last geometry and the trajectory are
written. The molecule is checked as ``dfmp2 run`` checks it before geomeTRIC sees it; a single
atom has nothing to optimise: its one evaluation is returned as converged (zero gradient).
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from dataclasses import dataclass, field

import numpy as np
from pyscf.lib.parameters import BOHR  # Å per Bohr: PySCF's, as the molecules and QCSchema use

from dfmp2.drivers.gradient import GradientResult, check_gradient_options, run_gradient
from dfmp2.errors import InputError
from dfmp2.io import molecule
from dfmp2.io.outputs import write_text
from dfmp2.io.xyz import Geometry
from dfmp2.options import CONVERGENCE_SETS, RunOptions

CONVERGENCE = {
    "convergence_energy": 1e-6,
    "convergence_grms": 2e-4,
    "convergence_gmax": 3e-4,
    "convergence_drms": 1.2e-3,
    "convergence_dmax": 1.8e-3,
}  # Eh, Eh/bohr, Å
MAX_STEPS = 100


class OptimizationError(InputError):
    """The optimiser did not converge (the last geometry is written); ``result``: the
    OptimizationResult so far (``converged`` False), for the caller's JSON."""

    def __init__(self, *args, result=None, **kw):
        super().__init__(*args, **kw)
        self.result = result


class _StepLimit(Exception):
    """geomeTRIC asked for one evaluation more than ``max_steps`` allows."""


@dataclass
class OptimizationResult:
    """The converged geometry, its GradientResult, and every evaluated step: energies (Hartree),
    max |gradient component| (Eh/bohr) and coordinates (Å)."""

    geometry: Geometry
    last: GradientResult
    energies: list = field(default_factory=list)
    gmax: list = field(default_factory=list)
    coords: list = field(default_factory=list)
    converged: bool = False
    criteria: dict = field(default_factory=lambda: dict(CONVERGENCE))  # the set used, its five numbers

    @property
    def steps(self) -> int:
        return len(self.energies)

    def to_dict(self) -> dict:
        d = self.last.to_dict()
        d["optimization"] = {
            "converged": self.converged,
            "steps": self.steps,
            "energies": self.energies,
            "gmax": self.gmax,
            "convergence": dict(self.criteria),
            "optimizer": _optimizer_version(),
        }
        return d


def _optimizer_version() -> str:
    import geometric

    return f"geomeTRIC {geometric.__version__}"


def xyz_frame(geom: Geometry, coords_angstrom, comment: str) -> str:
    """One XYZ frame (Å)."""
    lines = [str(geom.natm), comment]
    lines += [f"{s:<2s} {x:16.10f} {y:16.10f} {z:16.10f}" for s, (x, y, z) in zip(geom.symbols, coords_angstrom)]
    return "\n".join(lines) + "\n"


def optimize(  # noqa: PLR0913
    geom: Geometry,
    options: RunOptions,
    method: str = "mp2",
    *,
    trajectory=None,
    final=None,
    max_steps: int = MAX_STEPS,
    convergence: str = "default",
    log=None,
    progress=None,
) -> OptimizationResult:
    """Minimise the ``method``'s energy (DF-MP2's, or a double hybrid's) from ``geom``; the
    gradient's own checks (``check_gradient_options``) before any work. ``trajectory``: path of the
    multi-frame XYZ written after each evaluation; ``final``: path of the last geometry's XYZ
    (written converged or not). OptimizationError when it does not converge in ``max_steps``.
    Each step's SCF starts from the previous step's density (``run_gradient``'s ``guess``, as
    the ASE calculator does; ``ran.scf.guess`` says which start was used); ``progress(done,
    total)`` is each energy run's pair-step progress. ``convergence``: one of CONVERGENCE_SETS
    (geomeTRIC's named criteria, e.g. 'gau_tight'; 'default' is CONVERGENCE)."""
    try:
        import geometric.engine
        import geometric.errors
        import geometric.internal
        import geometric.molecule
        import geometric.optimize
        import geometric.params
    except ImportError:
        raise InputError("dfmp2 optimize needs geomeTRIC: pip install geometric") from None
    if convergence not in CONVERGENCE_SETS:
        raise InputError(f"convergence must be one of {', '.join(CONVERGENCE_SETS)}, got {convergence!r}")
    options, method = check_gradient_options(geom, options, method)  # a double hybrid: its table key in both
    molecule.build_molecule(geom, options.basis, options.charge, options.multiplicity, ecp=options.ecp)  # as run
    out = OptimizationResult(geom, None)
    agreed = {"option max_steps": max_steps, "option convergence": convergence}  # over ranks: each rank's the same
    say = log or (lambda msg: None)
    evaluate = _evaluator(geom, options, method, out, max_steps, trajectory, progress, say, agreed)
    if geom.natm == 1:  # nothing to optimise: the one evaluation, converged
        evaluate(np.asarray(geom.coords_angstrom).ravel() / BOHR)
        out.converged = True
        _write_final(final, out, method, "converged")
        return out
    try:
        _run_geometric(geom, evaluate, out, max_steps, convergence)
    except (geometric.errors.GeomOptNotConvergedError, _StepLimit):
        _write_final(final, out, method, "not converged")
        raise OptimizationError(
            f"the geometry optimisation did not converge in {max_steps} steps (last max "
            f"|gradient| {out.gmax[-1]:.2e} Eh/bohr); the last geometry is written" + (f" to {final}" if final else ""),
            option="max_steps",
            result=out,
        ) from None
    out.converged = True
    _write_final(final, out, method, "converged")
    return out


def _evaluator(geom, options, method, out: OptimizationResult, max_steps, trajectory, progress, say, agreed):  # noqa: PLR0913 (the run's parameters, passed on)
    """``evaluate(coords_bohr) -> (energy, gradient)``: one gradient run at those coordinates,
    recorded in ``out`` and appended to the trajectory; each SCF after the first starts from the
    previous step's density. _StepLimit past ``max_steps`` evaluations. ``agreed``: the
    optimisation's own parameters the ranks agree on with the first step's input
    (``run_gradient``), before its SCF: ranks with other criteria would stop at other steps."""
    frames, density = [], []

    def evaluate(coords_bohr):
        if out.steps >= max_steps:
            raise _StepLimit
        g = dataclasses.replace(geom, coords_angstrom=np.asarray(coords_bohr).reshape(-1, 3) * BOHR)
        gr = run_gradient(
            g, options, method=method, progress=progress, guess=density[0] if density else None, agreed=agreed
        )
        density[:] = [gr.energy_run.ref.density()]  # the next step's SCF starts from this density
        out.last, out.geometry = gr, g
        out.energies.append(gr.energy)
        out.gmax.append(float(np.abs(gr.gradient).max()))
        out.coords.append(g.coords_angstrom.tolist())
        say(f"step {out.steps}: E({method.upper()}) = {gr.energy:.10f} Eh, max |g| = {out.gmax[-1]:.2e} Eh/bohr")
        frames.append(xyz_frame(g, g.coords_angstrom, f"step {out.steps} E({method.upper()}) = {gr.energy:.10f} Eh"))
        if trajectory is not None:
            write_text(trajectory, "".join(frames))
        return gr.energy, gr.gradient

    return evaluate


def _run_geometric(geom, evaluate, out: OptimizationResult, max_steps, convergence) -> None:
    """geomeTRIC's optimiser (TRIC coordinates, its step control) from ``geom`` over
    ``evaluate``, its log quiet below warnings; ``out.criteria``: the five numbers it applies.
    Raises geomeTRIC's GeomOptNotConvergedError, or _StepLimit from ``evaluate``."""
    import geometric.engine
    import geometric.internal
    import geometric.molecule
    import geometric.optimize
    import geometric.params

    class Engine(geometric.engine.Engine):
        def calc_new(self, coords, dirname):
            e, g = evaluate(coords)
            return {"energy": e, "gradient": np.asarray(g).ravel()}

    M = geometric.molecule.Molecule()
    M.elem = list(geom.symbols)
    M.xyzs = [np.asarray(geom.coords_angstrom, dtype=float)]
    M.build_topology()
    IC = geometric.internal.DelocalizedInternalCoordinates(M, build=True, connect=False, addcart=False)
    named = {} if convergence == "default" else {"convergence_set": convergence.upper()}
    params = geometric.params.OptParams(maxiter=max_steps, **(CONVERGENCE if convergence == "default" else named))
    out.criteria = {
        k: getattr(params, "Convergence_" + k.removeprefix("convergence_")) for k in CONVERGENCE
    }  # the five numbers geomeTRIC applies
    quiet = logging.getLogger("geometric")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        with tempfile.TemporaryDirectory(prefix="dfmp2-geometric-") as tmp:
            geometric.optimize.Optimize(
                np.asarray(geom.coords_angstrom).ravel() / BOHR, M, IC, Engine(M), tmp, params, print_info=False
            )
    finally:
        quiet.setLevel(level)


def _write_final(path, out: OptimizationResult, method: str, state: str) -> None:
    if path is not None and out.last is not None:
        write_text(
            path,
            xyz_frame(
                out.geometry,
                out.geometry.coords_angstrom,
                f"dfmp2 optimize ({state}, {out.steps} steps) E({method.upper()}) = "
                f"{out.energies[-1]:.10f} Eh; charge={out.last.result.charge} "
                f"multiplicity={out.last.result.multiplicity}",
            ),
        )
