"""The package's public surface: one list of names, loaded lazily, and the import rules."""
from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import textwrap

import pytest

import beam_ext
from beam_ext.errors import BeamExtError


def test_version_is_set():
    assert beam_ext.__version__.count(".") == 2


@pytest.mark.parametrize("name", beam_ext.__all__)
def test_every_public_name_resolves_to_its_defining_subpackage(name):
    value = getattr(beam_ext, name)
    module = importlib.import_module(beam_ext._PUBLIC[name])
    assert getattr(module, name) is value
    assert name in getattr(module, "__all__", [name]), f"{module.__name__} does not export {name}"


def test_public_list_has_no_internals():
    assert all(not name.startswith("_") for name in beam_ext.__all__)
    assert sorted(beam_ext.__all__) == sorted(beam_ext._PUBLIC)
    assert set(beam_ext.__all__) <= set(dir(beam_ext))


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        beam_ext.NoSuchThing  # noqa: B018


def test_every_error_the_package_defines_derives_from_the_base():
    defined = []
    for info in pkgutil.walk_packages(beam_ext.__path__, "beam_ext."):
        if info.name.endswith("_pb2") or info.name.endswith("_pb2_grpc"):
            continue
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if (isinstance(obj, type) and issubclass(obj, Exception)
                    and obj.__module__ == module.__name__):
                defined.append(obj)
    assert defined, "the walk found no error classes"
    outside = [f"{e.__module__}.{e.__qualname__}" for e in defined if not issubclass(e, BeamExtError)]
    assert not outside, f"errors not derived from BeamExtError: {outside}"


def _modules_loaded_by(statement: str) -> set[str]:
    # A fresh interpreter: this process has long since imported everything.
    code = textwrap.dedent(f"""
        import sys
        {statement}
        print("\\n".join(sorted(sys.modules)))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def _loaded(modules: set[str], top: str) -> list[str]:
    return sorted(m for m in modules if m == top or m.startswith(top + "."))


def test_importing_the_package_loads_no_engine():
    modules = _modules_loaded_by("import beam_ext")
    for heavy in ("pyspark", "lmdb", "scipy", "grpc", "apache_beam", "beam_ext.runner"):
        assert not _loaded(modules, heavy), f"import beam_ext loaded {heavy}"


def test_sparks_daemon_module_imports_no_engine():
    # Spark launches it to hand over to a warm daemon that did the imports.
    modules = _modules_loaded_by("import beam_ext._spark_daemon")
    for heavy in ("pyspark", "pyarrow", "numpy", "apache_beam", "beam_ext.runner"):
        assert not _loaded(modules, heavy), f"import beam_ext._spark_daemon loaded {heavy}"


def test_transforms_import_neither_spark_nor_the_runner():
    modules = _modules_loaded_by(
        "import beam_ext.transforms, beam_ext.transforms.sliding, beam_ext.transforms.lateness, "
        "beam_ext.transforms.staleness, beam_ext.transforms.sampling")
    assert not _loaded(modules, "pyspark")
    assert not _loaded(modules, "beam_ext.runner")


@pytest.mark.parametrize("package", ["beam_ext.state", "beam_ext.watermark"])
def test_state_and_watermark_import_neither_transforms_nor_runner(package):
    modules = _modules_loaded_by(f"import {package}")
    for other in ("beam_ext.transforms", "beam_ext.runner", "pyspark"):
        assert not _loaded(modules, other), f"import {package} loaded {other}"


# Public before 0.1's reshaping into one subpackage per capability.
_PUBLIC_BEFORE = {"SlidingAggregate", "SlidingWindow", "agg", "PredictiveCleanup", "StalenessPlanner",
                  "StalenessRefire", "StalenessTrigger", "max_staleness", "ApproximateResult",
                  "ApproximateWindowAggregate", "OnlineSampler", "SamplerConfig", "FirmBound",
                  "LocalAgent", "PunctuationTracker", "TrackerAuthError", "TrackerService",
                  "new_token", "SpillStore", "SpillStoreError", "SpillWindow", "AfterLateDelay",
                  "CleanupPolicy", "EveryNLateEvents", "FixedLateness", "LateWindowedGroupByKey"}


def test_names_public_before_still_resolve():
    from beam_ext import transforms

    for name in _PUBLIC_BEFORE:
        assert getattr(beam_ext, name) is not None
    assert _PUBLIC_BEFORE - set(beam_ext.__all__) == {"PunctuationTracker"}  # an alias now
    for name in set(transforms.__all__):
        assert getattr(beam_ext, name) is getattr(transforms, name)


@pytest.mark.parametrize("package, names", [
    ("beam_ext.transforms.sliding", {"SlidingAggregate", "SlidingWindow", "agg"}),
    ("beam_ext.transforms.lateness", {"AfterLateDelay", "CleanupPolicy", "EveryNLateEvents",
                                      "FixedLateness", "LateWindowedGroupByKey",
                                      "PredictiveCleanup"}),
    ("beam_ext.transforms.staleness", {"StalenessPlanner", "StalenessRefire", "StalenessTrigger",
                                       "max_staleness"}),
    ("beam_ext.transforms.sampling", {"ApproximateResult", "ApproximateWindowAggregate",
                                      "OnlineSampler", "SamplerConfig"}),
])
def test_each_capability_lists_its_public_names(package, names):
    module = importlib.import_module(package)
    assert set(module.__all__) == names
    for name in names:
        assert getattr(beam_ext, name) is getattr(module, name)


def test_moved_names_resolve_from_their_old_modules_for_one_release():
    from beam_ext import state
    from beam_ext.runner.state import SpillBagStateServicer
    from beam_ext.state import cleanup
    from beam_ext.transforms import late_triggers, lateness

    assert state.PredictiveCleanup is cleanup.PredictiveCleanup is lateness.PredictiveCleanup
    assert state.SpillBagStateServicer is SpillBagStateServicer
    assert "PredictiveCleanup" not in state.__all__
    for name in late_triggers.__all__:
        assert getattr(late_triggers, name) is getattr(lateness, name)
    with pytest.raises(AttributeError, match="no attribute 'Missing'"):
        state.Missing  # noqa: B018
