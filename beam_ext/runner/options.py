"""Command-line and programmatic options of SparkRunner."""
from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions

_STATE_BACKENDS = ("memory", "spill")
_WATERMARK_MODES = ("min", "tracker")
# Options that must be positive integers when set (None: Spark's default).
_POSITIVE_OPTIONS = ("spark_parallelism", "spark_bundle_size", "spark_state_memory", "spark_group_memory")
# Spark counts an RDD's partitions in a Java int.
_MAX_PARTITIONS = 2**31 - 1


class SparkRunnerOptions(PipelineOptions):
    """Options of :class:`beam_ext.runner.SparkRunner`.

    Example::

        opts = PipelineOptions(["--spark_master=local[2]",
                                "--spark_conf=spark.executor.memory=2g"])
        opts.view_as(SparkRunnerOptions).spark_parallelism   # None: Spark's default
    """

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument(
            "--spark_master",
            # local[N] never retries a failed task; local[N,F] tries it up to F
            # times, like spark.task.maxFailures (default 4) on a cluster.
            default="local[*,4]",
            help="Spark master URL (local[N], local[N,F], spark://host:port, yarn, ...). "
            "The default runs locally on every core and tries a failed task up to 4 "
            "times. Ignored when a SparkContext is already running.")
        parser.add_argument(
            "--spark_conf",
            action="append",
            default=None,
            metavar="KEY=VALUE",
            help="Spark configuration passed to the SparkSession builder; repeatable.")
        parser.add_argument(
            "--spark_app_name",
            default=None,
            help="Spark application name (default: the pipeline's job name).")
        parser.add_argument(
            "--spark_parallelism",
            type=int,
            default=None,
            help="Partitions for reads and shuffles (default: Spark's default parallelism).")
        parser.add_argument(
            "--spark_state_backend",
            choices=_STATE_BACKENDS,
            default="memory",
            help="Where stateful stages keep bag state: in memory, or in an LMDB spill "
            "store bounded by --spark_state_memory (for state that outgrows memory). In "
            "streaming, the store of each (stage, partition) lives under --checkpoint_dir, "
            "versioned per micro-batch.")
        parser.add_argument(
            "--spark_state_memory",
            type=int,
            default=256 << 20,
            help="Memory budget in bytes of each task's spill store (--spark_state_backend=spill).")
        parser.add_argument(
            "--spark_group_memory",
            type=int,
            default=256 << 20,
            help="Batch: memory budget in bytes of each GroupByKey task. Past it the task writes "
            "its groups to Spark's local directories as sorted runs and merges them at the end, "
            "instead of running out of memory.")
        parser.add_argument(
            "--spark_bundle_size",
            type=int,
            default=64 << 20,
            help="Input, in bytes, of one Beam bundle inside a Spark task: a bundle closes "
            "once its elements reach this size (1: one element per bundle).")
        parser.add_argument(
            "--checkpoint_dir",
            default=None,
            help="Streaming: where state versions and the commit log live. A job restarted "
            "with the same directory resumes after its last committed micro-batch. Must be "
            "visible to every executor (a shared filesystem on a cluster). Default: a "
            "temporary directory, deleted when the pipeline ends.")
        parser.add_argument(
            "--watermarks",
            choices=_WATERMARK_MODES,
            default="min",
            help="Streaming: how stage watermarks are computed: 'min' (the minimum of the "
            "inputs' output watermarks, per micro-batch) or 'tracker' (end-of-substream "
            "notifications from beam_ext.watermark's tracking service).")
        parser.add_argument(
            "--tracker_address",
            default=None,
            metavar="HOST:PORT",
            help="Streaming, --watermarks=tracker: the interface the driver's tracking service "
            "binds, for executors on other hosts (default: 127.0.0.1 on a free port). Off "
            "loopback it needs --tracker_allow_plaintext: reports cross the network unencrypted.")
        parser.add_argument(
            "--tracker_allow_plaintext",
            action="store_true",
            default=False,
            help="Streaming, --watermarks=tracker: serve the tracker in plaintext on a "
            "non-loopback --tracker_address (only on a network you trust).")
        parser.add_argument(
            "--tracker_bucket",
            type=float,
            default=1.0,
            help="Streaming, --watermarks=tracker: seconds of event time per tracked substream. "
            "Watermarks move in steps of this much where something is in flight or held.")
        parser.add_argument(
            "--tracker_timeout",
            type=float,
            default=5.0,
            help="Streaming, --watermarks=tracker: seconds the driver waits for the expected "
            "end-of-substream notifications before a stage runs (then it restarts the service "
            "once and uses what it has).")
        parser.add_argument(
            "--spark_batch_interval",
            type=float,
            default=0.2,
            help="Streaming: seconds to wait before polling the sources again after a "
            "micro-batch that had nothing to do.")


def check_options(options: SparkRunnerOptions) -> None:
    """Rejects out-of-range values and malformed ``--spark_conf`` entries,
    naming the flag, before Spark starts. Options set in code (keyword
    arguments of ``PipelineOptions``) skip argparse, so types and choices
    are checked here too.

    Example::

        check_options(PipelineOptions(["--spark_bundle_size=0"]).view_as(SparkRunnerOptions))
        # ValueError: --spark_bundle_size must be a positive integer, got 0
    """
    for name in _POSITIVE_OPTIONS:
        value = getattr(options, name)
        if value is None and name == "spark_parallelism":
            continue
        # bool is an int to Python, never a count to a user.
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"--{name} must be a positive integer, got {value!r}")
    if options.spark_parallelism is not None and options.spark_parallelism > _MAX_PARTITIONS:
        raise ValueError(f"--spark_parallelism must be at most {_MAX_PARTITIONS} "
                         f"(Spark's partition count), got {options.spark_parallelism}")
    if options.spark_state_backend not in _STATE_BACKENDS:
        raise ValueError(f"--spark_state_backend must be one of "
                         f"{', '.join(map(repr, _STATE_BACKENDS))}, "
                         f"got {options.spark_state_backend!r}")
    if options.watermarks not in _WATERMARK_MODES:
        raise ValueError(f"--watermarks must be one of {', '.join(map(repr, _WATERMARK_MODES))}, "
                         f"got {options.watermarks!r}")
    for name in ("tracker_bucket", "tracker_timeout"):
        value = getattr(options, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"--{name} must be a number of seconds > 0, got {value!r}")
    address = options.tracker_address
    if address is not None:
        host, sep, port = str(address).rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"--tracker_address must be HOST:PORT, got {address!r}")
    interval = options.spark_batch_interval
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval >= 0:
        raise ValueError(f"--spark_batch_interval must be a number of seconds >= 0, got {interval!r}")
    if isinstance(options.spark_conf, str):
        # A lone string would be read entry by entry, one character each.
        raise ValueError(f"--spark_conf expects a list of KEY=VALUE entries, "
                         f"got the string {options.spark_conf!r}")
    parse_spark_conf(options.spark_conf)


def parse_spark_conf(entries: list[str] | None) -> dict[str, str]:
    """``["k=v", ...]`` -> ``{"k": "v"}``, naming the malformed entry on error."""
    conf: dict[str, str] = {}
    for entry in entries or []:
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--spark_conf expects KEY=VALUE, got {entry!r}")
        conf[key.strip()] = value
    return conf
