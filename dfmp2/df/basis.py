"""The fitting sets (auxiliary bases) of the density fitting: which set each atom gets.

``default_auxbasis(mol, kind)`` the JK-fit ('jk', our DF-SCF and PySCF's) or MP2-fit ('mp2')
set per atom kind, as a dict {element or atom label: set name, or generated shells};
``mp2_auxbasis`` the MP2 stage's (a caller's choice checked, else the default);
``auxbasis_note`` a line on sets taken from a fallback or the Basis Set Exchange;
``make_auxmol`` the auxiliary Mole (its nao_nr() is naux); ``describe_auxbasis`` a short text of a
spec for records; ``is_fitting_set`` whether a name is a fitting set. The rule is in the comment
above AUX_KINDS. Element and orbital-basis look-ups come from dfmp2.io.molecule.
"""

from __future__ import annotations

import warnings

from pyscf import df, gto
from pyscf.df.addons import predefined_auxbasis
from pyscf.gto.basis import _format_basis_name, _is_pople_basis

from dfmp2.errors import InputError
from dfmp2.io.molecule import GHOST_PREFIX, _check_basis, _defines, element, orbital_basis_names

# Default auxiliary bases. Per atom kind (an element, or an atom label where atoms of one element
# carry different orbital bases): the orbital basis of that atom (``mol.basis`` a name, or a dict
# per element/label with an optional 'default', looked up as PySCF's make_env does), then the
# fitting sets matched to it (PySCF's rule, pyscf.df.addons.predefined_auxbasis: Psi4's table,
# then the Basis Set Exchange metadata; Pople names without their polarisation marks, as
# pyscf.df.make_auxbasis does: 6-31g** -> 6-31g -> cc-pvdz-*; then the set the BSE metadata
# names for that orbital basis: def2-SVP -> def2-SVP-RIFIT), the first that defines the element.
# Sets that only the Basis Set Exchange package has (no PySCF basis file: def2-SVP-RIFIT and
# def2-TZVP-RIFIT, Hellweg et al. 2007, for Rb-Rn; cc-pVXZ-PP-RIFIT) are taken beyond Kr, for an
# element carrying an ECP (they are made for the def2/PP ECPs), so that nothing through Kr depends
# on whether that package is installed. Otherwise a fallback: Weigend's def2-universal-JKFIT for
# the DF-SCF and Hättig's def2-TZVPP-RI for MP2, both all-electron through Kr and defined for every
# element there (cc-pvdz-jkfit lacks He, Li, Be, Na, Mg, Ca, Sc-Zn; cc-pvdz-ri lacks Ca, Sc-Zn).
# Beyond Kr these sets are built for the def2 ECPs: an element carrying an ECP gets them where
# PySCF has them (def2-universal-jkfit does, PySCF's def2-*-ri files stop at Kr), an all-electron
# one gets PySCF's AutoAux (Stoychev, Auer, Neese, JCTC 13, 554 (2017)), generated from the
# orbital basis itself, instead; so does an atom whose orbital basis was given as shells.
AUX_KINDS = {"jk": "JK-fit", "mp2": "MP2-fit"}
AUX_FALLBACK = {"jk": "def2-universal-jkfit", "mp2": "def2-tzvpp-ri"}
AUX_FALLBACK_MAX_Z = 36
AUTOAUX = "autoaux"
BSE_AUX_ROLE = {"jk": "jkfit", "mp2": "rifit"}  # the BSE metadata's names of the two roles
BSE_PACKAGE = "basis-set-exchange"


def bse_version() -> str | None:
    """The installed Basis Set Exchange package's version (None: not installed). PySCF's basis
    loader reads a set that is not among its own files through that package."""
    try:
        import basis_set_exchange
    except ImportError:
        return None
    return str(basis_set_exchange.version())


def from_bse(name: str) -> bool:
    """Whether basis ``name`` is one that only the Basis Set Exchange package supplies (the BSE
    knows it, PySCF has no file for it): def2-svp-rifit, cc-pvdz-pp-rifit."""
    alias = _format_basis_name(name)
    return alias not in gto.basis.ALIAS and alias in getattr(gto.mole, "BSE_META", {})


