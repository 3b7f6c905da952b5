"""The installed package: everything lives under ``dfmp2``, under one name each,
and ships its inputs.

``dfmp2/linalg``, ``dfmp2/kernels`` and ``dfmp2/inputs`` are committed links to the repository's
top-level folders; the bare names (``import linalg``) refuse to load, so no class is ever loaded
twice under two names. A wheel built from this checkout is installed into a fresh virtual
environment (its dependencies seen through a path file naming this interpreter's site-packages,
so nothing is downloaded and this environment's own dfmp2 is not visible there), and ``dfmp2
run``, ``dfmp2 regress`` and the Python API run from a directory outside the checkout.
"""

import ast
import json
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
LINKS = {"linalg": "../linalg", "kernels": "../kernels", "inputs": "../inputs"}  # dfmp2/<name> -> target


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_the_links_and_pyproject_ship_every_package():
    for name, target in LINKS.items():
        link = ROOT / "dfmp2" / name
        assert link.is_symlink() and os.readlink(link) == target, link
    cfg = _pyproject()
    assert cfg["package-dir"] == {"": "."}  # an editable install is a plain path entry
    from setuptools import find_packages

    found = set(find_packages(str(ROOT), include=cfg["packages"]["find"]["include"]))
    on_disk = {
        ".".join(("dfmp2",) + init.parent.relative_to(ROOT / "dfmp2").parts)
        for init in (ROOT / "dfmp2").rglob("*/__init__.py")
    } | {"dfmp2"}
    for top in ("linalg", "kernels"):
        on_disk |= {
            ".".join(("dfmp2", top) + init.parent.relative_to(ROOT / top).parts)
            for init in (ROOT / top).rglob("__init__.py")
        }
    assert found == on_disk, found ^ on_disk
    assert "*.c" in cfg["package-data"]["dfmp2.kernels.cpu"]  # the CPU pair epilogue's source


