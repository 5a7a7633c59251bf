"""The driver JVM's class archive: written once, checked before use, never trusted truncated.

Real ``java`` throughout: archives come from ``java -XX:ArchiveClassesAtExit
-version``, a few MB, written in well under a second.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from beam_ext.runner import _jvm_class_cache as cache
from beam_ext.runner.session import _check_java

JAVA, JAVA_MAJOR, JAVA_VERSION = _check_java()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("BEAM_EXT_JVM_CACHE", str(tmp_path))
    return tmp_path


def _options(user: str = "") -> str | None:
    return cache.driver_java_options(JAVA, JAVA_MAJOR, JAVA_VERSION, user)


def _real_archive(path) -> None:
    subprocess.run([JAVA, f"-XX:ArchiveClassesAtExit={path}", "-Xlog:cds*=off", "-version"],
                   check=True, capture_output=True)
    assert os.path.getsize(path) > 16 << 10


def _settle(path) -> None:
    old = time.time() - 10 * cache._SETTLE_SECONDS
    os.utime(path, (old, old))


pytestmark = pytest.mark.skipif(JAVA_MAJOR >= 19, reason="Java 19+ manages its archive itself "
                                "(-XX:+AutoCreateSharedArchive); these tests cover the Java 17 path")


def test_first_start_asks_the_jvm_to_write_a_candidate(cache_dir):
    options = _options()
    assert options.startswith(f"-XX:ArchiveClassesAtExit={cache_dir}")
    assert f".{os.getpid()}.partial" in options
    assert "-Xlog:cds*=off" in options


def test_a_settled_candidate_that_maps_cleanly_becomes_the_archive(cache_dir):
    candidate = _options().split()[0].split("=", 1)[1]
    _real_archive(candidate)
    _settle(candidate)
    options = _options()
    archive = candidate.rsplit(".", 2)[0] + ".jsa"
    assert options == f"-XX:SharedArchiveFile={archive} -Xlog:cds*=off"
    assert os.path.exists(archive) and not os.path.exists(candidate)
    # The archive is used as it is from then on.
    assert _options() == options


def test_a_truncated_candidate_is_deleted_not_used(cache_dir, tmp_path_factory):
    candidate = _options().split()[0].split("=", 1)[1]
    whole = tmp_path_factory.mktemp("whole") / "whole.jsa"
    _real_archive(whole)
    with open(whole, "rb") as src, open(candidate, "wb") as dst:
        dst.write(src.read(os.path.getsize(whole) // 2))
    # The JVM aborts on a truncated archive: that is why it is checked first.
    aborted = subprocess.run([JAVA, f"-XX:SharedArchiveFile={candidate}", f"-XX:ErrorFile={os.devnull}",
                              "-version"], capture_output=True, cwd=cache_dir)
    assert aborted.returncode != 0
    _settle(candidate)
    options = _options()
    assert not os.path.exists(candidate)
    assert options.startswith("-XX:ArchiveClassesAtExit=")  # a new candidate, not the bad one
    assert not any(name.endswith(".jsa") for name in os.listdir(cache_dir))
    assert not [name for name in os.listdir(cache_dir) if name.startswith("hs_err")]


def test_a_candidate_still_being_written_is_left_alone(cache_dir):
    candidate = _options().split()[0].split("=", 1)[1]
    with open(candidate, "wb") as f:
        f.write(b"\0" * 1024)
    assert _options() is None  # neither used nor written twice
    assert os.path.exists(candidate)


def test_the_users_class_sharing_flags_win(cache_dir):
    assert _options("-Xshare:off") is None
    assert _options("-XX:SharedArchiveFile=/opt/mine.jsa") is None
    assert os.listdir(cache_dir) == []


def test_off_turns_it_off(monkeypatch):
    monkeypatch.setenv("BEAM_EXT_JVM_CACHE", "off")
    assert _options() is None


def test_an_unwritable_cache_directory_starts_spark_without_an_archive(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("BEAM_EXT_JVM_CACHE", str(blocker / "jvm"))
    assert _options() is None


def test_the_key_changes_with_the_java_build(cache_dir):
    a = cache._archive_key(JAVA, JAVA_VERSION)
    assert a == cache._archive_key(JAVA, JAVA_VERSION)
    assert a != cache._archive_key(JAVA, JAVA_VERSION + " (another build)")
    assert shutil.which("java") or os.environ.get("JAVA_HOME")


def test_the_key_changes_with_sparks_jars_directory(cache_dir, tmp_path):
    # The same jars in another directory (another virtualenv): the JVM would
    # ignore an archive recorded with the first one's paths.
    import pyspark

    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    elsewhere = tmp_path / "jars"
    elsewhere.mkdir()
    for name in os.listdir(jars):
        os.symlink(os.path.join(jars, name), elsewhere / name)
    assert cache._archive_key(JAVA, JAVA_VERSION) == cache._archive_key(JAVA, JAVA_VERSION, jars)
    assert cache._archive_key(JAVA, JAVA_VERSION) != cache._archive_key(JAVA, JAVA_VERSION, str(elsewhere))


def test_archives_of_other_keys_unused_for_30_days_are_removed(cache_dir):
    # Another Java build's, pyspark's or virtualenv's archive, and a candidate
    # a killed start left: removed once unused for 30 days; recent ones and
    # files that are not this cache's stay; the archive in use is marked.
    key = cache._archive_key(JAVA, JAVA_VERSION)
    old = time.time() - 31 * 24 * 3600
    files = {name: cache_dir / name for name in (
        "0123456789abcdef0123.jsa", "fedcba9876543210fedc.4242.partial",  # old, another key
        "00000000000000000000.jsa",  # recent, another key
        "notes.jsa", f"{key}.jsa")}  # not the cache's naming; this key's
    for name, path in files.items():
        path.write_bytes(b"x")
        if name != "00000000000000000000.jsa":
            os.utime(path, (old, old))
    _options()
    assert sorted(p.name for p in cache_dir.iterdir()) == sorted(["00000000000000000000.jsa", "notes.jsa", f"{key}.jsa"])
    assert time.time() - os.path.getmtime(files[f"{key}.jsa"]) < 60  # marked as used
