"""Tiny user packages, written into a test's tmp_path: neither installed in
the venv nor on the executors' PYTHONPATH, as a Dataflow user's own code."""
from __future__ import annotations

import base64
import hashlib
import textwrap
import zipfile
from pathlib import Path

_WHERE = '''
import importlib
import json

import apache_beam as beam


class Where(beam.DoFn):
    """Tags each element with the file every named module is imported from."""

    def __init__(self, modules):
        self._modules = modules

    def process(self, element):
        yield json.dumps([element, {m: importlib.import_module(m).__file__ for m in self._modules}])
'''


def write_package(root: Path, name: str, with_dofn: bool = False) -> Path:
    """A setuptools project ``root/name`` holding package ``name``; returns its setup.py."""
    project = root / name
    (project / name).mkdir(parents=True)
    (project / "setup.py").write_text(textwrap.dedent(f"""\
        import setuptools
        setuptools.setup(name="{name}", version="1.0", packages=["{name}"])
    """))
    (project / name / "__init__.py").write_text((_WHERE if with_dofn else "") + f"\nNAME = {name!r}\n")
    return project / "setup.py"


def write_wheel(dest: Path, name: str) -> Path:
    """A pure-Python wheel of package ``name`` written by hand, as a build
    backend would: the venv need not have the ``wheel`` package."""
    files = {f"{name}/__init__.py": f"NAME = {name!r}\n".encode(),
             f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             f"{name}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                                           b"Tag: py3-none-any\n"}
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{name}-1.0.dist-info/RECORD,,")
    files[f"{name}-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel
