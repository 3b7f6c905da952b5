"""Where the package's parts live.

The repository keeps the linear-algebra layer and the kernels at its top level (``linalg/``,
``kernels/``) and the molecules and reference energies in ``inputs/``. Installed from a wheel they
sit inside the package, as ``dfmp2.linalg``, ``dfmp2.kernels`` and ``dfmp2/inputs/``
(pyproject.toml's ``package-dir``), so nothing generic (``linalg``, ``kernels``) goes into
site-packages. In a plain checkout (``PYTHONPATH=.``, a script that puts the repository on
``sys.path``, a git worktree) :func:`install_checkout_finder` maps the same two names onto the
repository's folders; an editable install maps them through setuptools' own finder.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
MAPPED = ("linalg", "kernels")                  # dfmp2.<name> <- <checkout>/<name>


def checkout_root() -> str | None:
    """The repository holding this ``dfmp2/`` when it is a checkout (its ``linalg/`` beside it and
    none inside the package), else None (an installed wheel)."""
    root = os.path.dirname(PACKAGE_DIR)
    if os.path.isdir(os.path.join(PACKAGE_DIR, "linalg")):
        return None
    if all(os.path.isfile(os.path.join(root, name, "__init__.py")) for name in MAPPED):
        return root
    return None


def inputs_dir() -> str:
    """The folder of the shipped molecules and references: ``dfmp2/inputs`` in a wheel, the
    repository's ``inputs/`` in a checkout."""
    root = checkout_root()
    return os.path.join(root, "inputs") if root else os.path.join(PACKAGE_DIR, "inputs")


class _CheckoutFinder(importlib.abc.MetaPathFinder):
    """Finds ``dfmp2.linalg`` and ``dfmp2.kernels`` in a checkout's top-level folders; their
    submodules are then found through the package's own ``__path__`` as usual."""

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        head, _, name = fullname.partition(".")
        if head != "dfmp2" or name not in MAPPED:
            return None
        folder = os.path.join(self.root, name)
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])


def install_checkout_finder() -> None:
    """Put the checkout's finder first on ``sys.meta_path`` (once); nothing in a wheel."""
    root = checkout_root()
    if root and not any(isinstance(f, _CheckoutFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutFinder(root))
