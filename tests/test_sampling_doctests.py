"""The examples in the sampling and simulation docstrings run."""
from __future__ import annotations

import doctest

import pytest

from beam_ext.io import _simulation
from beam_ext.transforms.sampling import _estimators, _online, _sampler


@pytest.mark.parametrize("module", [_estimators, _sampler, _online, _simulation])
def test_docstring_examples(module):
    failed, attempted = doctest.testmod(module)
    assert attempted > 0 and failed == 0
