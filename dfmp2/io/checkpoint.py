"""Checkpoint and resume: one HDF5 file per run with what was asked (a fingerprint), the SCF,
B, and the (e_os, e_ss) of every finished block pair.

    /                attrs: format, format_version, fingerprint (JSON), occ_block, complete,
                            crc32 (of fingerprint and occ_block)
    /scf             attrs: e_hf, nocc, scf_mode, jk_auxbasis, cycles, crc32 (of those)
    /scf/mo_coeff    (nao, nmo) fp64      attrs: crc32
    /scf/mo_energy   (nmo,) fp64          attrs: crc32
    /scf/mo_occ, /scf/e_tot, /mol   PySCF's chkfile layout (occupations, E(HF), ``mol.dumps()``), for a
                     PySCF restart (``lib.chkfile.load_mol``, ``scf.chkfile.load(path, 'scf')``,
                     ``mf.from_chk(path)``); never read back here, so not checksummed
    /B               flat block-major B (dfmp2.df.outofcore), the pair step's dtype
                     attrs: complete, metric, metric_dropped, info_crc32 (of metric, metric_dropped)
    /B_crc           (nblocks,) int64: crc32 of each block of B as written, -1 before
    /pairs/sums      (npairs, 2) fp64: e_os, e_ss of each block pair (OccBlocks.pairs order)
    /pairs/crc       (npairs,) int64: crc32 of each finished pair's row of sums, -1 before
    /pairs/done      (npairs,) uint8: 1 once the pair's sums and crc are written, else 0

A UHF run (fingerprint 'reference' UHF) keeps both spins: /scf/mo_coeff (2, nao, nmo) and
/scf/mo_energy (2, nmo) stacked alpha, beta, the scf attributes nocc_beta, s2 (<S^2>) and engine
(who converged it) in its crc32; B^alpha in /B and B^beta in /B_beta (its crc32s in /B_beta_crc,
its own metric attributes); three pair sets in place of /pairs, each with sums, crc and done:
/pairs_aa and /pairs_bb (the same-spin block pairs I >= J of each channel, OccBlocks.pairs
order) and /pairs_ab (alpha block I by beta block J, I-major; the second column of its sums is
the rectangular kernel's unused same-spin term). A channel or set with nothing in it (the H
atom's beta) is not written.

Written as the run goes: the SCF once converged, B once fitted (out of core, B is written there
directly and is the run's only copy), then each block pair's sums (written, flushed, then its
done flag written and flushed, so a pair is either finished with its sums or not at all). Every
dataset is allocated when the file is created, so the later writes change no HDF5 metadata: a
run killed at any point (SIGKILL included) leaves a file that opens. HDF5's superblock-v3
"open for writing" flag is not used (default libver), since it would make a killed run's file
unreadable without h5clear.

On resume the fingerprint must match field by field (molecule, basis sets, charge, SCF mode,
frozen core, precision, device, dfmp2 version, shapes); the SCF and a complete B are read back,
finished pairs are not recomputed, and the final energy adds all pairs' sums in the same fixed
order as an uninterrupted run (outofcore.combine), so it is bitwise the same.

Integrity. Everything that is read back carries a crc32 (zlib) written with it and checked when
the checkpoint is opened for resuming: the fingerprint and blocking, the SCF arrays and numbers,
the metric, each finished pair's sums (its own entry, written before its done flag; a flag must
be 0 or 1), and every block of B (B_crc; all of B is read through once on resume, even when no
pair needs it, so a damaged file is refused rather than passed over). A mismatch is one
CheckpointError line: a flipped bit on disk never turns into a wrong energy.
"""

from __future__ import annotations

import functools
import json
import os
import stat
import zlib
from pathlib import Path

import numpy as np

from dfmp2.errors import InputError, file_kind
from dfmp2.io.outputs import writing

FORMAT = "dfmp2-checkpoint"
FORMAT_VERSION = 2  # 2: crc32 on every dataset read back


# HDF5's own bytes in a checkpoint (superblock, object headers, attributes, the fingerprint):
# 12.5 kB measured for water, fp64 and fp32, and benzene (h5py 3.16, HDF5 2.0); counted 2.5 times.
H5_OVERHEAD_BYTES = 32 * 1024