def _aux_keys(mol: gto.Mole) -> dict:
    """{key of the auxiliary-basis dict: (element, orbital basis name or None)}: the element where
    all its atoms (ghosts included) carry one orbital basis, else each atom label on its own
    (PySCF's make_auxmol looks a label up before its element)."""
    names = orbital_basis_names(mol)
    by_el: dict = {}
    for i in range(mol.natm):
        label = mol._atom[i][0]
        by_el.setdefault(element(mol, i), {})[label] = names[label]
    out = {}
    for el, labels in by_el.items():
        if len(set(labels.values())) == 1:
            out[el] = (el, next(iter(labels.values())))
        else:
            out.update({label: (el, obs) for label, obs in labels.items()})
    return out


def _matched_sets(mol: gto.Mole, obs: str | None, kind: str) -> list[str]:
    """The fitting sets matched to orbital basis ``obs`` (first choice first; [] for shells):
    PySCF's choice (``predefined_auxbasis``) and the BSE metadata's, for the name and for its
    Pople stem (6-31g** -> 6-31g, as make_auxbasis does); whether one defines an element is
    decided per element (``_default_set``)."""
    if not isinstance(obs, str):
        return []
    names = [obs]
    alias = _format_basis_name(obs)
    if _is_pople_basis(alias):
        names.append(alias.split("g")[0] + "g")
    out = []
    for name in names:
        meta = getattr(gto.mole, "BSE_META", {}).get(_format_basis_name(name).lower())
        bse_aux = meta[2].get(BSE_AUX_ROLE[kind]) if meta else None
        for aux in (predefined_auxbasis(mol, name, "HF", kind == "mp2"), bse_aux):
            if isinstance(aux, str) and aux not in out:
                out.append(aux)
    return out


def _default_set(mol: gto.Mole, el: str, obs: str | None, kind: str, has_ecp: bool) -> str:
    """The default fitting set of ``kind`` for element ``el`` with orbital basis ``obs`` (the rule
    above AUX_KINDS): a matched set, the def2 fallback, else AUTOAUX. A set only the Basis Set
    Exchange package has, needed while that package is missing, is an InputError naming it."""
    beyond_kr = gto.charge(el) > AUX_FALLBACK_MAX_Z
    for name in _matched_sets(mol, obs, kind):
        if from_bse(name):
            if not (beyond_kr and has_ecp):
                continue
            if bse_version() is None:
                raise InputError(
                    f"the {AUX_KINDS[kind]} set matched to basis {obs} for {el} is {name}, "
                    f"published in the Basis Set Exchange, whose package is not installed; "
                    f"install it (pip install {BSE_PACKAGE}; a dependency of dfmp2)"
                )
        if _defines(name, el):
            return name
    if (not beyond_kr or has_ecp) and _defines(AUX_FALLBACK[kind], el):
        return AUX_FALLBACK[kind]
    return AUTOAUX


def default_auxbasis(mol: gto.Mole, kind: str) -> dict:
    """The default auxiliary basis for ``kind`` ('jk': the DF-SCF, 'mp2': the MP2 fit), per element
    symbol (per atom label where atoms of one element carry different orbital bases, see
    ``_aux_keys``): the matched set if it defines the element (the Basis Set Exchange's published
    sets beyond Kr included), else AUX_FALLBACK[kind] (through Kr, and beyond Kr for an element
    carrying an ECP: the def2 fitting sets are made for the def2 ECPs), else AutoAux (see the rule
    above AUX_KINDS), else, where PySCF's AutoAux cannot be generated from the orbital basis
    (LANL2DZ's s/p-only shells of I and Sn: an IndexError inside it), PySCF's own default for an
    unknown basis, the even-tempered set of ``df.addons.aug_etb``. The result's warnings name
    every fallback and every set taken from the Basis Set Exchange (``auxbasis_note``)."""
    with_ecp = {element(mol, i) for i in range(mol.natm) if mol.atom_nelec_core(i)}
    out = {
        key: _default_set(mol, el, obs, kind, el in with_ecp)  # a ghost atom: its element's set
        for key, (el, obs) in _aux_keys(mol).items()
    }
    if AUTOAUX in out.values():
        try:
            make_auxmol(mol, out)
        except (IndexError, KeyError, ValueError, RuntimeError):
            etb = df.addons.aug_etb(mol)
            out = {
                key: name if name != AUTOAUX else etb.get(key, etb.get(GHOST_PREFIX + key)) for key, name in out.items()
            }
    return out