def _version_literal() -> str:
    """dfmp2.__version__ as written in dfmp2/__init__.py (a plain string literal)."""
    for node in ast.parse((ROOT / "dfmp2" / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__version__"]:
            assert isinstance(node.value, ast.Constant) and isinstance(node.value.value, str), ast.dump(node)
            return node.value.value
    raise AssertionError("dfmp2/__init__.py assigns no __version__")


def test_the_version_is_written_once():
    """pyproject.toml takes the version from dfmp2.__version__ (read statically by setuptools,
    without importing dfmp2); CITATION.cff, which citation tools read, repeats the same string."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in meta["project"] and "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "dfmp2.__version__"}
    version = _version_literal()
    from setuptools.config.expand import read_attr  # what the build calls: the literal, read statically

    assert read_attr("dfmp2.__version__", {"": "."}, str(ROOT)) == version
    (cff,) = re.findall(r"^version:\s*(\S+)\s*$", (ROOT / "CITATION.cff").read_text(), flags=re.M)
    assert cff.strip("\"'") == version


def _tracked_python():
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "*.py"], capture_output=True, text=True)
    if files.returncode != 0:  # not a git checkout (an sdist): walk the tree
        return sorted(
            p
            for top in ("dfmp2", "linalg", "kernels", "scripts", "tests", "inputs")
            for p in (ROOT / top).rglob("*.py")
        )
    return [ROOT / f for f in files.stdout.split()]


def _absolute_imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.module


def test_nothing_imports_linalg_or_kernels_by_their_top_level_names():
    bad = [
        f"{p.relative_to(ROOT)}: {m}"
        for p in _tracked_python()
        for m in _absolute_imports(p)
        if m.split(".")[0] in ("linalg", "kernels")
    ]
    assert not bad, bad


def test_floors_linalg_and_kernels_do_not_import_the_application():
    """linalg imports dfmp2.kernels at most; kernels imports neither linalg nor the application."""
    for top, allowed in (("linalg", ("dfmp2.linalg", "dfmp2.kernels")), ("kernels", ("dfmp2.kernels",))):
        for p in (ROOT / top).rglob("*.py"):
            for m in _absolute_imports(p):
                if m == "dfmp2" or m.startswith("dfmp2."):
                    assert m.startswith(allowed), f"{p.relative_to(ROOT)} imports {m}"


def _module_names() -> list:
    """Every module of the package by its one name (dfmp2.linalg.ops, ...) and the file it is."""
    out = []
    for top, dotted in (("dfmp2", "dfmp2"), ("linalg", "dfmp2.linalg"), ("kernels", "dfmp2.kernels")):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT / top).with_suffix("").parts)
            if top == "dfmp2" and (ROOT / "dfmp2" / parts[0]).is_symlink():
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.append((".".join([dotted] + parts), path))
    return out


def test_no_module_is_importable_under_a_second_name(tmp_path):
    """With the repository itself on sys.path (a script beside it, ``python -c`` in it), the
    linear-algebra layer and the kernels load only as dfmp2.linalg and dfmp2.kernels: their bare
    names raise ImportError naming the right one. Every package module's file is the one that
    name loads (the links resolve to the top-level folders)."""
    names = _module_names()
    bare = sorted({n.removeprefix("dfmp2.") for n, _ in names if n.startswith(("dfmp2.linalg", "dfmp2.kernels"))})
    code = (
        "import importlib, json, sys\n"
        "out = {}\n"
        "for name in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        importlib.import_module(name); out[name] = 'loaded'\n"
        "    except ImportError as e:\n"
        "        out[name] = str(e)\n"
        "import dfmp2.linalg, dfmp2.kernels.cpu.build as b, dfmp2.io\n"
        "out['files'] = [dfmp2.linalg.__file__, b.__file__, str(dfmp2.io.INPUTS)]\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(bare)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for name in bare:
        assert out[name] != "loaded" and f"dfmp2.{name.split('.')[0]}" in out[name], (name, out[name])
    lin, build, inputs = out["files"]
    assert Path(lin).resolve() == ROOT / "linalg" / "__init__.py"
    assert Path(build).resolve() == ROOT / "kernels" / "cpu" / "build.py"
    assert Path(inputs).resolve() == ROOT / "inputs"


def test_static_tools_see_dfmp2_linalg_and_kernels(tmp_path):
    """jedi (IPython's and VS Code's completion and go-to) resolves dfmp2.linalg.get_backend and a
    kernel from a file outside the checkout, through the installed package alone (no PYTHONPATH,
    no run-time import hook: the link and the editable install's path entry)."""
    pytest.importorskip("jedi")
    code = (
        "import jedi, sys\n"
        "src = 'import dfmp2.linalg\\nimport dfmp2.kernels.nki.gemm\\n"
        "dfmp2.linalg.get_backend\\ndfmp2.kernels.nki.gemm\\n'\n"
        "s = jedi.Script(src, path='probe.py', project=jedi.Project('.', smart_sys_path=False),\n"
        "                environment=jedi.InterpreterEnvironment())\n"
        "for line, col in ((3, 14), (4, 20)):\n"
        "    d = s.goto(line, col, follow_imports=True)\n"
        "    print(d[0].full_name if d else None, d[0].module_path if d else None)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    (fn, fpath), (kn, kpath) = (line.split() for line in proc.stdout.strip().split("\n"))
    assert fn == "dfmp2.linalg.backend.get_backend", proc.stdout
    assert Path(fpath).resolve() == ROOT / "linalg" / "backend.py"
    assert kn == "dfmp2.kernels.nki.gemm" and Path(kpath).resolve() == ROOT / "kernels" / "nki" / "gemm.py"


def _site_packages() -> list:
    paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    if site.ENABLE_USER_SITE:
        paths.add(site.getusersitepackages())
    return sorted(p for p in paths if os.path.isdir(p))


def _tracked_copy(dest: Path) -> Path:
    """The checkout's files (tracked and untracked-not-ignored) copied to ``dest``."""
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
    )
    names = (
        [f for f in files.stdout.split("\0") if f]
        if files.returncode == 0
        else [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and "build" not in p.parts]
    )
    for name in names:
        if (ROOT / name).is_symlink():  # dfmp2/linalg -> ../linalg and the like
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(ROOT / name), dest / name)
        elif (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def _setuptools_at_least(major: int) -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= major


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv holding the wheel built from this checkout: (its python, its bin dir, its site-packages)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = _tracked_copy(tmp / "src")  # the checkout's files, not its ignored build/ (stale files)
    # this environment's setuptools where it has one new enough (77: SPDX licence), else pip's isolated build
    isolation = ["--no-build-isolation"] if _setuptools_at_least(77) else []
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            *isolation,
            "--disable-pip-version-check",
            "-w",
            str(tmp / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = (tmp / "dist").glob("dfmp2-*.whl")
    assert wheel.name.startswith(f"dfmp2-{_version_literal()}-"), wheel.name  # the one version source
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # the dependencies (torch, PySCF, ...) from this environment, without running its .pth files
    # (so an editable dfmp2 installed here stays invisible there)
    Path(purelib, "_dfmp2_test_deps.pth").write_text("\n".join(_site_packages()) + "\n")
    inst = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert inst.returncode == 0, inst.stdout + inst.stderr
    return py, venv / "bin", Path(purelib)


def _run(installed, args, cwd):
    _py, bin_dir, _ = installed
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.heavy
def test_the_wheel_installs_dfmp2_alone_with_its_inputs_and_kernel_source(installed, tmp_path):
    py, _, purelib = installed
    out = _run(
        installed,
        [
            str(py),
            "-c",
            (
                "import importlib.util as u, dfmp2, dfmp2.linalg, dfmp2.kernels.cpu.build as b, dfmp2.io as io\n"
                "print(dfmp2.__file__); print(dfmp2.linalg.__file__); print(b.HERE); print(io.INPUTS)\n"
                "print(u.find_spec('linalg'), u.find_spec('kernels'))"
            ),
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    pkg, lin, here, inputs, top = out.stdout.strip().split("\n")
    assert Path(pkg) == purelib / "dfmp2" / "__init__.py"
    assert Path(lin) == purelib / "dfmp2" / "linalg" / "__init__.py"
    assert (Path(here) / "pair_epilogue.c").is_file()
    assert (Path(inputs) / "references.json").is_file() and (Path(inputs) / "water_clusters").is_dir()
    assert top == "None None"  # no top-level linalg or kernels from this package
    assert not (purelib / "linalg").exists() and not (purelib / "kernels").exists()


@pytest.mark.heavy
def test_installed_run_regress_and_api_from_another_directory(installed, tmp_path):
    py, _, _ = installed
    (tmp_path / "water.xyz").write_text((ROOT / "inputs" / "water.xyz").read_text())
    run = _run(installed, ["dfmp2", "run", "water.xyz", "--json", "out.json"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "out.json").is_file()
    reg = _run(installed, ["dfmp2", "regress"], tmp_path)  # the default (fast) set, shipped
    assert reg.returncode == 0, reg.stdout + reg.stderr
    assert re.search(r"\b(\d+)/\1 passed", reg.stdout) and "0/0" not in reg.stdout, reg.stdout
    api = _run(installed, [str(py), "-c", "import dfmp2; r = dfmp2.energy('water.xyz'); print(r.e_corr)"], tmp_path)
    assert api.returncode == 0, api.stderr
    assert float(api.stdout.split()[-1]) == pytest.approx(
        json.loads((tmp_path / "out.json").read_text())["energies"]["e_corr"], abs=1e-12
    )
