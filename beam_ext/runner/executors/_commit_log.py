"""The streaming driver's commit log under ``--checkpoint_dir``.

One file per committed micro-batch, written after every task of the batch
finished and its state versions are on disk, like Structured Streaming's
``commits/`` log. What a commit holds (:class:`Progress`) is everything the
driver needs to resume after the batch: source positions, watermarks, holds,
which state version each stage owns, the side inputs it broadcast, and the
metrics so far. A driver that dies mid-batch resumes from the last commit
and runs the batch again; tasks rewrite the versions it had written.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import re
from typing import Any

from apache_beam.utils.timestamp import MIN_TIMESTAMP, Timestamp

from beam_ext.errors import BeamExtError
from beam_ext.runner._errors import checkpoint_unwritable

_COMMIT = re.compile(r"^(\d+)\.commit$")
_KEEP_COMMITS = 3


class CheckpointMismatch(BeamExtError, ValueError):
    """``--checkpoint_dir`` holds the checkpoint of another pipeline or layout."""


@dataclasses.dataclass
class Progress:
    """The driver's position after a committed micro-batch."""

    batch: int = -1  # the last committed batch; -1: none yet
    impulse_done: bool = False
    test_stream_positions: dict[int, int] = dataclasses.field(default_factory=dict)  # stage -> next event
    source_watermarks: dict[tuple[int, int], Timestamp] = dataclasses.field(
        default_factory=dict)  # (stage, output) -> TestStream watermark
    test_clock: Timestamp | None = None  # processing time of a TestStream pipeline
    input_watermarks: dict[str, Timestamp] = dataclasses.field(default_factory=dict)  # owner ->
    output_watermarks: dict[str, Timestamp] = dataclasses.field(default_factory=dict)  # owner ->
    summaries: dict[str, Any] = dataclasses.field(default_factory=dict)  # owner -> TaskSummary
    state_versions: dict[str, int] = dataclasses.field(default_factory=dict)  # owner -> batch
    side_inputs: dict[int, dict | list] = dataclasses.field(default_factory=dict)  # stage -> what it broadcasts
    monitoring: dict[str, list[bytes]] = dataclasses.field(default_factory=dict)  # stage -> serialized infos

    def successor(self) -> Progress:
        """A copy to update during the next batch (this one stays as committed)."""
        fields = {name: (dict(value) if isinstance(value, dict) else value)
                  for name, value in vars(self).items()}
        fields["batch"] = self.batch + 1
        fields["monitoring"] = {}
        return Progress(**fields)

    def input_watermark(self, owner: str) -> Timestamp:
        return self.input_watermarks.get(owner, MIN_TIMESTAMP)

    def output_watermark(self, owner: str) -> Timestamp:
        return self.output_watermarks.get(owner, MIN_TIMESTAMP)


class CommitLog:
    """Commits under ``root/commits``; state versions live under ``root/state``."""

    def __init__(self, root: str, fingerprint: str) -> None:
        self.root = root
        self.state_root = os.path.join(root, "state")
        self._commits = os.path.join(root, "commits")
        try:
            os.makedirs(self._commits, exist_ok=True)
            os.makedirs(self.state_root, exist_ok=True)
            self._check_fingerprint(fingerprint)
        except OSError as exc:
            raise checkpoint_unwritable(root, "its commits/, state/ and pipeline file, at start", exc) from exc

    @staticmethod
    def stored_fingerprint(root: str) -> str | None:
        """The fingerprint of the pipeline whose checkpoint ``root`` holds, if any."""
        try:
            with open(os.path.join(root, "pipeline"), encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _check_fingerprint(self, fingerprint: str) -> None:
        path = os.path.join(self.root, "pipeline")
        found = self.stored_fingerprint(self.root) or fingerprint
        if found != fingerprint:
            raise CheckpointMismatch(
                f"--checkpoint_dir {self.root!r} holds the checkpoint of another pipeline "
                f"(its stages or parallelism differ: {found[:120]!r} vs {fingerprint[:120]!r}); "
                "resume the same pipeline with the same --spark_parallelism, or use a new directory")
        # Written on a resume too: a directory that became read-only or full
        # fails here, before any micro-batch runs.
        _atomic_write(path, fingerprint.encode("utf-8"))

    def latest(self) -> Progress | None:
        batches = sorted(int(m.group(1)) for m in map(_COMMIT.match, os.listdir(self._commits)) if m)
        if not batches:
            return None
        with open(os.path.join(self._commits, f"{batches[-1]}.commit"), "rb") as f:
            return pickle.load(f)

    def commit(self, progress: Progress) -> None:
        try:
            _atomic_write(os.path.join(self._commits, f"{progress.batch}.commit"),
                          pickle.dumps(progress, protocol=pickle.HIGHEST_PROTOCOL))
            for name in os.listdir(self._commits):
                match = _COMMIT.match(name)
                if match and int(match.group(1)) <= progress.batch - _KEEP_COMMITS:
                    os.remove(os.path.join(self._commits, name))
        except OSError as exc:
            raise checkpoint_unwritable(self.root, f"the commit of batch {progress.batch}", exc) from exc


def _atomic_write(path: str, blob: bytes) -> None:
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(tmp)  # a full disk keeps no half-written file
        raise