def size_mb(*, b_mb: float, nbasis: int, nmo: int, nblocks: int, nblocks_beta: int | None = None) -> float:
    """What a finished checkpoint holds on disk, in MB (1e6 B): B (``b_mb``, both spins' for UHF),
    its per-block crc32 (``nblocks`` int64; UHF: ``nblocks_beta`` more), the SCF (mo_coeff nbasis
    x nmo and mo_energy, fp64, per spin), every block pair's sums, crc and done flag (8 + 8 + 8 + 1
    B each; UHF: both same-spin sets and the alpha x beta set), and HDF5's own bytes (twice for
    UHF: more objects). The disk check before the run (``outputs.check_disk``) counts this, not B
    alone (27 % short for water)."""
    npairs = nblocks * (nblocks + 1) // 2
    spins, blocks = 1, nblocks
    if nblocks_beta is not None:
        npairs += nblocks_beta * (nblocks_beta + 1) // 2 + nblocks * nblocks_beta
        spins, blocks = 2, nblocks + nblocks_beta
    extra = blocks * 8 + spins * ((nbasis * nmo + nmo) * 8 + H5_OVERHEAD_BYTES) + npairs * 25
    return b_mb + extra / 1e6


class CheckpointError(InputError):
    """A checkpoint that cannot be used: missing, not HDF5, incomplete, corrupted or mismatched."""


def fingerprint(  # noqa: PLR0913
    *,
    mol,
    basis,
    auxbasis: str,
    scf_mode: str,
    frozen_core: bool,
    precision: str,
    device: str,
    simulate: bool,
    nfrozen: int,
    nocc: int,
    nvir: int,
    naux: int,
    ecp: dict | None = None,
    scf_conv_tol_grad: float | None = None,
    nocc_beta: int | None = None,
    scf_screen: float | None = None,
) -> dict:
    """What must be equal for a checkpoint to be reused (JSON-able; floats exactly). ``ecp``
    (``scf.ecp_info``) is recorded only when there is one, so all-electron checkpoints written
    before ECPs were supported still resume (an ECP changes nocc, which the shapes hold).
    ``nocc_beta`` (active beta occupied orbitals) marks a UHF run: 'reference' UHF and the beta
    count in the shapes (nocc, nvir are alpha's); RHF checkpoints carry neither, as before."""
    import dfmp2

    coords = np.asarray(mol.atom_coords(unit="Angstrom"), dtype=np.float64)
    fp: dict = {
        "dfmp2_version": dfmp2.__version__,
        "geometry": [[mol.atom_pure_symbol(i), *map(float, coords[i])] for i in range(mol.natm)],
        "charge": int(mol.charge),
        "spin": int(mol.spin),
        "basis": basis.lower() if isinstance(basis, str) else json.dumps(basis, sort_keys=True),
        "auxbasis": auxbasis.lower(),
        "scf_mode": scf_mode,
        "frozen_core": bool(frozen_core),
        "precision": precision,
        "device": device,
        "simulate": bool(simulate),
        "shapes": {
            "nbasis": int(mol.nao_nr()),
            "naux": int(naux),
            "nocc": int(nocc),
            "nvir": int(nvir),
            "nfrozen": int(nfrozen),
        },
    }
    if ecp:
        fp["ecp"] = ecp
    if nocc_beta is not None:
        fp["reference"] = "UHF"
        fp["shapes"]["nocc_beta"] = int(nocc_beta)
    if scf_conv_tol_grad is not None:  # a threshold other than the default (older checkpoints lack it)
        fp["scf_conv_tol_grad"] = float(scf_conv_tol_grad)
    if scf_screen is not None:  # the JK factor's screening other than the default (likewise)
        fp["scf_screen"] = float(scf_screen)
    return fp


def _omitted_defaults() -> dict:
    """The fingerprint's keys written only when they differ from their default (``fingerprint``:
    checkpoints written before they existed still resume), with that default: a missing one on
    either side means the default, so a resume with another value is named, both ways."""
    from dfmp2.options import SCF_CONV_TOL_GRAD, SCF_SCREEN

    return {
        "scf_conv_tol_grad": float(SCF_CONV_TOL_GRAD),
        "scf_screen": float(SCF_SCREEN),
        "ecp": None,
        "ranks": 1,  # a checkpoint over ranks (dfmp2.io.rank_checkpoint): the world size and
        "rank": 0,  # the rank whose file this is
    }


OMITTED_WHEN_DEFAULT = _omitted_defaults()
# fingerprint keys that are RunOptions fields (a mismatch names the option's flag beside --resume)
OPTION_KEYS: tuple[str, ...] = ("basis", "scf_mode", "frozen_core", "precision", "device", "simulate", "charge", "ecp")
OPTION_KEYS += ("scf_conv_tol_grad", "scf_screen")


