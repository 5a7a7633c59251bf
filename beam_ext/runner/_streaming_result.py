"""The result of a streaming pipeline: running in the background, with live state and metrics."""
from __future__ import annotations

import logging
import threading

from apache_beam.runners import runner

from beam_ext.runner._metrics import SparkMetrics

_LOG = logging.getLogger("beam_ext.runner")


class SparkStreamingResult(runner.PipelineResult):
    """A running streaming pipeline, as Beam documents ``PipelineResult``.

    ``state`` is RUNNING until every source is done (DONE), ``cancel()`` was
    called (CANCELLED) or a stage failed (FAILED; ``wait_until_finish``
    raises the error). ``metrics()`` is live: counters of every committed
    micro-batch so far.

    Example::

        result = pipeline.run()                    # returns at once
        result.wait_until_finish(duration=60_000)  # ms; returns the state
        result.cancel()
    """

    def __init__(self, executor) -> None:
        super().__init__(runner.PipelineState.RUNNING)
        self._executor = executor
        self._error: BaseException | None = None
        self._cancelled = False
        self._thread = threading.Thread(target=self._run, name="beam_ext-streaming", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._executor.run()
        except BaseException as e:  # noqa: BLE001 - handed to wait_until_finish
            self._error = e
            self._state = runner.PipelineState.FAILED
            _LOG.error("streaming pipeline failed: %s", e)
            return
        self._state = (runner.PipelineState.CANCELLED if self._cancelled and not self._executor.done()
                       else runner.PipelineState.DONE)

    def wait_until_finish(self, duration: int | None = None):
        """Waits until the pipeline ends, or ``duration`` milliseconds; returns the state."""
        self._thread.join(None if duration is None else duration / 1000)
        if self._error is not None:
            raise self._error
        return self._state

    def cancel(self):
        """Stops after the micro-batch under way (committed, so a restart resumes after it)."""
        self._cancelled = True
        self._executor.stop()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._state

    def metrics(self) -> SparkMetrics:
        return SparkMetrics(self._executor.monitoring, user_metrics_only=True)

    def monitoring_metrics(self) -> SparkMetrics:
        return SparkMetrics(self._executor.monitoring, user_metrics_only=False)
