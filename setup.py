"""beam_ext: Apache Beam Python pipelines on Apache Spark, with exact windowing."""
from setuptools import find_packages, setup

setup(
    name="beam_ext",
    version="0.1.0",
    description=(
        "A portable Apache Beam runner on PySpark and windowing transforms "
        "(exact sliding, lateness spill, sampled, staleness triggers)."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["beam_ext", "beam_ext.*"]),
    package_data={"beam_ext": ["py.typed", "watermark/tracker.proto"]},
    install_requires=[
        "apache-beam==2.77.*",
        "pyspark>=4.0,<5",
        "pyarrow>=15",
        "lmdb>=1.4",
        "numpy>=1.26",
        "scipy>=1.11",
        "grpcio>=1.60",
        # The checked-in beam_ext/watermark/_tracker_pb2.py is gencode 6.31.1;
        # protobuf refuses gencode newer than its runtime or of another major.
        "protobuf>=6.31.1,<7",
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "pytest-xdist>=3.5",  # `make test` runs two workers (Makefile)
            "ruff>=0.6",  # `make test` lints first (ruff.toml)
            "hypothesis>=6.100",
            # Beam's own runner tests (tests/beam_conformance) need these.
            "pyhamcrest",
            "parameterized",
            "mock",
            "tenacity",
            "dill==0.3.1.1",  # the version Beam requires for its compatibility-mode tests
            # Beam's DataFrame tests (tests/beam_conformance) need the [dataframe] range.
            "pandas>=2.2,<2.4",
        ],
        # Beam 2.77's DataFrame API supports pandas < 2.4 (its own `dataframe`
        # extra); PySpark's pandas functions need >= 2.2. pandas 3 breaks
        # `import apache_beam.dataframe.transforms`.
        "dataframe": ["pandas>=2.2,<2.4"],
        # pandas: PySpark requires it for mapInArrow (benchmarks/sliding.py).
        "bench": ["matplotlib>=3.8", "pandas>=2.2,<2.4"],
    },
)