def _ranks_text(n: int) -> str:
    return "one process" if n == 1 else f"{n} ranks"


def _check_ranks(path, stored: dict, current: dict) -> None:
    """CheckpointError (one line, naming both counts) when the checkpoint was written by another
    number of ranks than this run has: its B and pair sums are laid out by rank, and a resume on
    another count is refused rather than redistributed."""
    try:
        have = int(stored.get("ranks", 1))
    except (TypeError, ValueError):
        raise CheckpointError(f"checkpoint {path} is corrupted: its rank count is unreadable") from None
    want = int(current.get("ranks", 1))
    if have != want:
        raise CheckpointError(
            f"checkpoint {path} was written by {_ranks_text(have)} but this run has {_ranks_text(want)}; "
            f"resume it on {_ranks_text(have)} (a checkpoint is not redistributed over another rank count), "
            "or start afresh without resuming",
            option="resume",
        )


def _describe(value) -> str:
    s = json.dumps(value)
    return s if len(s) <= 60 else s[:57] + "..."


def _mismatch(path, stored: dict, current: dict) -> tuple[str, str | tuple] | None:
    """(the error line, the options it is about: 'resume' and the RunOptions field that differs)
    when the checkpoint's fingerprint ``stored`` is not the run's ``current``; None when they match."""
    kinds = [fp.get("reference", "RHF") for fp in (stored, current)]  # RHF checkpoints carry none
    if kinds[0] != kinds[1]:
        return (
            f"checkpoint {path} was written for another run: the reference is {kinds[0]} in the "
            f"checkpoint but {kinds[1]} here; resume with the same molecule and options, or start "
            "afresh without resuming",
            "resume",
        )
    # a key written only when not the default, absent on one side: the default there (both ways)
    defaults = {k: v for k, v in OMITTED_WHEN_DEFAULT.items() if k in stored or k in current}
    stored, current = {**defaults, **stored}, {**defaults, **current}
    for key in list(current) + [k for k in stored if k not in current]:
        if key not in stored or key not in current:
            where = "checkpoint's fingerprint" if key not in stored else "run here"
            return (
                f"checkpoint {path} cannot be compared: the {where} has no '{key}' (written by another dfmp2 version?)",
                "resume",
            )
        if stored[key] != current[key]:
            if key == "geometry":
                what = "the molecule differs (atoms or coordinates)"
                if len(stored[key]) == len(current[key]):
                    n = next(i for i, (a, b) in enumerate(zip(stored[key], current[key])) if a != b)
                    what = (
                        f"the molecule differs at atom {n + 1}: {_describe(stored[key][n])} in the "
                        f"checkpoint, {_describe(current[key][n])} here"
                    )
                else:
                    what = f"the molecule differs: {len(stored[key])} atoms in the checkpoint, {len(current[key])} here"
            else:
                what = f"{key} is {_describe(stored[key])} in the checkpoint but {_describe(current[key])} here"
            return (
                f"checkpoint {path} was written for another run: {what}; resume with the same "
                "molecule and options, or start afresh without resuming",
                ("resume", key) if key in OPTION_KEYS else "resume",
            )
    return None


def check_regular(path, option: str) -> None:
    """CheckpointError (one line, ``option``: 'checkpoint' or 'resume') when ``path`` exists and
    is not a regular file (after links): HDF5 cannot keep a checkpoint in /dev/null, a FIFO or a
    directory, and fails there with an internal error rather than a message."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise CheckpointError(f"checkpoint {path}: {e.strerror}", option=option) from None
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(
            f"checkpoint {path} is {file_kind(st.st_mode)}, not a regular file; give the path of a checkpoint file",
            option=option,
        )


def _writes(method):
    """A Checkpoint method that writes: a write the disk refuses (full, quota, EIO) is one
    DiskWriteError line naming the checkpoint (``outputs.writing``); the run's CheckpointSession
    then removes a checkpoint it created."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with writing(self.path, "checkpoint", "checkpoint"):
            return method(self, *args, **kwargs)

    return wrapper


