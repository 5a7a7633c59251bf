"""Which SDK wrote a pipeline: the job server runs Python steps only.

SparkRunner runs every step inside Spark's Python workers through Beam's
Python bundle processor; it starts no SDK harness. A step of another SDK
(a Java or Go DoFn, a cross-language transform) would need that SDK's
harness next to each task, so such pipelines are refused before they run.
A Python step written with another Beam or Python version is refused too:
its pickled code would be loaded by this process's Beam and Python.
"""
from __future__ import annotations

import re
import sys

import apache_beam
from apache_beam.portability import common_urns, python_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.transforms import environments

from beam_ext.errors import BeamExtError

_SDK_BASE = environments.SDK_VERSION_CAPABILITY_PREFIX
_PYTHON_IMAGE = re.compile(r"beam_python(\d+\.\d+)_sdk:(\S+)$")
# Environments only the Python SDK creates.
_PYTHON_ENV_URNS = frozenset([python_urns.EMBEDDED_PYTHON, python_urns.EMBEDDED_PYTHON_GRPC,
                              python_urns.EMBEDDED_PYTHON_LOOPBACK, python_urns.SUBPROCESS_SDK])
_ENV_KINDS = {common_urns.environments.DOCKER.urn: "docker",
              common_urns.environments.EXTERNAL.urn: "external worker pool, as LOOPBACK starts,",
              common_urns.environments.PROCESS.urn: "process"}
_SDK_NAMES = (("python", "Python"), ("java", "Java"), ("go", "Go"), ("typescript", "TypeScript"))


class UnsupportedPipelineError(BeamExtError, ValueError):
    """A pipeline has steps the job server cannot run (another SDK, another Beam or Python version)."""


def _sdk_of_image(image: str) -> str | None:
    name = image.rsplit("/", 1)[-1].split(":", 1)[0]
    for token, sdk in _SDK_NAMES:
        if f"_{token}" in name or name.startswith(token):
            return sdk
    return None


def _sdk_of_dofn(urn: str) -> str | None:
    if urn == python_urns.PICKLED_DOFN_INFO:
        return "Python"
    if "javasdk" in urn:
        return "Java"
    if urn.startswith("beam:go:"):
        return "Go"
    return None


def _sdk_base(env: beam_runner_api_pb2.Environment) -> str | None:
    for capability in env.capabilities:
        if capability.startswith(_SDK_BASE):
            return capability[len(_SDK_BASE):]
    return None


def _describe(env: beam_runner_api_pb2.Environment) -> tuple[str | None, str]:
    """(SDK name or None, how the environment names itself)."""
    base = _sdk_base(env)
    if base:
        return _sdk_of_image(base), base
    if env.urn == common_urns.environments.DOCKER.urn:
        image = beam_runner_api_pb2.DockerPayload.FromString(env.payload).container_image
        return _sdk_of_image(image), f"docker image {image}"
    if env.urn in _PYTHON_ENV_URNS:
        return "Python", env.urn
    return None, env.urn


def _python_version_problem(base: str) -> str | None:
    found = _PYTHON_IMAGE.search(base)
    if not found:
        return None
    python, beam = found.groups()
    here_python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if (python, beam) == (here_python, apache_beam.__version__):
        return None
    return (f"it was built with Beam {beam} on Python {python}, and this job server runs Beam "
            f"{apache_beam.__version__} on Python {here_python}: the pipeline's pickled code "
            f"loads only in the same versions. Submit it from Beam {apache_beam.__version__} on "
            f"Python {here_python}, or start the job server where Beam {beam} and Python {python} "
            f"are installed")


def check_python_pipeline(proto: beam_runner_api_pb2.Pipeline) -> list[str]:
    """Raises :class:`UnsupportedPipelineError` unless every step is Python of this Beam and Python.

    Returns notes on the environments that will not be started (their steps
    run in Spark's Python workers instead), for the job's log.

    Example::

        notes = check_python_pipeline(pipeline.to_runner_api())
    """
    steps_by_env: dict[str, list[str]] = {}
    dofn_sdks: dict[str, set[str]] = {}
    for transform in proto.components.transforms.values():
        if not transform.environment_id:
            continue
        steps_by_env.setdefault(transform.environment_id, []).append(transform.unique_name)
        if transform.spec.urn == common_urns.primitives.PAR_DO.urn:
            payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
            sdk = _sdk_of_dofn(payload.do_fn.urn)
            if sdk:
                dofn_sdks.setdefault(transform.environment_id, set()).add(sdk)
    notes = []
    for env_id, steps in sorted(steps_by_env.items()):
        env = proto.components.environments[env_id]
        choices = [_describe(e) for e in environments.expand_anyof_environments(env)]
        python = [name for sdk, name in choices if sdk == "Python"]
        sdks = {sdk for sdk, _ in choices if sdk} | dofn_sdks.get(env_id, set())
        shown = ", ".join(repr(s) for s in sorted(steps)[:3]) + (
            f" and {len(steps) - 3} more" if len(steps) > 3 else "")
        if not python or sdks - {"Python"}:
            sdk = ", ".join(sorted(sdks - {"Python"})) or "an unknown SDK"
            raise UnsupportedPipelineError(
                f"steps {shown} run in environment {env_id!r} ({choices[0][1]}) of the {sdk} SDK: "
                f"this job server runs Python steps only, in Spark's Python workers; a {sdk} step "
                f"needs its SDK harness next to each Spark task, which it does not start")
        problem = _python_version_problem(python[0])
        if problem:
            raise UnsupportedPipelineError(f"environment {env_id!r} ({python[0]}): {problem}")
        if env.urn != python_urns.EMBEDDED_PYTHON:
            notes.append(f"environment {env_id!r} ({_ENV_KINDS.get(env.urn, env.urn)} {python[0]}) is not "
                         f"started: its steps run in "
                         f"Spark's Python workers, with the job server's Beam "
                         f"{apache_beam.__version__} and its installed packages")
    return notes
