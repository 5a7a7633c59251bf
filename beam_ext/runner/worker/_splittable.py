"""A splittable ``DoFn``'s sized restrictions processed on element objects.

Beam expands a splittable ``DoFn`` into three steps: pair each element with
its initial restriction, split and size the restrictions, and process each
sized restriction (``beam:transform:sdf_process_sized_element_and_restrictions:v1``).
A batch pipeline on SparkRunner spreads the sized restrictions over the
tasks, and each task processes its restrictions whole: the runner asks for
no split while a restriction runs. So the last step needs none of the
bundle processor's split machinery, and Beam's per-element operation around
it (a ``Timestamp`` made per output for the watermark estimator, the
runner's progress and split requests) is all cost.

:class:`SizedRestrictions` wraps the user's ``DoFn`` as a ``DoFn`` of the
sized restrictions that a stage on objects runs as any step taking
parameters. It processes each as Beam's ``PerWindowInvoker`` does: a fresh
restriction tracker, seen by the ``DoFn`` through the same thread-safe view
Beam gives it; the ``DoFn`` called once per element, or once per window
where it observes its window; the tracker checked done once the ``DoFn``'s
outputs are read; and a remainder it deferred (``defer_remainder``)
processed next, as Beam's batch runner processes a residual, without its
delay, which only paces an unbounded read.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

from apache_beam.transforms import core


class SizedRestrictions(core.DoFn):
    """The user's splittable ``dofn`` (with its extra ``args`` and ``kwargs``)
    as a ``DoFn`` of Beam's sized restrictions, ``((element, (restriction,
    watermark estimator state)), size)``.

    >>> import apache_beam as beam
    >>> from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
    >>> from apache_beam.utils.windowed_value import WindowedValue
    >>> class Ranges(beam.RestrictionProvider):
    ...     def initial_restriction(self, n): return OffsetRange(0, n)
    ...     def create_tracker(self, r): return OffsetRestrictionTracker(r)
    ...     def restriction_size(self, n, r): return r.size()
    >>> class Count(beam.DoFn):
    ...     def process(self, n, tracker=beam.DoFn.RestrictionParam(Ranges())):
    ...         i = tracker.current_restriction().start
    ...         while tracker.try_claim(i):
    ...             yield i
    ...             i += 1
    >>> sized = ((9, (OffsetRange(2, 5), None)), 3)
    >>> list(SizedRestrictions(Count(), (), {}).process(sized, WindowedValue(sized, 0, ())))
    [2, 3, 4]
    """

    def __init__(self, dofn: core.DoFn, args: tuple, kwargs: dict) -> None:
        self.dofn = dofn
        self.args = tuple(args)
        self.kwargs = dict(kwargs)
        self._call: Callable | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_call": None}  # bound on the worker, per process

    def with_arguments(self, args: tuple, kwargs: dict) -> SizedRestrictions:
        """A wrapper of the same ``DoFn`` instance (set up and torn down once, as
        the pool decides) with other extra arguments: a task's side-input views in place."""
        return type(self)(self.dofn, args, kwargs)

    def _bind(self) -> Callable:
        from apache_beam.runners.common import DoFnSignature

        from beam_ext.runner.worker._direct import _checks_output, _param_invoker, check_result

        signature = DoFnSignature(self.dofn)
        provider = signature.get_restriction_provider()
        method = signature.process_method
        # Beam passes the tracker by the name of the argument defaulting to RestrictionParam.
        [restriction_arg] = [name for name, d in zip(method.args[-len(method.defaults):], method.defaults)
                             if isinstance(d, core.DoFn.RestrictionParam)]
        invoker = _param_invoker(self.dofn, self.args, self.kwargs, restriction=restriction_arg)
        call = invoker[0]
        check = _checks_output(self.dofn)

        def process(element: Any, wv: Any, restriction: Any) -> Iterator[Any]:
            from apache_beam.runners.sdf_utils import RestrictionTrackerView, ThreadsafeRestrictionTracker

            nonlocal check
            while True:
                tracker = ThreadsafeRestrictionTracker(provider.create_tracker(restriction))
                results = call(element, wv, RestrictionTrackerView(tracker))
                if check:
                    check_result(results)
                    check = False
                if results is not None:
                    yield from results
                tracker.check_done()
                deferred = tracker.deferred_status()
                if not deferred:
                    return
                restriction = deferred[0]
                size = provider.restriction_size(element, restriction)
                if size < 0:
                    raise ValueError(f"Expected size >= 0 but received {size}.")

        self._call = process
        return process

    def process(self, sized: Any, wv: Any = core.DoFn.WindowedValueParam) -> Iterator[Any]:
        (element, (restriction, _)), _ = sized
        return (self._call or self._bind())(element, wv.with_value(element), restriction)

    def setup(self) -> None:
        self.dofn.setup()

    def start_bundle(self) -> Any:
        return self.dofn.start_bundle()

    def finish_bundle(self) -> Any:
        return self.dofn.finish_bundle()

    def teardown(self) -> None:
        self.dofn.teardown()


class SizedRestrictionsPerWindow(SizedRestrictions):
    """:class:`SizedRestrictions` of a ``DoFn`` that observes its window: called
    once per window of an element, as Beam calls it."""

    def process(self, sized: Any, wv: Any = core.DoFn.WindowedValueParam,
                window: Any = core.DoFn.WindowParam) -> Iterator[Any]:
        return super().process(sized, wv)


def sized_restrictions(dofn: core.DoFn, args: tuple, kwargs: dict) -> SizedRestrictions:
    """The wrapper of ``dofn`` for its stage on objects: per window where ``dofn`` observes its window."""
    from apache_beam.runners.common import DoFnSignature

    observes = any(d == core.DoFn.WindowParam for d in DoFnSignature(dofn).process_method.defaults)
    return (SizedRestrictionsPerWindow if observes else SizedRestrictions)(dofn, args, kwargs)
