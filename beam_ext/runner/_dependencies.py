"""The user's code and packages on the executors, as Dataflow stages them.

``--setup_file``, ``--extra_package`` and ``--requirements_file`` are
installed with ``pip install --target`` into one directory, zipped, cached
under ``<staging>/beam_ext-deps/<content hash>/`` and shipped with
``SparkContext.addPyFile``: PySpark puts the zip on every Python worker's
``sys.path`` before it unpickles a task, so even coders and DoFns pickled by
reference import. A job whose dependencies did not change reuses the zip.

pip runs with ``--no-deps``, as Dataflow's ``pip download`` of requirements
does: the executors' environment is assumed to hold what the driver's holds;
requirements found in neither are reported.
"""
from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from importlib import metadata

from apache_beam.options import pipeline_options as po

from beam_ext.runner.dataflow_options import DataflowOptionError
from beam_ext.runner.worker._setup import WorkerSetup

_LOG = logging.getLogger("beam_ext.runner")
_DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "beam_ext", "staging")
# A class of __main__ pickled larger than this (a lookup table as a class
# attribute, say) is not shipped with every task.
_MAX_MAIN_CLASS_BYTES = 1 << 20
# Build leftovers that do not change the package.
_SKIP_DIRS = {"build", "dist", "__pycache__", ".git", ".venv", ".tox", ".pytest_cache"}


class DependencyError(DataflowOptionError, RuntimeError):
    """A dependency option (``--setup_file``, ...) could not be built; names the option."""


def _local_dir(location: str | None) -> str | None:
    if not location:
        return None
    if location.startswith("file://"):
        return location[len("file://"):]
    return None if "://" in location else location


def cache_root(options: po.PipelineOptions) -> str:
    """``--staging_location`` (else ``--temp_location``, as on Dataflow) when it
    is a local path, else ``~/.cache/beam_ext/staging``: pip builds locally and
    Spark ships the zip from the driver whatever the filesystem."""
    cloud = options.view_as(po.GoogleCloudOptions)
    for location in (cloud.staging_location, cloud.temp_location):
        local = _local_dir(location)
        if local:
            return os.path.join(local, "beam_ext-deps")
    return _DEFAULT_CACHE


def _hash_tree(digest, root: str) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            digest.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())


def _hash_file(digest, path: str) -> None:
    with open(path, "rb") as f:
        digest.update(hashlib.sha256(f.read()).digest())


def _requirement_paths(requirements_file: str) -> list[str]:
    """Local files a requirements file names (``./dist/pkg-1.0-py3-none-any.whl``):
    their content is part of the cache key, their names are not enough."""
    paths = []
    with open(requirements_file) as f:
        for line in f:
            entry = line.split("#", 1)[0].strip()
            if entry and not entry.startswith("-") and os.path.isfile(entry):
                paths.append(entry)
    return paths


def _check_exists(flag: str, path: str) -> None:
    if not os.path.exists(path):
        raise DependencyError(f"{flag}: {path!r} does not exist")


def _pip_args(setup: po.SetupOptions) -> tuple[str | None, list[str], str]:
    """The project directory of ``--setup_file``, pip's arguments for the other
    options, and the content hash that keys them all."""
    digest = hashlib.sha256(f"{sys.version_info[:2]}{sysconfig.get_platform()}".encode())
    project = None
    if setup.setup_file:
        _check_exists("--setup_file", setup.setup_file)
        if os.path.basename(setup.setup_file) != "setup.py":
            raise DependencyError(f"--setup_file must name a setup.py, got {setup.setup_file!r}")
        project = os.path.dirname(os.path.abspath(setup.setup_file))
        digest.update(b"setup\0")
        _hash_tree(digest, project)
    args: list[str] = []
    for package in setup.extra_packages or []:
        _check_exists("--extra_package", package)
        digest.update(b"extra\0" + os.path.basename(package).encode())
        _hash_file(digest, package)
        args.append(os.path.abspath(package))
    if setup.requirements_file:
        _check_exists("--requirements_file", setup.requirements_file)
        digest.update(b"requirements\0")
        _hash_file(digest, setup.requirements_file)
        for path in _requirement_paths(setup.requirements_file):
            _hash_file(digest, path)
        args += ["-r", os.path.abspath(setup.requirements_file)]
    return project, args, digest.hexdigest()[:24]


def _run(cmd: list[str], flags: str, cwd: str | None = None) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        raise DependencyError(f"could not install {flags} for the executors: "
                              f"{' '.join(cmd)} failed:\n{(done.stdout + done.stderr)[-3000:]}")


def _install(project: str | None, args: list[str], pip_flags: str, site: str, scratch: str) -> None:
    if project is not None:
        # setup.py's own build, as Dataflow runs setup.py sdist: no index and
        # no wheel package needed; egg-info keeps its requirements for the check.
        _run([sys.executable, "setup.py", "--quiet", "egg_info", "--egg-base", site, "build",
              "--build-base", os.path.join(scratch, "build"), "--build-lib", site],
             "--setup_file", cwd=project)
    if args:
        _run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
              "--no-deps", "--no-warn-script-location", "--target", site, *args],
             pip_flags)


