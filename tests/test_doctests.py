"""Run the examples in every fp8lab module's docstrings (the installed package's modules)."""

import doctest
import importlib
import pkgutil

import pytest

import fp8lab

MODULES = sorted(m.name for m in pkgutil.walk_packages(fp8lab.__path__, "fp8lab.")
                 if not m.name.startswith(("fp8lab._formats", "fp8lab._gpu")))


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests(name):
    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # optional dependency of a module (e.g. CuPy for fp8lab.gpu.*)
        pytest.skip(f"{name} needs an optional dependency: {exc}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} doctest failures in {name}"
