"""Executors: how a :class:`~beam_ext.runner.planning.Plan` runs on Spark.

An executor takes a plan and a SparkSession, runs it, and keeps the Beam
monitoring infos of each stage for the pipeline result. The batch executor
runs every stage once, as Spark jobs, each task under the watermark +inf.
The streaming executor runs the same plan in micro-batches, passing each
task the watermarks its stage runs under and keeping keyed state, pending
timers and SDF residuals between them, versioned under the checkpoint.
"""
from __future__ import annotations

from typing import Any, Mapping, Protocol

from beam_ext.runner.executors._batch import BatchExecutor
from beam_ext.runner.executors._streaming import StreamingExecutor

__all__ = ["BatchExecutor", "Executor", "StreamingExecutor"]


class Executor(Protocol):
    """Runs one planned pipeline on Spark."""

    #: stage name -> Beam monitoring infos of that stage, merged over its tasks
    monitoring: Mapping[str, list[Any]]

    def run(self) -> None:
        """Runs the plan to completion (batch) or until stopped (streaming)."""