def auxbasis_note(mol: gto.Mole, auxbasis, kind: str) -> str | None:
    """One line saying which elements got a fallback auxiliary basis instead of the set matched
    to their orbital basis, and which got a published set from the Basis Set Exchange package
    (not among PySCF's own files: PySCF's make_auxbasis gives those elements even-tempered sets);
    None when every element has a matched set from PySCF's files, or the user chose."""
    if isinstance(auxbasis, str):
        return None
    fallback: dict = {}  # orbital basis -> {fitting set: [keys]}
    bse: dict = {}  # fitting set -> [keys]
    for key, (_, obs) in _aux_keys(mol).items():
        name = auxbasis.get(key)
        matched = _matched_sets(mol, obs, kind)
        if isinstance(name, str) and name in matched:
            if from_bse(name):
                bse.setdefault(name, []).append(key)
            continue
        label = name if isinstance(name, str) else "even-tempered"
        fallback.setdefault(obs, {}).setdefault(label, []).append(key)
    parts = [
        f"{name} used for {', '.join(keys)} (the published {AUX_KINDS[kind]} set from the Basis "
        f"Set Exchange, {BSE_PACKAGE} {bse_version()}; PySCF's own basis files lack it)"
        for name, keys in bse.items()
    ]
    for obs, by_name in fallback.items():
        used = "; ".join(f"{name} used for {', '.join(keys)}" for name, keys in by_name.items())
        matched = _matched_sets(mol, obs, kind)
        if obs is None:
            parts.append(f"no {AUX_KINDS[kind]} set is matched to an orbital basis given as shells: {used} (fallback)")
        elif not matched:
            parts.append(f"no {AUX_KINDS[kind]} set is matched to basis {obs}: {used} (fallback)")
        else:
            lacking = ", ".join(k for keys in by_name.values() for k in keys)
            parts.append(
                f"the {AUX_KINDS[kind]} set matched to basis {obs} ({matched[0]}) lacks {lacking}: {used} (fallback)"
            )
    return "; ".join(parts) or None


def mp2_auxbasis(mol: gto.Mole, auxbasis: str | dict | None = None):
    """The MP2-fit auxiliary basis: the one given (a name, or {element: name or PySCF shells}
    covering every element), or ``default_auxbasis(mol, 'mp2')`` (cc-pVDZ -> cc-pVDZ-RI, with
    fallbacks for the elements it lacks)."""
    if auxbasis is None:
        return default_auxbasis(mol, "mp2")
    elements = [element(mol, i) for i in range(mol.natm)]
    if isinstance(auxbasis, dict):
        missing = sorted(set(elements) - set(auxbasis))
        if missing:
            raise InputError(
                f"the auxiliary basis given per element has no entry for {', '.join(missing)}", option="auxbasis"
            )
        for el in sorted(set(elements)):
            if isinstance(auxbasis[el], str):
                _check_basis(auxbasis[el], [el], "auxiliary basis", "auxbasis")
        return {el: auxbasis[el] for el in dict.fromkeys(elements)}
    _check_basis(auxbasis, elements, "auxiliary basis", "auxbasis")
    return auxbasis


def is_fitting_set(name: str) -> bool:
    """Whether a basis name is a density-fitting set (JK-fit, RI/MP2-fit, J-fit, AutoAux)."""
    n = _format_basis_name(name)
    return "fit" in n or n.endswith("ri") or n == AUTOAUX or n.startswith(("weigend", "ahlrichs", "demon"))


def make_auxmol(mol: gto.Mole, auxbasis) -> gto.Mole:
    """The auxiliary-basis molecule (same atoms, fitting functions)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return df.addons.make_auxmol(mol, _copy(auxbasis))


def _copy(auxbasis):
    """PySCF replaces 'autoaux' entries of a dict spec by the generated shells in place."""
    return dict(auxbasis) if isinstance(auxbasis, dict) else auxbasis


def describe_auxbasis(auxbasis) -> str:
    """Short text of an auxiliary basis spec: a name, or per element 'name (El, El) + name (El)'
    when the elements have different sets (a generated one reads 'even-tempered')."""
    if isinstance(auxbasis, str):
        return auxbasis
    by_name: dict = {}
    for el, v in auxbasis.items():
        by_name.setdefault(v if isinstance(v, str) else "even-tempered", []).append(el)
    if len(by_name) == 1:
        return next(iter(by_name))
    fallbacks = {*AUX_FALLBACK.values(), AUTOAUX, "even-tempered"}
    order = sorted(by_name, key=lambda name: name in fallbacks)  # matched set first
    return " + ".join(f"{name} ({', '.join(by_name[name])})" for name in order)