class Checkpoint:
    """An open checkpoint file (h5py, read-write). Use ``create`` or ``resume``."""

    partial_pairs = False  # True: this file holds only some ranks' pairs (rank_checkpoint), even when complete

    def __init__(self, path: Path, f, fp: dict):
        self.path, self.f = Path(path), f
        self.closed = False  # close, abandon and discard close it once (HDF5 crashes on a second)
        self.unrestricted = fp.get("reference") == "UHF"

    @property
    def b_names(self) -> tuple[str, ...]:
        """B's dataset per spin channel (its crc32s in name + '_crc')."""
        return B_NAMES[: 2 if self.unrestricted else 1]

    @property
    def pair_sets(self) -> tuple[str, ...]:
        """The groups of block-pair sums: 'pairs' (RHF) or 'pairs_aa', 'pairs_bb', 'pairs_ab'."""
        return UHF_PAIR_SETS if self.unrestricted else ("pairs",)

    # ---- opening
    @classmethod
    def create(cls, path, fp: dict, *, occ_block: int) -> Checkpoint:
        """A new checkpoint at ``path``; refuses to overwrite an existing file."""

        path = Path(path)
        check_regular(path, "checkpoint")
        if path.exists():
            raise CheckpointError(
                f"checkpoint {path} already exists; resume it, or remove it to start afresh", option="checkpoint"
            )
        if not path.parent.is_dir():
            raise CheckpointError(f"checkpoint {path}: directory {path.parent} does not exist")
        try:
            with writing(path, "checkpoint", "checkpoint"):
                f = open_h5(path, "w-")
        except BaseException as e:  # the file did not exist before (checked above): remove it
            path.unlink(missing_ok=True)
            if isinstance(e, (OSError, RuntimeError)):
                raise CheckpointError(f"checkpoint {path} cannot be created: {e}") from None
            raise  # a refused write (DiskWriteError), an interrupt
        try:
            with writing(path, "checkpoint", "checkpoint"):
                cls._write_root(f, fp, occ_block)
        except BaseException:
            discard_h5(f, path)
            raise
        return cls(path, f, fp)

    @staticmethod
    def _write_root(f, fp: dict, occ_block: int) -> None:
        f.attrs["format"] = FORMAT
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["fingerprint"] = json.dumps(fp)
        f.attrs["occ_block"] = int(occ_block)
        f.attrs["crc32"] = attrs_crc(f.attrs, ROOT_ATTRS)
        f.attrs["complete"] = 0
        f.flush()

    @classmethod
    def resume(cls, path, fp: dict) -> Checkpoint:
        """Open ``path`` for resuming a run with fingerprint ``fp``; CheckpointError (one line)
        when it is missing, not a regular file, not a dfmp2 checkpoint, corrupted or written for
        another run."""
        import h5py

        path = Path(path)
        if not path.exists():
            raise CheckpointError(
                f"checkpoint {path} does not exist; start a run that writes a checkpoint there, then resume it",
                option="resume",
            )
        check_regular(path, "resume")
        try:
            f = open_h5(path, "r+")
        except OSError as e:
            if not h5py.is_hdf5(path):
                raise CheckpointError(
                    f"checkpoint {path} is corrupted or not a dfmp2 checkpoint: not an HDF5 file"
                ) from None
            raise CheckpointError(
                f"checkpoint {path} is corrupted, or in use by another run: HDF5 cannot open it ({e})"
            ) from None
        ok = False
        try:
            if f.attrs.get("format") != FORMAT:
                raise CheckpointError(f"checkpoint {path} is not a dfmp2 checkpoint (no '{FORMAT}' format mark)")
            if int(f.attrs.get("format_version", -1)) != FORMAT_VERSION:
                raise CheckpointError(
                    f"checkpoint {path} has format version {f.attrs.get('format_version')}, "
                    f"this dfmp2 reads {FORMAT_VERSION}"
                )
            try:
                ok_crc = f.attrs["crc32"] == attrs_crc(f.attrs, ROOT_ATTRS)
            except (KeyError, ValueError, TypeError):
                ok_crc = False
            if not ok_crc:
                raise CheckpointError(
                    f"checkpoint {path} is corrupted: its fingerprint or blocking fails "
                    "its checksum; remove the file and run again"
                )
            try:
                stored = json.loads(f.attrs["fingerprint"])
                int(f.attrs["occ_block"])
            except (KeyError, ValueError, TypeError):
                raise CheckpointError(
                    f"checkpoint {path} is corrupted: its fingerprint is missing or unreadable"
                ) from None
            _check_ranks(path, stored, fp)
            msg = _mismatch(path, stored, fp)
            if msg:
                raise CheckpointError(msg[0], option=msg[1])
            ck = cls(path, f, fp)
            ck._check_structure()
            ok = True
            return ck
        finally:
            if not ok:
                f.close()

    def _require(self, name: str, shape=None):
        if name not in self.f:
            raise CheckpointError(f"checkpoint {self.path} is corrupted: dataset '{name}' is missing")
        d = self.f[name]
        if shape is not None and d.shape != tuple(shape):
            raise CheckpointError(
                f"checkpoint {self.path} is corrupted: '{name}' has shape {d.shape}, expected {tuple(shape)}"
            )
        return d

    def _check_structure(self) -> None:  # noqa: C901
        """What was written must be whole: SCF both arrays, B with its checksums, pairs both."""
        try:
            if "scf" in self.f:
                spins = (2,) if self.unrestricted else ()
                c = self._require("scf/mo_coeff")
                if c.ndim != len(spins) + 2 or c.shape[: len(spins)] != spins:
                    raise CheckpointError(
                        f"checkpoint {self.path} is corrupted: 'scf/mo_coeff' has shape "
                        f"{c.shape}, expected {len(spins) + 2} axes"
                    )
                self._require("scf/mo_energy", spins + (c.shape[-1],))
                for a in SCF_ATTRS + (UHF_SCF_ATTRS if self.unrestricted else ()):
                    if a not in self.f["scf"].attrs:
                        raise CheckpointError(f"checkpoint {self.path} is corrupted: scf has no '{a}'")
            touch = ["scf/mo_coeff", "scf/mo_energy"]
            for g in self.pair_sets:
                if g in self.f:
                    s = self._require(f"{g}/sums")
                    self._require(f"{g}/done", (s.shape[0],))
                    self._require(f"{g}/crc", (s.shape[0],))
                    touch += [f"{g}/{n}" for n in ("sums", "done", "crc")]
            for b in self.b_names:
                if b in self.f:
                    self._require(b + "_crc")
                    touch.append(b + "_crc")
            for name in touch:  # touch the data so a truncated file fails here, not mid-run
                if name in self.f:
                    self.f[name][...]
            self._verify()
        except CheckpointError:
            raise
        except (OSError, KeyError, ValueError) as e:
            raise CheckpointError(f"checkpoint {self.path} is corrupted: {e}") from None

    def _corrupted(self, what: str) -> CheckpointError:
        return CheckpointError(
            f"checkpoint {self.path} is corrupted: {what} fails its checksum; remove the file and run again"
        )

    def _verify(self) -> None:
        """Check the crc32 of everything read back except B's blocks (checked as they are read:
        outofcore.HDF5B): the SCF, the metric of a complete B, the finished pairs."""
        if "scf" in self.f:
            g = self.f["scf"]
            for name in ("mo_coeff", "mo_energy"):
                if g[name].attrs.get("crc32") != block_crc(g[name][...]):
                    raise self._corrupted(f"scf/{name}")
            if g.attrs.get("crc32") != attrs_crc(g.attrs, self.scf_attrs):
                raise self._corrupted("the SCF energy or occupation (scf attributes)")
        for c, b in enumerate(self.b_names):
            if self.b_done(c) and self.f[b].attrs.get("info_crc32") != attrs_crc(self.f[b].attrs, B_ATTRS):
                raise self._corrupted(f"the metric of {b} ({b} attributes)")
        for g in self.pair_sets:
            if g in self.f:
                self._verify_pairs(g)

    def _verify_pairs(self, g: str) -> None:
        """The done flags (0 or 1) and finished pairs' crc32 of the pair set ``g``."""
        done, sums, crc = (self.f[f"{g}/{n}"][...] for n in ("done", "sums", "crc"))
        where = "" if g == "pairs" else f" of {g}"
        bad = np.flatnonzero(done > 1)
        if bad.size:
            raise CheckpointError(
                f"checkpoint {self.path} is corrupted: pair {bad[0]}{where} has done flag "
                f"{done[bad[0]]} (0 or 1 expected); remove the file and run again"
            )
        for p in np.flatnonzero(done):
            if crc[p] != block_crc(sums[p]):
                raise self._corrupted(f"the sums of block pair {p}{where}")
        if int(self.f.attrs.get("complete", 0)) and not done.all() and not self.partial_pairs:
            raise CheckpointError(
                f"checkpoint {self.path} is corrupted: it is marked complete but "
                f"{int((done == 0).sum())} block pairs{where} are not done; remove the "
                "file and run again"
            )

    @property
    def scf_attrs(self) -> tuple[str, ...]:
        return SCF_ATTRS + (UHF_SCF_ATTRS if self.unrestricted else ())

    @property
    def occ_block(self) -> int:
        return int(self.f.attrs["occ_block"])

    # ---- SCF
    @property
    def has_scf(self) -> bool:
        return "scf" in self.f

    def _fresh_group(self, name: str):
        if name in self.f:  # left by a run killed between create and move
            del self.f[name]
        return self.f.create_group(name)

    @_writes
    def save_scf(self, ref, scf_mode: str, mol=None) -> None:
        """Write the RHF or UHF ``ref`` (dfmp2.reference.Reference, nothing frozen) of ``scf_mode``
        (UHF: both channels stacked, nocc_beta and <S^2> with the attributes). For PySCF, beside
        ours (never read back here, so without crc32): /scf/mo_occ, /scf/e_tot and, given the
        PySCF ``mol``, /mol (``mol.dumps()``), the layout of PySCF's chkfile: ``scf.chkfile.load(path,
        'scf')``, ``lib.chkfile.load_mol(path)`` and ``mf.init_guess = 'chk'`` read it."""
        assert len(ref.channels) == (2 if self.unrestricted else 1), (len(ref.channels), self.unrestricted)
        g = self._fresh_group("scf_tmp")
        for name in ("mo_coeff", "mo_energy"):
            a = np.ascontiguousarray(
                np.stack([getattr(ch, name) for ch in ref.channels])
                if self.unrestricted
                else getattr(ref.channels[0], name),
                dtype=np.float64,
            )
            g.create_dataset(name, data=a).attrs["crc32"] = block_crc(a)
        occ = [np.where(np.arange(ch.nmo) < ch.nocc, 1.0 if self.unrestricted else 2.0, 0.0) for ch in ref.channels]
        g.create_dataset("mo_occ", data=np.stack(occ) if self.unrestricted else occ[0])  # PySCF's
        g.create_dataset("e_tot", data=float(ref.e_hf))  # PySCF's
        if mol is not None:
            if "mol" in self.f:
                del self.f["mol"]
            self.f.create_dataset("mol", data=mol.dumps())  # PySCF's lib.chkfile.save_mol layout
        g.attrs["e_hf"] = float(ref.e_hf)
        g.attrs["nocc"] = int(ref.channels[0].nocc)
        g.attrs["scf_mode"] = scf_mode
        g.attrs["jk_auxbasis"] = ref.jk_auxbasis or ""
        g.attrs["cycles"] = int(ref.scf.iterations or 0)
        if self.unrestricted:
            g.attrs["nocc_beta"] = int(ref.channels[1].nocc)
            g.attrs["s2"] = float(ref.s2)
            g.attrs["engine"] = ref.scf.engine  # ours (--scf df) or PySCF's (pyscf-df, exact)
        g.attrs["crc32"] = attrs_crc(g.attrs, self.scf_attrs)
        self.f.flush()
        self.f.move("scf_tmp", "scf")  # appears whole or not at all
        self.f.flush()

    def load_scf(self):
        """The Reference written by ``save_scf`` (source 'checkpoint'; its ScfRecord says
        which engine converged it, on which device, in how many iterations)."""
        from dfmp2.options import SCF_CONV_TOL_GRAD
        from dfmp2.provenance import ScfRecord
        from dfmp2.reference import OUR_SCF_NAMES, restricted, unrestricted

        g = self.f["scf"]
        kind = "UHF" if self.unrestricted else "RHF"
        try:
            mode, cycles = str(g.attrs["scf_mode"]), int(g.attrs["cycles"]) or None
            fp = json.loads(self.f.attrs["fingerprint"])
            jk_aux = str(g.attrs["jk_auxbasis"]) or None
            ours = (str(g.attrs["engine"]) in OUR_SCF_NAMES) if self.unrestricted else mode == "df"
            record = ScfRecord(
                engine=OUR_SCF_NAMES[0] if ours else "pyscf",
                reference=kind,
                device=fp.get("device", "host") if ours else "host",
                conv_tol_grad=fp.get("scf_conv_tol_grad", SCF_CONV_TOL_GRAD),
                source="checkpoint",
                iterations=cycles,
                jk_auxbasis=jk_aux,
                jk=f"{OUR_SCF_NAMES[0]} (DF-J/K)" if ours else ("pyscf.df (DF-J/K)" if jk_aux else "pyscf (exact J/K)"),
                checkpoint=str(self.path),
            )
            C, e, nocc = g["mo_coeff"][...], g["mo_energy"][...], int(g.attrs["nocc"])
            args: dict = dict(e_hf=float(g.attrs["e_hf"]), source="checkpoint", scf=record, jk_auxbasis=jk_aux)
            if self.unrestricted:
                return unrestricted(C, e, (nocc, int(g.attrs["nocc_beta"])), s2=float(g.attrs["s2"]), **args)
            return restricted(C, e, nocc, **args)
        except (OSError, KeyError) as e:
            raise CheckpointError(f"checkpoint {self.path} is corrupted: scf: {e}") from None

    # ---- B, one dataset per spin channel (``channel`` 0: alpha or RHF's, 1: beta)
    @_writes
    def b_dataset(self, blocks, dtype, channel: int = 0):
        """The B dataset of ``channel`` for ``blocks`` in ``dtype`` (torch), allocated in full now;
        an incomplete one from an interrupted build is replaced."""
        import h5py
        import torch

        name = self.b_names[channel]
        npdt = torch.empty(0, dtype=dtype).numpy().dtype
        if self.b_done(channel):
            return self._require(name, (blocks.size,))
        for n in (name, name + "_crc"):
            if n in self.f:
                del self.f[n]
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)  # no metadata change at the first write
        d = self.f.create_dataset(name, shape=(blocks.size,), dtype=npdt, dcpl=dcpl, fill_time="never")
        d.attrs["complete"] = 0
        self.f.create_dataset(name + "_crc", data=np.full(blocks.count, -1, dtype=np.int64))
        self.f.flush()
        return d

    def b_done(self, channel: int = 0) -> bool:
        """Whether the B of ``channel`` is complete."""
        name = self.b_names[channel]
        return name in self.f and bool(self.f[name].attrs.get("complete", 0))

    @property
    def b_complete(self) -> bool:
        """Every channel's B is complete."""
        return all(self.b_done(c) for c in range(len(self.b_names)))

    @_writes
    def mark_b_complete(self, metric_kind: str, metric_info: dict, channel: int = 0) -> None:
        d = self.f[self.b_names[channel]]
        d.attrs["metric"] = metric_kind
        d.attrs["metric_dropped"] = int(metric_info.get("dropped", 0))
        d.attrs["info_crc32"] = attrs_crc(d.attrs, B_ATTRS)
        self.f.flush()
        d.attrs["complete"] = 1
        self.f.flush()

    def metric(self, channel: int = 0) -> tuple[str, dict]:
        d = self.f[self.b_names[channel]]
        kind = str(d.attrs.get("metric", "cholesky"))
        return kind, ({"dropped": int(d.attrs.get("metric_dropped", 0))} if kind == "eigh" else {})

    def crc_dataset(self, channel: int = 0):
        return self.f[self.b_names[channel] + "_crc"]

    # ---- pair sums, per pair set (``group``: one of ``pair_sets``)
    @_writes
    def init_pairs(self, npairs: int, group: str = "pairs") -> None:
        if group in self.f:
            self._require(f"{group}/sums", (npairs, 2))
            return
        g = self._fresh_group(group + "_tmp")
        g.create_dataset("sums", data=np.zeros((npairs, 2), dtype=np.float64))
        g.create_dataset("crc", data=np.full(npairs, -1, dtype=np.int64))
        g.create_dataset("done", data=np.zeros(npairs, dtype=np.uint8))
        self.f.flush()
        self.f.move(group + "_tmp", group)
        self.f.flush()

    def load_pairs(self, group: str = "pairs") -> tuple[np.ndarray, np.ndarray]:
        """(done (npairs,) bool, sums (npairs, 2))."""
        return self.f[f"{group}/done"][...].astype(bool), self.f[f"{group}/sums"][...]

    @_writes
    def save_pair(self, p: int, e_os: float, e_ss: float, group: str = "pairs") -> None:
        row = np.array([e_os, e_ss], dtype=np.float64)
        self.f[f"{group}/sums"][p] = row
        self.f[f"{group}/crc"][p] = block_crc(row)
        self.f.flush()
        self.f[f"{group}/done"][p] = 1
        self.f.flush()

    def pair_session(self, npairs: int, group: str = "pairs"):
        """(done, sums) of the pair set ``group`` (made for ``npairs`` pairs if new) and the
        ``on_pair(p, e_os, e_ss)`` that saves each finished one: what the pair loops take."""
        self.init_pairs(npairs, group)
        return self.load_pairs(group), functools.partial(self.save_pair, group=group)

    @_writes
    def mark_complete(self, e_os: float, e_ss: float) -> None:
        self.f.attrs["e_os"] = e_os
        self.f.attrs["e_ss"] = e_ss
        self.f.attrs["complete"] = 1
        self.f.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.f.close()
        except Exception:  # closing after an interrupt: nothing more to save (a refused
            pass  # write closes through abandon: a half-closed file is not touched)

    def discard(self) -> None:
        """Close, writing nothing more, and delete the file (a run that failed before it held
        anything to resume)."""
        self.abandon()
        self.path.unlink(missing_ok=True)

    def abandon(self) -> None:
        """Close after a write the disk refused, writing nothing more (``close_unwritten``): the
        file keeps what was flushed, so a resumed run can go on from there."""
        if not self.closed:
            self.closed = True
            close_unwritten(self.f)


