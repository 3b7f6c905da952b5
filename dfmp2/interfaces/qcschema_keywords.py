"""An AtomicInput's keywords: dfmp2's own names (``dfmp2.interfaces.qcschema.KEYWORDS``, each a
RunOptions field) and Psi4's names where they map one to one, so that an input written for
QCEngine's Psi4 harness runs here unchanged (Psi4's names are case-insensitive, as in Psi4):

    freeze_core    true | false (or 1 | 0)    -> frozen_core (the previous noble-gas core, Psi4's TRUE)
    df_basis_mp2   the RI fitting basis        -> auxbasis
    mp2_type       df                          (the only MP2 dfmp2 computes; conv and cd refused)
    scf_type       df | mem_df | disk_df       -> scf_mode 'df'
                   pk | direct | out_of_core   -> scf_mode 'exact' (exact four-index integrals)
    basis          the orbital basis           (must be model.basis: QCSchema's place for it)

A keyword given under both names (``frozen_core`` and ``freeze_core``) must agree: conflicting
values are refused, never one silently preferred. Unknown keywords are refused in one line.
"""

from __future__ import annotations

import json

from dfmp2.errors import InputError, shown

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
SCF_TYPES = {"df": "df", "mem_df": "df", "disk_df": "df", "pk": "exact", "direct": "exact", "out_of_core": "exact"}


def _freeze_core(value):
    """(frozen_core, None) or (None, what it must be)."""
    text = str(value).strip().lower() if isinstance(value, (str, int)) else None
    if isinstance(value, bool):
        return value, None
    if text in _TRUE or text in _FALSE:
        return text in _TRUE, None
    return None, "true or false (dfmp2 freezes the previous noble-gas core, Psi4's TRUE, or nothing)"


def _df_basis_mp2(value):
    ok = isinstance(value, str) and value.strip()
    return (value.strip(), None) if ok else (None, "a fitting basis name (e.g. 'cc-pvdz-ri')")


def _scf_type(value):
    text = value.strip().lower() if isinstance(value, str) else None
    if text in SCF_TYPES:
        return SCF_TYPES[text], None
    return None, (f"one of {', '.join(SCF_TYPES)} (dfmp2's SCF is density-fitted, or exact with four-index integrals)")


# Psi4's name -> (the RunOptions field it sets, or None, its convert(value) -> (value, problem))
PSI4_KEYWORDS = {
    "freeze_core": ("frozen_core", _freeze_core),
    "df_basis_mp2": ("auxbasis", _df_basis_mp2),
    "scf_type": ("scf_mode", _scf_type),
    "mp2_type": (None, None),  # checked on its own (mp2_type_check)
    "basis": ("basis", None),  # checked against model.basis (basis_check)
}


def mp2_type_check(value, where: str) -> None:
    """``mp2_type``: 'df' is what dfmp2 computes; anything else (Psi4's conv, cd) is refused."""
    if isinstance(value, str) and value.strip().lower() == "df":
        return
    raise InputError(
        f"{where}: keyword mp2_type {shown(json.dumps(value), 30)} is not supported: dfmp2 computes "
        "density-fitted MP2 only (RI-MP2, Psi4's mp2_type df; the fitting basis is keywords.auxbasis "
        "or df_basis_mp2); use mp2_type 'df' or leave it out"
    )


def basis_check(value, model_basis, where: str) -> None:
    """``basis`` (Psi4's keyword): QCSchema gives the orbital basis in model.basis; the keyword is
    accepted when it names the same basis, and refused when it names another."""
    same = isinstance(value, str) and isinstance(model_basis, str)
    if same and value.strip().lower() == model_basis.strip().lower():
        return
    raise InputError(
        f"{where}: keyword basis {shown(json.dumps(value), 30)} conflicts with model.basis "
        f"{shown(json.dumps(model_basis, default=str), 30)}; give the orbital basis in model.basis only",
        option="basis",
    )


def _norm(value):
    return value.strip().lower() if isinstance(value, str) else value


def keyword_settings(keywords: dict, own: dict, model_basis, where: str) -> dict:
    """The RunOptions fields the AtomicInput's ``keywords`` set: ``own`` dfmp2's names
    ({name: check(value) -> problem or None}), and PSI4_KEYWORDS (case-insensitive). InputError
    (one line) for an unknown keyword, a value of the wrong kind, or one field given twice (under
    dfmp2's and Psi4's names) with values that differ."""
    settings, named = {}, {}
    for key, value in keywords.items():
        psi4 = key.lower() if isinstance(key, str) and key not in own else None
        if key not in own and psi4 not in PSI4_KEYWORDS:
            raise InputError(
                f"{where}: unknown keyword '{shown(key, 30)}'; use {', '.join(own)} "
                f"(or Psi4's {', '.join(PSI4_KEYWORDS)})"
            )
        if psi4 is None:
            problem = own[key](value)
            field, value = key, value.strip() if isinstance(value, str) else value
        else:
            field, convert = PSI4_KEYWORDS[psi4]
            if psi4 == "mp2_type":
                mp2_type_check(value, where)
                continue
            if psi4 == "basis":
                basis_check(value, model_basis, where)
                continue
            value, problem = convert(value)
            value = value if problem is None else keywords[key]
        if problem:
            raise InputError(f"{where}: keyword {key} must be {problem}, got {shown(json.dumps(value), 40)}")
        if field in settings and _norm(settings[field]) != _norm(value):
            raise InputError(
                f"{where}: keywords {named[field]} and {key} set the same thing ({field}) to different "
                f"values ({shown(json.dumps(settings[field]), 30)} and {shown(json.dumps(value), 30)}); give one",
                option=field,
            )
        settings[field], named[field] = value, named.get(field, key)
    return settings
