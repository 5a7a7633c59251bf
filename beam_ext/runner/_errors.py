"""Failures inside Spark tasks, re-raised with the user's step and the cause."""
from __future__ import annotations

import contextlib
import re
from typing import Sequence

from beam_ext.errors import BeamExtError


class PipelineError(BeamExtError, RuntimeError):
    """A pipeline failed; the message names the step and shows the cause.

    The cause is the user's Python traceback when there is one, else Spark's
    own reason (for example "Python worker exited unexpectedly (crashed)").
    ``step`` is the Beam step the failure was pinned on, None when the task
    left no trace of it (a dead Python worker).
    """

    step: str | None = None


class CheckpointUnwritable(BeamExtError, OSError):
    """``--checkpoint_dir`` cannot be written (read-only, full, no permission).

    The message names the directory, what was being written and the
    system's reason; ``errno`` is the system's error number.
    """


def checkpoint_unwritable(root: str, writing: str, exc: OSError) -> CheckpointUnwritable:
    """The error to raise when writing ``writing`` under the checkpoint ``root`` failed with ``exc``."""
    return CheckpointUnwritable(
        exc.errno, f"--checkpoint_dir {root!r} cannot be written ({writing}): {exc.strerror or exc}")


_FAILED_STEP = re.compile(r"\[while running '(.+?)'\]")
_PYTHON_TRACEBACK = re.compile(r"(Traceback \(most recent call last\):.*?)(?:\n\tat |\Z)", re.S)
# py4j puts the JVM exception on the line after "An error occurred while calling ...".
_JAVA_EXCEPTION = re.compile(r"^:?\s*((?:[\w$]+\.)+[\w$]+(?:Exception|Error): .+)$", re.M)


def _cause(message: str) -> str:
    found = _PYTHON_TRACEBACK.findall(message)
    if found:
        # The last Python traceback is the task's; trim the JVM frames around it.
        return found[-1].rstrip()
    # No Python traceback (the Python worker died, or Spark itself failed):
    # Spark's first exception line carries its reason for the failed task.
    java = _JAVA_EXCEPTION.search(message)
    if java:
        return java.group(1).strip()
    return message.strip().splitlines()[0] if message.strip() else message


def _where(message: str, steps: Sequence[str]) -> str:
    # Beam's bundle processor tags a Python error with the step that raised
    # it. A dead worker leaves no tag: name the steps fused into the stage.
    step = _FAILED_STEP.search(message)
    if step:
        return f"Beam step {step.group(1)!r}"
    if len(steps) == 1:
        return f"Beam step {steps[0]!r}"
    return "One of the Beam steps " + ", ".join(map(repr, steps))


@contextlib.contextmanager
def translate_spark_error(steps: Sequence[str]):
    """Turns py4j/Spark errors of a stage's job into :class:`PipelineError`.

    ``steps``: the user's steps fused into the stage, named when the failure
    cannot be pinned on one of them.
    """
    try:
        yield
    except PipelineError:
        raise
    except Exception as exc:
        text = str(exc)
        if "Py4JJavaError" not in type(exc).__name__ and "Traceback" not in text \
                and "PythonException" not in type(exc).__name__:
            raise
        error = PipelineError(f"{_where(text, steps)} failed on Spark:\n{_cause(text)}")
        pinned = _FAILED_STEP.search(text)
        error.step = pinned.group(1) if pinned else (steps[0] if len(steps) == 1 else None)
        raise error from None
