"""Steps with a dead-letter output (``with_exception_handling``) on element objects.

Beam wraps the user's DoFn in ``_ExceptionHandlingWrapperDoFn``: its good
outputs go to the main output, each failing element with its exception and
traceback to the dead-letter output. SparkRunner must send the same
elements to each, the same traceback text included, and run the user's
bundle methods through the wrapper as Beam does.
"""
from __future__ import annotations

import apache_beam as beam
from apache_beam.transforms import window
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipeline_outputs import planned_on_objects, run_and_collect, spark_equals_direct

from beam_ext.runner import SparkRunner


def _checked(p, values: list[int], partial: bool = False):
    """``100 // x`` for each value, twice for odd values; a zero fails after its first output."""

    def divided(x):
        yield 100 // x if x else -1
        if x % 2 or not x:
            yield 100 // x

    good, bad = (p | beam.Create(values)
                 | "Checked" >> beam.FlatMap(divided).with_exception_handling(partial=partial))
    return ((good | "Good" >> beam.Map(lambda y: ["good", y]),
             bad | "Bad" >> beam.Map(lambda kv: ["bad", kv[0], kv[1][0].__name__, kv[1][1], kv[1][2]]))
            | beam.Flatten())


def _oracle(values: list[int], partial: bool) -> list:
    out = []
    for x in values:
        if x == 0:
            out += [["good", -1]] if partial else []
            out.append(["bad", 0, "ZeroDivisionError", "ZeroDivisionError('integer division or modulo by zero')"])
            continue
        out += [["good", 100 // x]] * (2 if x % 2 else 1)
    return sorted(out, key=repr)


def _on_objects(build) -> list[bool]:
    return planned_on_objects(build, "Checked")


def test_dead_letters_equal_beam_with_their_tracebacks(tmp_path):
    values = [5, 0, 3, 0, 8, 7]
    assert _on_objects(lambda p: _checked(p, values)) == [True]
    got = spark_equals_direct(lambda p: _checked(p, values), tmp_path)
    tracebacks = [row.pop() for row in got if row[0] == "bad"]
    assert sorted(got, key=repr) == _oracle(values, partial=False)
    # Beam's wrapper is the first frame, the user's function the last.
    assert all("exception_handling_wrapper_do_fn_custom_process" in t[1] and "divided" in t[-2]
               for t in tracebacks)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.integers(0, 12), max_size=40), partial=st.booleans())
def test_random_dead_letters_equal_python(tmp_path_factory, values, partial):
    got = run_and_collect(SparkRunner(), lambda p: _checked(p, values, partial), str(tmp_path_factory.mktemp("dl")))
    for row in got:
        if row[0] == "bad":
            row.pop()
    assert sorted(got, key=repr) == _oracle(values, partial)


class _CountsBundles(beam.DoFn):
    """Counts each bundle's elements in ``start_bundle``'s counter; fails on 3."""

    def start_bundle(self):
        self.seen = 0

    def process(self, x):
        self.seen += 1
        if x == 3:
            raise ValueError("three")
        yield x

    def finish_bundle(self):
        yield window.GlobalWindows.windowed_value(("seen", self.seen))


def test_the_wrapped_dofns_bundle_methods_run_as_on_beam(tmp_path):
    def build(p):
        good, bad = p | beam.Create([1, 2, 3, 4, 5]) | "Checked" >> beam.ParDo(_CountsBundles()).with_exception_handling()
        return (good | "Good" >> beam.Map(lambda x: ["good", x]),
                bad | "Bad" >> beam.Map(lambda kv: ["bad", kv[0], kv[1][1]])) | beam.Flatten()

    assert _on_objects(build) == [True]
    got = run_and_collect(SparkRunner(), build, str(tmp_path))
    # Bundles differ between runners; what each bundle saw adds up to every element.
    assert sum(row[1][1] for row in got if row[0] == "good" and isinstance(row[1], list)) == 5
    assert sorted((row for row in got if not isinstance(row[1], list)), key=repr) == [
        ["bad", 3, "ValueError('three')"], ["good", 1], ["good", 2], ["good", 4], ["good", 5]]
