"""The DoFns of object stages a Python worker keeps between tasks, as Beam keeps bundle processors.

Beam's SDK harness caches a stage's bundle processor between bundles, so a
``DoFn``'s ``setup`` runs once per instance and the instance serves many
bundles; ``teardown`` runs, best effort, when the cache drops it. Stages on
element objects (:mod:`beam_ext.runner.worker._direct`) run one bundle per
Spark task; a worker runs one task at a time and keeps the step's unpickled
``DoFn`` info here between tasks, keyed by its pickled bytes, so a ``DoFn``
that loads a model or opens a client in ``setup`` does it once per worker
and instance, not per task. An instance whose task failed is torn down and
dropped, as Beam discards a failed bundle processor.
"""
from __future__ import annotations

import atexit
import collections
import logging

_LOG = logging.getLogger(__name__)
# Instances kept per worker, least recently used dropped first (torn down).
LIMIT = 64

_idle: collections.OrderedDict[bytes, list[tuple]] = collections.OrderedDict()


def acquire(payload: bytes) -> tuple[tuple, bool]:
    """(the step's ``(DoFn, args, kwargs, ...)`` info, whether it is new and needs ``setup``)."""
    kept = _idle.get(payload)
    if kept:
        info = kept.pop()
        if not kept:
            del _idle[payload]
        return info, False
    from apache_beam.internal import pickler

    return pickler.loads(payload), True


def release(payload: bytes, info: tuple) -> None:
    """Keeps ``info`` for the next task that runs the same step."""
    _idle.setdefault(payload, []).append(info)
    _idle.move_to_end(payload)
    while sum(map(len, _idle.values())) > LIMIT:
        _, oldest = _idle.popitem(last=False)
        for dropped in oldest:
            discard(dropped)


def discard(info: tuple) -> None:
    """Tears the instance down (best effort, as Beam's ``teardown``) and forgets it."""
    dofn = info[0]
    try:
        dofn.teardown()
    except Exception:  # noqa: BLE001 - teardown is best effort in Beam too
        _LOG.warning("teardown of %s failed", type(dofn).__name__, exc_info=True)


@atexit.register
def _teardown_idle() -> None:
    while _idle:
        for info in _idle.popitem()[1]:
            discard(info)
