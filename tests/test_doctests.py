"""Every example written as a doctest in the package's docstrings runs and gives what it shows."""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import beam_ext


def _modules_with_examples() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(beam_ext.__path__, "beam_ext."):
        if info.name.endswith("_pb2"):
            continue
        module = importlib.import_module(info.name)
        if doctest.DocTestFinder().find(module) and any(
                t.examples for t in doctest.DocTestFinder().find(module)):
            names.append(info.name)
    return names


_MODULES = _modules_with_examples()


def test_examples_are_found():
    # The walk must see the modules known to carry examples.
    assert {"beam_ext.clock", "beam_ext.transforms.sampling._estimators"} <= set(_MODULES)


@pytest.mark.parametrize("name", _MODULES)
def test_docstring_examples(name):
    failed, attempted = doctest.testmod(importlib.import_module(name),
                                        optionflags=doctest.ELLIPSIS)
    assert attempted > 0 and failed == 0
