"""The task worker: one fused stage inside one Spark task, under a given watermark."""
from beam_ext.runner.worker._gc import tune_worker_gc
from beam_ext.runner.worker._task import METRICS_OUTPUT, StageFailed, StageSpec, run_stage_partition

__all__ = ["METRICS_OUTPUT", "StageFailed", "StageSpec", "run_stage_partition"]

tune_worker_gc()