def open_h5(path, mode: str):
    """``h5py.File(path, mode)`` ('w', 'w-' or 'r+') with HDF5's data sieve buffer off, for the
    files a run writes (the checkpoint, scratch B). Every write then reaches the disk in the call
    that makes it, so a write the disk refuses fails there (one DiskWriteError through
    ``outputs.writing``). With the buffer (64 kB), a small write (a crc, a pair's sums) failed
    later, when HDF5 flushed it while releasing a dataset: h5py only prints such an error
    ('Exception ignored'), the run went on, and HDF5, left half closed, segfaulted at exit."""
    import h5py

    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_EARLIEST, h5py.h5f.LIBVER_LATEST)  # h5py's default
    fapl.set_sieve_buf_size(0)
    name = os.fsencode(str(path))
    if mode == "r+":
        fid = h5py.h5f.open(name, h5py.h5f.ACC_RDWR, fapl=fapl)
    else:
        fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
        fcpl.set_obj_track_times(False)  # h5py's default
        fid = h5py.h5f.create(name, {"w": h5py.h5f.ACC_TRUNC, "w-": h5py.h5f.ACC_EXCL}[mode], fapl=fapl, fcpl=fcpl)
    return h5py.File(fid)


def close_unwritten(f) -> None:
    """Close the open h5py file ``f`` writing nothing more to it: its file descriptor is pointed at
    an anonymous in-memory file first (memfd; /dev/null where there is none), which takes HDF5's
    last writes and the resize of its close. After a write the disk refused (ENOSPC), HDF5's
    close would write the data and metadata it still holds and fail again; a failed close leaves
    HDF5's objects half closed, and their next release crashes the interpreter (a segfault, seen
    at exit). On disk the file keeps what was flushed before, which is what a checkpoint's
    readers trust (its done flags)."""
    if not f:  # closed already (HDF5 would crash on its file handle)
        return
    try:
        fd = f.id.get_vfd_handle()
        null = os.memfd_create("dfmp2-discarded") if hasattr(os, "memfd_create") else os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
    except Exception:  # not a POSIX file driver: closed as it is
        pass
    try:
        f.close()
    except Exception:
        pass


