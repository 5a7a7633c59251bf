"""A class-data-sharing archive of the driver JVM, so Spark starts faster.

Loading and verifying Spark's classes is most of a local driver's start-up:
on 2 cores a bare ``SparkSession`` took 8.4 s to start, and 5.0 s with an
archive of the classes the previous start loaded (commands in
``docs/runner.md``). The JVM writes that archive itself when asked to at
exit (``-XX:ArchiveClassesAtExit``) and maps it on the next start
(``-XX:SharedArchiveFile``); Java 19+ does both with one flag
(``-XX:+AutoCreateSharedArchive``).

On Java 17 and 18 the archive is written after the Python process has
exited, so nobody can tell a finished archive from one cut short by a kill,
and a truncated archive aborts the JVM that maps it. A written archive is
therefore a candidate until a later start checks it with ``java -version``
(which aborts on a truncated archive and ignores one that merely does not
fit) and only then renames it into place. One archive per Java build and
Spark jar set (and directory), under ``~/.cache/beam_ext/jvm``
(``$BEAM_EXT_JVM_CACHE`` moves it; ``off`` turns this off). Each start
marks the archive it uses; archives of other keys unused for 30 days are
removed.
"""
from __future__ import annotations

import glob
import hashlib
import logging
import os
import re
import subprocess
import time

_LOG = logging.getLogger(__name__)
_ENV = "BEAM_EXT_JVM_CACHE"
_DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cache", "beam_ext", "jvm")
# A candidate younger than this may still be being written by its JVM.
_SETTLE_SECONDS = 20.0
# Options by which a user already decides about class sharing: theirs win.
_USER_CDS_FLAGS = ("SharedArchiveFile", "ArchiveClassesAtExit", "Xshare", "AutoCreateSharedArchive")
# The JVM warns on stdout about each class it cannot archive.
_QUIET = "-Xlog:cds*=off"
# An archive of another key (another Java, pyspark or virtualenv) unused this
# long is removed: each is about 110 MB, and nothing else would delete it.
_UNUSED_SECONDS = 30 * 24 * 3600
_OURS = re.compile(r"[0-9a-f]{20}(\.\d+\.partial|\.jsa)")


def _archive_key(java: str, version_text: str, jars: str | None = None) -> str:
    """The archive's name for this Java build and Spark's ``jars`` directory
    (pyspark's own by default)."""
    import pyspark

    jars = jars or os.path.join(os.path.dirname(pyspark.__file__), "jars")
    listing = sorted((os.path.basename(p), os.path.getsize(p)) for p in glob.glob(os.path.join(jars, "*.jar")))
    # The directory too: an archive records its classes' jar paths, and the
    # JVM ignores one whose paths differ (another virtualenv with the same
    # pyspark), so each gets its own.
    digest = hashlib.sha256(repr((os.path.realpath(java), version_text, pyspark.__version__,
                                  os.path.realpath(jars), listing)).encode()).hexdigest()
    return digest[:20]


def _promote(candidates: list[str], archive: str, java: str) -> None:
    """Moves the first settled candidate that the JVM maps cleanly to ``archive``."""
    now = time.time()
    for path in candidates:
        try:
            if now - os.path.getmtime(path) < _SETTLE_SECONDS:
                continue
            # A truncated archive aborts the JVM: its crash report goes nowhere,
            # not into the user's working directory.
            check = subprocess.run([java, f"-XX:SharedArchiveFile={path}", f"-XX:ErrorFile={os.devnull}",
                                    _QUIET, "-version"], capture_output=True, timeout=60,
                                   cwd=os.path.dirname(path))
            if check.returncode == 0 and not os.path.exists(archive):
                os.replace(path, archive)
                _LOG.info("JVM class archive ready: %s", archive)
            else:
                os.remove(path)
        except (OSError, subprocess.SubprocessError):
            continue


def _prune(directory: str, key: str) -> None:
    """Removes this cache's archives and candidates of other keys unused for
    :data:`_UNUSED_SECONDS` (a start marks the archive it uses); any other file is left."""
    now = time.time()
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.startswith(key) or not _OURS.fullmatch(name):
            continue
        path = os.path.join(directory, name)
        try:
            if now - os.path.getmtime(path) > _UNUSED_SECONDS:
                os.remove(path)
                _LOG.info("removed a JVM class archive unused for %d days: %s", _UNUSED_SECONDS // 86400, path)
        except OSError:
            continue


def _mark_used(archive: str) -> None:
    try:
        os.utime(archive)
    except OSError:
        pass  # another user's cache: it is only not pruned sooner


def driver_java_options(java: str, java_major: int, version_text: str, user_options: str = "") -> str | None:
    """Extra driver JVM options using (or writing) the class archive; None to add nothing.

    Example::

        driver_java_options("/usr/bin/java", 17, 'openjdk version "17.0.15"')
        # '-XX:SharedArchiveFile=/root/.cache/beam_ext/jvm/<key>.jsa -Xlog:cds*=off'
    """
    setting = os.environ.get(_ENV, "")
    if setting.lower() == "off" or any(flag in user_options for flag in _USER_CDS_FLAGS):
        return None
    directory = setting or _DEFAULT_DIR
    try:
        os.makedirs(directory, exist_ok=True)
        key = _archive_key(java, version_text)
    except OSError as exc:
        _LOG.info("no JVM class archive (%s): Spark starts without one", exc)
        return None
    archive = os.path.join(directory, f"{key}.jsa")
    _prune(directory, key)
    _mark_used(archive)
    if java_major >= 19:
        return f"-XX:+AutoCreateSharedArchive -XX:SharedArchiveFile={archive} {_QUIET}"
    if not os.path.exists(archive):
        candidates = sorted(glob.glob(os.path.join(directory, f"{key}.*.partial")))
        _promote(candidates, archive, java)
    if os.path.exists(archive):
        return f"-XX:SharedArchiveFile={archive} {_QUIET}"
    if glob.glob(os.path.join(directory, f"{key}.*.partial")):
        return None  # another start is writing one
    return f"-XX:ArchiveClassesAtExit={os.path.join(directory, f'{key}.{os.getpid()}.partial')} {_QUIET}"
