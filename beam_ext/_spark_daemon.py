"""Spark's Python worker daemon, its imports done while the JVM starts.

Spark starts the daemon its Python workers fork from on the session's first
Python task, and SparkRunner's daemon (``beam_ext.runner.worker._daemon``)
then imports Beam and the runner's task code, about 2.5 s of one core on
this project's 2-core machine, while that task waits. When SparkRunner
starts a local session itself, it first starts a *warm* daemon
(:func:`start_warm`): a process that does those imports while the JVM
starts. When Spark then launches its daemon, that is this module
(``python -m beam_ext._spark_daemon``): it hands its standard streams,
environment, working directory and module path to the warm daemon, which
runs PySpark's daemon loop with them (and with its arguments, which name
the worker module), its imports already done.

The module sits at the top of the package, importing only the standard
library, so that Spark's launch of it costs no import of Beam: that is
what the warm daemon has done.

A warm daemon serves one hand-over and refuses one it cannot serve exactly
as a daemon Spark launched would run: another interpreter, another hash seed
or thread count for native code, both fixed when a process starts. Then, and
wherever no warm daemon is named (a session built elsewhere, a cluster's
executors, a daemon Spark restarts), this process runs SparkRunner's daemon
itself, as before.

After a hand-over this process stays the one Spark knows. When Spark stops
its daemon (SIGTERM) it stops the warm one; it exits when the warm one does.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile

# The executor environment variable naming a warm daemon's socket.
WARM_DAEMON_ENV = "BEAM_EXT_WARM_DAEMON"
# Variables the interpreter or native libraries read once, at a process's
# start: a warm daemon started with other values than Spark gives its
# daemon could not make its workers behave as Spark's would.
_FIXED_AT_START = ("PYTHONHASHSEED", "OMP_NUM_THREADS")
_LENGTH = struct.Struct("!I")


class WarmDaemon:
    """A warm daemon the driver started; :meth:`stop` ends it if still unused."""

    def __init__(self, process: subprocess.Popen, path: str) -> None:
        self.process = process
        self.path = path

    @property
    def pid(self) -> int:
        return self.process.pid

    def handed_over(self) -> bool:
        """Whether a daemon Spark launched took it over (it removes its socket then)."""
        return self.process.poll() is None and not os.path.exists(self.path)

    def stop(self) -> None:
        """Ends the warm daemon if no daemon took it over; Spark ends it otherwise."""
        if self.process.poll() is None and os.path.exists(self.path):
            self.process.kill()
            self.process.wait()
        _remove(self.path)


def start_warm(hash_seed: str, native_threads: str) -> WarmDaemon:
    """Starts a warm daemon for a local session about to start.

    ``hash_seed`` and ``native_threads`` are the ``PYTHONHASHSEED`` and
    ``OMP_NUM_THREADS`` Spark will give its daemon. The session's
    ``spark.executorEnv.BEAM_EXT_WARM_DAEMON`` must be ``path`` of the result.
    Standard input is a pipe from this process: the warm daemon exits when it
    closes, so one nobody took over dies with the driver.
    """
    path = os.path.join(tempfile.mkdtemp(prefix="beam_ext-daemon-"), "warm.sock")
    # Bound here, before the process starts: a daemon Spark launches at any
    # time after this returns finds the socket, and waits for the imports.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    env = dict(os.environ, PYTHONHASHSEED=hash_seed, OMP_NUM_THREADS=native_threads,
               PYTHONUNBUFFERED="YES")  # as Spark launches its daemon
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", __name__, "--serve", path, str(listener.fileno())], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, pass_fds=[listener.fileno()],
            process_group=0)  # as PySpark's daemon makes itself: terminal signals are not its
    finally:
        listener.close()
    return WarmDaemon(process, path)


def _remove(path: str) -> None:
    for remove in (os.unlink, os.rmdir):
        try:
            remove(path)
        except OSError:
            pass
        path = os.path.dirname(path)


def _refusal(request: dict) -> str:
    """Why this warm daemon cannot run as the daemon of ``request``, or ''."""
    if request["executable"] != sys.executable or request["version"] != sys.version:
        return f"interpreter {request['executable']} {request['version']!r}"
    for name in _FIXED_AT_START:
        if request["env"].get(name) != os.environ.get(name):
            return f"{name}={request['env'].get(name)!r}, warm daemon's {os.environ.get(name)!r}"
    return ""


def _send(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_LENGTH.pack(len(payload)) + payload)


def _receive(sock: socket.socket) -> bytes:
    data = b""
    while len(data) < _LENGTH.size:
        data += _received(sock, _LENGTH.size - len(data))
    (length,) = _LENGTH.unpack(data)
    data = b""
    while len(data) < length:
        data += _received(sock, min(length - len(data), 1 << 16))
    return data


def _received(sock: socket.socket, size: int) -> bytes:
    chunk = sock.recv(size)
    if not chunk:
        raise EOFError("the other side of the hand-over closed its socket")
    return chunk


def serve(path: str, listener_fd: int) -> None:
    """The warm daemon: imports, then waits for Spark's daemon and becomes it."""
    listener = socket.socket(fileno=listener_fd)
    from beam_ext.runner.worker._daemon import prepare

    prepare()
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1 << 12):
            _remove(path)
            return  # the driver is gone, and nobody took this over
        if listener in ready:
            break
    connection, _ = listener.accept()
    listener.close()
    _remove(path)
    _, peer_uid, _ = struct.unpack("3i", connection.getsockopt(
        socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    _, fds, _, _ = socket.recv_fds(connection, 1, 3)
    request = json.loads(_receive(connection))
    refusal = "another user" if peer_uid != os.getuid() else _refusal(request)
    if refusal or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        _send(connection, json.dumps({"refused": refusal or "streams missing"}).encode())
        return
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[:] = request["path"]
    sys.argv[:] = request["argv"]  # PySpark's daemon finds its worker module there
    # Workers fork from this process: the hand-over socket must stay this
    # process's alone, so Spark's daemon sees it close when this one exits.
    os.register_at_fork(after_in_child=connection.close)
    _send(connection, json.dumps({"pid": os.getpid()}).encode())
    from pyspark.daemon import manager

    from beam_ext.runner.worker._daemon import quiet_closed_workers

    quiet_closed_workers()
    manager()


def hand_over(path: str) -> int:
    """Hands this process's streams and environment to the warm daemon at
    ``path``; returns its pid once it has exited, or 0 if there is none or it
    refused."""
    warm_pid = 0
    stopping = False

    def stop(signum, frame):  # Spark stops its daemon with SIGTERM
        nonlocal stopping
        if warm_pid:
            os.kill(warm_pid, signal.SIGTERM)
            os._exit(0)
        stopping = True  # the warm daemon's pid is still on its way: stopped once it comes

    signal.signal(signal.SIGTERM, stop)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
        socket.send_fds(connection, [b"\0"], [0, 1, 2])
        _send(connection, json.dumps({
            "executable": sys.executable, "version": sys.version, "env": dict(os.environ),
            "cwd": os.getcwd(), "path": sys.path, "argv": sys.argv}).encode())
        reply = json.loads(_receive(connection))
    except (OSError, EOFError, ValueError):
        reply = {}
    if "pid" not in reply:
        if stopping:
            os._exit(0)
        if reply:
            sys.stderr.write(f"beam_ext: the warm Python worker daemon refused the hand-over "
                             f"({reply.get('refused')}); this one imports the runner's code itself\n")
        connection.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        return 0
    warm_pid = reply["pid"]
    if stopping:
        stop(signal.SIGTERM, None)
    while connection.recv(1 << 12):  # until the warm daemon exits
        pass
    return warm_pid


def main() -> None:
    """Spark's daemon module: takes over a warm daemon, or runs SparkRunner's."""
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]))
        return
    path = os.environ.get(WARM_DAEMON_ENV)
    if path and hand_over(path):
        return
    from beam_ext.runner.worker._daemon import run

    run()


if __name__ == "__main__":
    main()
