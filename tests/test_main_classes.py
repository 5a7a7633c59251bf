"""Instances of classes defined in the user's script (its ``__main__``)
cross groupings on SparkRunner as on DirectRunner; Beam's coders pickle them
by reference, which the workers resolve against their own ``__main__``."""
from __future__ import annotations

import os
import runpy
import sys
import types

import pytest

from beam_ext.runner.worker import _setup

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "main_classes_job.py")


def _run_as_main(runner: str, out_dir, options: list[str]) -> list:
    argv = sys.argv
    sys.argv = [SCRIPT, runner, str(out_dir), *options]
    try:
        return runpy.run_path(SCRIPT, run_name="__main__")["RESULT"]
    finally:
        sys.argv = argv


@pytest.mark.usefixtures("spark")
@pytest.mark.parametrize("options", [[], ["--streaming"]], ids=["batch", "streaming"])
def test_values_of_classes_of_the_users_script_cross_groupings(tmp_path, options):
    direct = _run_as_main("DirectRunner", tmp_path / "direct", [])
    spark = _run_as_main("beam_ext.runner.SparkRunner", tmp_path / "spark", options)
    assert spark == direct
    assert ["GOLD", sum(range(2, 300, 3)), 100] in spark
    assert ["u3", list(range(3, 300, 7))] in spark
    assert [True, 300] in spark
    assert len(spark) == 3 + 7 + 1


def test_a_name_of_the_workers_own_main_is_left_alone(monkeypatch, caplog):
    from apache_beam.internal import pickler

    own = object()
    main = types.ModuleType("__main__")
    main.run = own
    monkeypatch.setitem(sys.modules, "__main__", main)
    # Classes of a driver's __main__, as the driver pickles them (by value).
    run = type("run", (), {"__module__": "__main__"})
    Kept = type("Kept", (), {"__module__": "__main__"})
    setup = _setup.WorkerSetup(main_classes=(("run", pickler.dumps(run)), ("Kept", pickler.dumps(Kept))))
    setup.apply()
    assert main.run is own
    assert "run of the driver's __main__ is not set" in caplog.text
    # The very class: cloudpickle keeps one class per class pickled, so the
    # job's DoFns, unpickled in this process, make instances of it.
    assert main.Kept is Kept
    # A later job's class of the same name replaces this job's.
    Kept2 = type("Kept", (), {"__module__": "__main__", "v": 2})
    _setup.WorkerSetup(main_classes=(("Kept", pickler.dumps(Kept2)),)).apply()
    assert main.Kept is Kept2


def test_only_classes_of_main_small_enough_to_ride_with_every_task_are_shipped(monkeypatch):
    from beam_ext.runner import _dependencies

    main = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    main.Small = type("Small", (), {"__module__": "__main__"})
    main.Table = type("Table", (), {"__module__": "__main__", "rows": os.urandom(2 << 20)})
    main.Imported = types.SimpleNamespace  # a class of another module
    main.alias = main.Small  # the same class under another name: found by its own
    assert [name for name, _ in _dependencies._main_classes()] == ["Small"]


def test_a_native_step_decodes_values_of_main_classes_after_the_setup(monkeypatch):
    # A native step's task (a Reshuffle, a write) may be the first of the
    # job in its Python worker: it decodes its input only after the setup.
    from apache_beam import coders
    from apache_beam.internal import pickler
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.timestamp import MIN_TIMESTAMP
    from apache_beam.utils.windowed_value import WindowedValue

    from beam_ext.runner.executors._batch import _decode_chunks

    driver = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", driver)
    event = type("Event", (), {"__module__": "__main__"})
    driver.Event = event
    coder = coders.WindowedValueCoder(coders.coders.LengthPrefixCoder(coders.FastPrimitivesCoder()))
    chunk = coder.encode(WindowedValue(event(), MIN_TIMESTAMP, (GlobalWindow(),)))
    setup = _setup.WorkerSetup(main_classes=(("Event", pickler.dumps(event)),))
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # a worker's
    with pytest.raises(AttributeError, match="Event"):
        list(_decode_chunks(coder, None, [chunk]))
    (decoded,) = _decode_chunks(coder, setup, [chunk])
    assert type(decoded.value) is event