def discard_h5(f, path) -> None:
    """Close the open h5py file ``f`` without writing more (``close_unwritten``) and delete its
    ``path``."""
    close_unwritten(f)
    Path(path).unlink(missing_ok=True)


def block_crc(arr: np.ndarray) -> int:
    """crc32 of an array's bytes (zlib releases the GIL on large buffers)."""
    # numpy's stubs give ndarray the buffer protocol from Python 3.12 on only (mypy checks 3.10)
    return zlib.crc32(memoryview(np.ascontiguousarray(arr)).cast("B"))  # type: ignore[arg-type]


ROOT_ATTRS = ("fingerprint", "occ_block")
SCF_ATTRS = ("e_hf", "nocc", "scf_mode", "jk_auxbasis", "cycles")
UHF_SCF_ATTRS = ("nocc_beta", "s2", "engine")  # a UHF's scf attributes, in its crc32 too
B_NAMES = ("B", "B_beta")  # B per spin channel
UHF_PAIR_SETS = ("pairs_aa", "pairs_bb", "pairs_ab")
B_ATTRS = ("metric", "metric_dropped")


def attrs_crc(attrs, names) -> int:
    """crc32 of the HDF5 attributes ``names`` (floats by their exact hex form); KeyError when one
    is missing."""

    def plain(v):
        if isinstance(v, (float, np.floating)):
            return float(v).hex()
        if isinstance(v, (int, np.integer)):
            return int(v)
        return v.decode() if isinstance(v, bytes) else str(v)

    return zlib.crc32(json.dumps([plain(attrs[n]) for n in names]).encode())
