"""Beam's ``apache_beam/transforms/util_test.py`` on SparkRunner.

Every ``TestPipeline()`` of these classes runs on SparkRunner (the conftest
points ``TestPipeline`` at it); tests that pin ``TestPipeline('FnApiRunner')``
or pass their own options stay on Beam's runners, as Beam wrote them.
Skips are in the conftest's ``SKIPPED_ON_SPARK``, each with its reason (also
in docs/runner.md).

All classes whose pipelines exercise the runner run: batching, grouping
into batches, reshuffling, windows and timestamps, state and timers,
``WaitOn``, ``Tee``. Left out, to keep the suite's time in bounds:
``RegexTest`` and ``ToStringTest`` (string helpers built from ``Map`` and
``FlatMap``), ``WithKeysTest`` (a ``Map`` with side inputs) and
``CoGroupByKeyTest`` (``Flatten`` + ``GroupByKey``, which every
``assert_that`` runs too): 54 tests, 4½ minutes on two busy cores, whose
transforms FnApiRunnerTest and the ``it_validatesrunner`` tests already cover.
"""
from apache_beam.transforms.util_test import (  # noqa: F401
    BatchElementsTest,
    GroupByEncryptedKeyTest,
    GroupIntoBatchesTest,
    IdentityWindowTest,
    LogElementsTest,
    ReifyTest,
    ReshuffleTest,
    SortAndBatchElementsDoFnDirectTest,
    SortAndBatchElementsTest,
    TeeTest,
    WaitOnTest,
)
