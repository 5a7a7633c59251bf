"""Failures inside Spark tasks, re-raised with the stage and the user's traceback."""
from __future__ import annotations

from beam_ext.errors import BeamExtError
import contextlib
import re


class PipelineError(BeamExtError, RuntimeError):
    """A pipeline failed; the message names the stage and shows the user's traceback."""


_FAILED_STEP = re.compile(r"\[while running '(.+?)'\]")
_PYTHON_TRACEBACK = re.compile(r"(Traceback \(most recent call last\):.*?)(?:\n\tat |\Z)", re.S)


def _user_part(message: str) -> str:
    found = _PYTHON_TRACEBACK.findall(message)
    if found:
        # The last Python traceback is the task's; trim the JVM frames around it.
        return found[-1].rstrip()
    return message.strip().splitlines()[0] if message.strip() else message


@contextlib.contextmanager
def translate_spark_error(stage_name: str):
    """Turns py4j/Spark errors of a stage's job into :class:`PipelineError`."""
    try:
        yield
    except PipelineError:
        raise
    except Exception as exc:
        text = str(exc)
        if "Py4JJavaError" not in type(exc).__name__ and "Traceback" not in text \
                and "PythonException" not in type(exc).__name__:
            raise
        # Beam's bundle processor tags the error with the step that raised it;
        # naming that step beats naming the whole fused stage.
        step = _FAILED_STEP.search(text)
        where = f"step {step.group(1)!r}" if step else f"stage {stage_name!r}"
        raise PipelineError(f"Beam {where} failed on Spark:\n{_user_part(text)}") from None