def _unmet_requirements(site: str) -> list[str]:
    """Requirements of the installed packages found neither in ``site`` nor in
    the driver's environment."""
    from packaging.requirements import Requirement

    here = {(d.metadata["Name"] or "").lower().replace("_", "-")
            for d in metadata.distributions(path=[site])}
    unmet = []
    for dist in metadata.distributions(path=[site]):
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            name = req.name.lower().replace("_", "-")
            if name in here:
                continue
            try:
                metadata.version(req.name)
            except metadata.PackageNotFoundError:
                unmet.append(f"{req} (for {dist.metadata['Name']})")
    return unmet


def build(options: po.PipelineOptions) -> str | None:
    """The zip of everything the dependency options install, built once per
    content; None when none is set."""
    project, args, key = _pip_args(options.view_as(po.SetupOptions))
    if project is None and not args:
        return None
    target = os.path.join(cache_root(options), key)
    # Named by content: Spark refuses a second file of the same name.
    name = f"beam_ext_deps-{key}.zip"
    archive = os.path.join(target, name)
    if os.path.exists(archive):
        _LOG.info("Dependencies unchanged: reusing %s", archive)
        return archive
    os.makedirs(target, exist_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        site = os.path.join(tmp, "site")
        os.makedirs(site)
        setup = options.view_as(po.SetupOptions)
        pip_flags = " and ".join(f for f, v in (("--extra_package", setup.extra_packages),
                                                ("--requirements_file", setup.requirements_file)) if v)
        _install(project, args, pip_flags, site, tmp)
        unmet = _unmet_requirements(site)
        if unmet:
            _LOG.warning("Executors must already have (not in the driver's environment either): %s",
                         ", ".join(unmet))
        native = _zip_tree(site, os.path.join(tmp, name))
        if native:
            _LOG.warning("Compiled extension modules cannot be imported from the zip Spark ships "
                         "(%s): install their packages in the executors' environment", ", ".join(native[:5]))
        os.replace(os.path.join(tmp, name), archive)
    _LOG.info("Built the executors' dependencies in %.1fs: %s", time.monotonic() - start, archive)
    return archive


def _zip_tree(root: str, archive: str) -> list[str]:
    """Zips ``root``; returns the extension modules it holds."""
    native = []
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and d != "bin")
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                if name.endswith((".so", ".pyd")):
                    native.append(rel)
                z.write(path, rel)
    return native


def worker_setup(options: po.PipelineOptions) -> WorkerSetup:
    """The per-process setup of the executors: pickler, saved main session, plugins, the classes of ``__main__``."""
    from apache_beam.internal import pickler

    setup = options.view_as(po.SetupOptions)
    session = None
    if setup.save_main_session:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "main_session.pickle")
            pickler.dump_session(path)
            with open(path, "rb") as f:
                session = f.read()
    plugins = tuple(p.strip() for entry in setup.beam_plugins or [] for p in entry.split(",") if p.strip())
    library = setup.pickle_library or "default"
    # dill pickles a class of __main__ by reference; its way is --save_main_session.
    classes = _main_classes() if library in ("default", pickler.USE_CLOUDPICKLE) else ()
    return WorkerSetup(library, session, plugins, classes)


def _main_classes() -> tuple[tuple[str, bytes], ...]:
    """The classes the driver's ``__main__`` defines, each pickled by value by
    cloudpickle (see ``worker/_setup.py`` for why the workers need them)."""
    from apache_beam.internal import pickler

    main = sys.modules.get("__main__")
    classes = []
    for name, value in list(vars(main).items()) if main is not None else ():
        if isinstance(value, type) and value.__module__ == "__main__" and value.__qualname__ == name:
            try:
                pickled = pickler.dumps(value)
            except Exception as e:  # noqa: BLE001 - one unpicklable class must not fail the job
                _LOG.debug("%s of __main__ is not shipped to the workers: %s", name, e)
                continue
            if len(pickled) > _MAX_MAIN_CLASS_BYTES:
                # Every task of the job carries it: a class holding data is left to its own module.
                _LOG.info("%s of __main__ is not shipped to the workers: %d bytes pickled", name, len(pickled))
                continue
            classes.append((name, pickled))
    return tuple(classes)


def ship(context, options: po.PipelineOptions) -> None:
    """Builds the dependency zip if needed and adds it, and ``--files_to_stage``,
    to the SparkContext ``context`` (a running one too: Spark ships files
    added late)."""
    archive = build(options)
    if archive is not None:
        context.addPyFile(archive)
        # The driver imports the same code, e.g. to unpickle what executors
        # return; its own copy, if any, comes first.
        if archive not in sys.path:
            sys.path.append(archive)
    for path in options.view_as(po.SetupOptions).files_to_stage or []:
        _check_exists("--files_to_stage", path)
        context.addFile(path)
