"""Where a pytest run's CPU goes: this process (the driver) against the JVM it started.

A pytest plugin. Run from the checkout, in one process::

    PYTHONPATH=.:benchmarks python -m pytest -p pytest_cpu_split tests/test_runner_batch.py

At the end it prints the wall time, the CPU seconds of this Python process and
those of each process it started (the SparkSession's JVM), read from
``/proc`` before the session stops. Linux only. With ``JDK_JAVA_OPTIONS``
set (say ``-XX:TieredStopAtLevel=1``) the JVM runs with those options, and
``tests/conftest.py`` sets that one unless it is set already
(``JDK_JAVA_OPTIONS=`` runs the JVM with its defaults).
"""
from __future__ import annotations

import os
import resource
import time

import pytest

_STARTED = time.monotonic()


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of ``pid`` (``/proc/<pid>/stat`` fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _children(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(name))
        except OSError:
            continue  # exited meanwhile
    return found


@pytest.hookimpl(tryfirst=True)  # before the session's fixtures stop the JVM
def pytest_sessionfinish(session) -> None:
    me = resource.getrusage(resource.RUSAGE_SELF)
    lines = [f"wall {time.monotonic() - _STARTED:.1f} s; this process: user {me.ru_utime:.1f} s, "
             f"system {me.ru_stime:.1f} s"]
    for pid in _children(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                command = f.read().split("\0")[0]
            user, system = _cpu_seconds(pid)
        except OSError:
            continue
        lines.append(f"child {pid} ({os.path.basename(command)}): user {user:.1f} s, system {system:.1f} s")
    session.config.get_terminal_writer().line("\n".join(["", "CPU split:", *lines]))
