"""ReadFromText and WriteToText on SparkRunner's native path give Beam's results.

The oracle for reading is Beam's own text source read in-process
(``source_test_utils.read_from_source``); for writing, DirectRunner's files.
"""
from __future__ import annotations

import bz2
import gzip
import logging
import os

import apache_beam as beam
import hypothesis.strategies as st
import pytest
from apache_beam import coders
from apache_beam.io import source_test_utils, textio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from hypothesis import HealthCheck, given, settings
from pipeline_outputs import spark_jobs_run

from beam_ext.runner import PipelineError, SparkRunner
from beam_ext.runner.native import NativeContext
from beam_ext.runner.native._textio import READ_TEXT_URN, WRITE_TEXT_URN, ReadConfig, read_lines

NATIVE_READ = f"runs Spark-natively ({READ_TEXT_URN})"
NATIVE_WRITE = f"runs Spark-natively ({WRITE_TEXT_URN})"

TRICKY = {
    "crlf.txt": b"one\r\ntwo\r\nthree\r\n",
    "lone_cr.txt": b"a\rb\nc\r\rd\r\n\r\n",
    "no_newline.txt": b"first\nlast without newline",
    "ends_cr.txt": b"x\ny\r",
    "only_cr.txt": b"mac\rstyle\r",
    "empty.txt": b"",
    "empty_lines.txt": b"\n\n\r\n\n",
    "unicode.txt": "h\u00e9llo\nw\u00f6rld \u2603\n\U0001f600\r\n".encode(),
    "newline_only.txt": b"\n",
}
COMPRESSED = {
    "g.txt.gz": gzip.compress(b"gz1\r\ngz2\ngz3\r"),
    "b.txt.bz2": bz2.compress(b"bz1\nbz2\r\n\nbz3"),
    "empty.gz": gzip.compress(b""),
}


def _write_files(directory, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)


def _beam_lines(pattern: str, **kwargs) -> list:
    """What Beam's own text source reads: the oracle."""
    source = textio._TextSource(pattern, 0, kwargs.pop("compression_type", CompressionTypes.AUTO),
                                True, kwargs.pop("coder", coders.StrUtf8Coder()), **kwargs)
    return source_test_utils.read_from_source(source)


def _spark_read(spark, pattern: str, skip: int = 0, compression=CompressionTypes.AUTO,
                coder=None, min_split: int = 1 << 20, chunk: int = 1 << 20, parallelism: int = 2) -> list:
    """The native read called directly, windows and timestamps checked. Ranges
    are ``min_split`` bytes long where ``parallelism`` exceeds the bytes."""
    config = ReadConfig(pattern, compression, coder or coders.StrUtf8Coder(), skip)
    ctx = NativeContext(sc=spark.sparkContext, parallelism=parallelism, step_name="Read", counter=None)
    values = read_lines(config, ctx, min_split, chunk).elements().collect()
    assert all(wv.timestamp == MIN_TIMESTAMP and wv.windows == (GlobalWindow(),) for wv in values)
    return [wv.value for wv in values]


def test_tricky_files_read_as_beam_reads_them(spark, tmp_path, caplog):
    _write_files(tmp_path, {**TRICKY, **COMPRESSED})
    pattern = str(tmp_path / "*")
    expected = _beam_lines(pattern)
    assert "two\rthree" not in expected and "mac\rstyle\r" in expected  # the cases are there
    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            assert_that(p | beam.io.ReadFromText(pattern), equal_to(expected))
    assert NATIVE_READ in caplog.text
    assert sorted(_spark_read(spark, pattern)) == sorted(expected)
    # Ranges of two bytes: every line boundary case falls on a range boundary somewhere;
    # reads of one to three bytes: and on a chunk boundary.
    for chunk in (1, 2, 3, 1 << 20):
        assert sorted(_spark_read(spark, pattern, min_split=2, chunk=chunk, parallelism=1000)) == sorted(expected)


@pytest.mark.parametrize("skip", [1, 2])
def test_skip_header_lines_per_file(spark, tmp_path, skip):
    _write_files(tmp_path, {**TRICKY, **COMPRESSED})
    pattern = str(tmp_path / "*")
    expected = sorted(_beam_lines(pattern, skip_header_lines=skip))
    assert sorted(_spark_read(spark, pattern, skip=skip)) == expected
    assert sorted(_spark_read(spark, pattern, skip=skip, chunk=2)) == expected


def test_explicit_compression_and_other_coders(spark, tmp_path):
    # Explicit GZIP on files without the .gz suffix: Beam decompresses them all.
    _write_files(tmp_path, {"a.data": gzip.compress(b"1\r\n2\n"), "b.data": gzip.compress(b"3")})
    pattern = str(tmp_path / "*.data")
    assert sorted(_spark_read(spark, pattern, compression=CompressionTypes.GZIP)) == ["1", "2", "3"]
    _write_files(tmp_path, {"raw.txt": b"\xff\xfe\r\nz\r\r\n"})
    raw = str(tmp_path / "raw.txt")
    assert sorted(_spark_read(spark, raw, coder=coders.BytesCoder(), min_split=2, parallelism=1000)) == sorted(
        _beam_lines(raw, coder=coders.BytesCoder())) == [b"\xff\xfe", b"z\r"][::-1]


def test_invalid_utf8_raises_naming_the_pattern(spark, tmp_path):
    _write_files(tmp_path, {"bad.txt": b"ok\nbad \xff byte\n"})
    with pytest.raises(UnicodeDecodeError):
        _beam_lines(str(tmp_path / "bad.txt"))
    with pytest.raises(Exception, match="not valid UTF-8"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = p | beam.io.ReadFromText(str(tmp_path / "bad.txt"))


_PIECES = st.sampled_from([b"a", b"bc", b" ", b"\n", b"\r", b"\r\n", "\u00e9".encode(), b""])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(contents=st.lists(st.lists(_PIECES, max_size=30).map(b"".join), min_size=1, max_size=3),
       skip=st.sampled_from([0, 0, 1]), split=st.integers(1, 9), chunk=st.sampled_from([1, 2, 5, 1 << 20]))
def test_random_files_read_as_beam_reads_them(spark, tmp_path_factory, contents, skip, split, chunk):
    directory = tmp_path_factory.mktemp("random")
    _write_files(directory, {f"f{i}.txt": data for i, data in enumerate(contents)})
    _write_files(directory, {"z.txt.gz": gzip.compress(contents[0])})
    pattern = str(directory / "*")
    # Ranges of a few bytes: lines cross range boundaries.
    got = _spark_read(spark, pattern, skip=skip, min_split=split, chunk=chunk, parallelism=1000)
    assert sorted(got) == sorted(_beam_lines(pattern, skip_header_lines=skip))


def test_small_files_share_tasks_in_file_order(spark, tmp_path):
    # Forty small files read as a task each cost more in tasks than in reading.
    files = {f"part-{i:02d}.txt": "".join(f"{i}:{j}\n" for j in range(i % 5)).encode() for i in range(40)}
    _write_files(tmp_path, files)
    config = ReadConfig(str(tmp_path / "part-*.txt"), CompressionTypes.AUTO, coders.StrUtf8Coder(), 0)
    ctx = NativeContext(sc=spark.sparkContext, parallelism=2, step_name="Read", counter=None)
    read = read_lines(config, ctx)
    assert read.rdd.getNumPartitions() <= 3
    # Each task takes a run of neighbouring files: the read keeps the order Beam matched them in.
    [match] = FileSystems.match([config.pattern])
    expected = [line for m in match.metadata_list for line in files[os.path.basename(m.path)].decode().splitlines()]
    assert [wv.value for wv in read.elements().collect()] == expected


def test_unsupported_read_options_run_beams_read(spark, tmp_path, caplog):
    _write_files(tmp_path, {"a.txt": b"1;2;3\n", "b.txt": b"x;y"})
    pattern = str(tmp_path / "*.txt")
    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            assert_that(p | beam.io.ReadFromText(pattern, delimiter=b";"),
                        equal_to(["1", "2", "3\n", "x", "y"]), label="delimited")
            assert_that(p | beam.io.ReadFromTextWithFilename(pattern) | beam.Values(),
                        equal_to(["1;2;3", "x;y"]), label="with_filename")
    assert "'ReadFromText': it has a custom delimiter; running Beam's ReadFromText" in caplog.text
    assert "ReadFromTextWithFilename is not ReadFromText itself" in caplog.text
    assert NATIVE_READ not in caplog.text


# -- writing ---------------------------------------------------------------
def _open(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _write(runner, prefix: str, elements, **kwargs) -> list[str]:
    with beam.Pipeline(runner=runner) as p:
        names = p | beam.Create(elements) | beam.io.WriteToText(prefix, **kwargs)
        assert_that(names | beam.Map(os.path.basename),
                    equal_to(sorted(os.path.basename(n) for n in _expected_names(prefix, **kwargs))))
    return sorted(os.listdir(os.path.dirname(prefix)))


def _expected_names(prefix: str, num_shards=1, file_name_suffix="", **_) -> list[str]:
    return [f"{prefix}-{i:05d}-of-{num_shards:05d}{file_name_suffix}" for i in range(num_shards)]


def _shards(directory) -> dict[str, list[bytes]]:
    out = {}
    for name in sorted(os.listdir(directory)):
        with _open(os.path.join(directory, name)) as f:
            out[name] = f.read().split(b"\n")
    return out


@pytest.mark.parametrize("kwargs", [
    {"num_shards": 3, "header": "id,name", "footer": "end"},
    {"num_shards": 3, "file_name_suffix": ".csv.gz", "header": "h"},
    {"num_shards": 1, "append_trailing_newlines": False},
])
def test_write_matches_direct_runner(spark, tmp_path, caplog, kwargs):
    elements = [f"row {i} \u00e9" for i in range(50)] + [7, b"raw"]
    (tmp_path / "direct").mkdir()
    (tmp_path / "spark").mkdir()
    direct = _write("DirectRunner", str(tmp_path / "direct" / "out"), elements, **kwargs)
    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        native = _write(SparkRunner(), str(tmp_path / "spark" / "out"), elements, **kwargs)
    assert NATIVE_WRITE in caplog.text
    assert native == direct  # the same file names, and nothing else (no temporary files left)
    direct_shards, native_shards = _shards(tmp_path / "direct"), _shards(tmp_path / "spark")
    for shards in (direct_shards, native_shards):
        for lines in shards.values():
            if "header" in kwargs:
                assert lines[0] == kwargs["header"].encode()
            if "footer" in kwargs:
                assert lines[-2:] == [kwargs["footer"].encode(), b""]
    # Elements are spread over shards differently; each is written once, and
    # none of the shards is left empty (2 tasks dealt over 3 shards).
    for lines in native_shards.values():
        assert set(lines) - {kwargs.get("header", "").encode(), kwargs.get("footer", "").encode(), b""}
    direct_lines, native_lines = sum(direct_shards.values(), []), sum(native_shards.values(), [])
    if kwargs.get("append_trailing_newlines", True):
        assert sorted(direct_lines) == sorted(native_lines)
    else:  # records run together in an order of the runner's choosing
        assert sorted(b"".join(direct_lines)) == sorted(b"".join(native_lines))


@pytest.mark.parametrize("num_shards", [1, 3])
def test_an_element_in_two_windows_is_written_twice(spark, tmp_path, num_shards):
    # Beam's WriteImpl moves every element into the global window first.
    def write(runner, sub):
        prefix = str(tmp_path / sub / "out")
        with beam.Pipeline(runner=runner) as p:
            _ = (p | beam.Create(range(40)) | beam.Map(lambda i: window.TimestampedValue(str(i), i))
                 | beam.WindowInto(window.SlidingWindows(20, 10)) | beam.io.WriteToText(prefix, num_shards=num_shards))
        return _shards(tmp_path / sub)

    direct, native = write("DirectRunner", "d"), write(SparkRunner(), "s")
    assert sorted(native) == sorted(direct) and len(native) == num_shards
    lines = sorted(line for shard in native.values() for line in shard if line)
    assert lines == sorted(line for shard in direct.values() for line in shard if line)
    assert lines == sorted(str(i).encode() for i in range(40) for _ in range(2))


def test_write_empty_input_and_default_shards(spark, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "s").mkdir()
    for runner, sub in (("DirectRunner", "d"), (SparkRunner(), "s")):
        with beam.Pipeline(runner=runner) as p:
            _ = p | beam.Create([], reshuffle=False).with_output_types(str) | beam.io.WriteToText(
                str(tmp_path / sub / "empty"), num_shards=2, header="h", footer="f")
    assert _shards(tmp_path / "s") == _shards(tmp_path / "d") == {
        f"empty-0000{i}-of-00002": [b"h", b"f", b""] for i in range(2)}
    # num_shards=0: the runner picks the shard count; every element lands once.
    prefix = tmp_path / "s" / "auto"
    with beam.Pipeline(runner=SparkRunner()) as p:
        _ = p | beam.Create([str(i) for i in range(100)]) | beam.io.WriteToText(str(prefix))
    written = [line for name, lines in _shards(tmp_path / "s").items() if name.startswith("auto")
               for line in lines if line]
    assert sorted(written) == sorted(str(i).encode() for i in range(100))


def test_writes_nobody_reads_share_the_last_job(spark, tmp_path):
    # Each write's tasks write its shards; the files' names it outputs are
    # listed on the driver and nobody reads them, so all three run in the
    # pipeline's one job, each finalized after it.
    def write(p):
        numbers = p | beam.Create([str(i) for i in range(100)])
        for k in range(3):
            _ = (numbers | f"Keep{k}" >> beam.Filter(lambda x, k=k: int(x) % 3 == k)
                 | f"Upper{k}" >> beam.Map(str.upper)
                 | f"Write{k}" >> beam.io.WriteToText(str(tmp_path / "w" / f"out{k}"), num_shards=2))

    assert spark_jobs_run(spark, write) == 1
    for k in range(3):
        written = [line for name, lines in _shards(tmp_path / "w").items() if name.startswith(f"out{k}-")
                   for line in lines if line]
        assert sorted(written) == sorted(str(i).encode() for i in range(100) if i % 3 == k)
    # Read, the names are still there: the count of the shards written.
    with beam.Pipeline(runner=SparkRunner()) as p:
        names = p | beam.Create(["a", "b", "c"]) | beam.io.WriteToText(str(tmp_path / "r" / "out"), num_shards=3)
        _ = (names | beam.combiners.Count.Globally() | beam.Map(str)
             | "Count" >> beam.io.WriteToText(str(tmp_path / "n" / "count")))
    assert [line for lines in _shards(tmp_path / "n").values() for line in lines if line] == [b"3"]


def test_a_failure_in_the_shared_last_job_names_its_step(spark, tmp_path):
    with pytest.raises(PipelineError) as info:
        with beam.Pipeline(runner=SparkRunner()) as p:
            numbers = p | beam.Create(range(10))
            _ = numbers | "Fine" >> beam.Map(str) | "WriteFine" >> beam.io.WriteToText(str(tmp_path / "fine"))
            _ = (numbers | "Fail" >> beam.Map(lambda x: str(1 // (x - 7)))
                 | "WriteFail" >> beam.io.WriteToText(str(tmp_path / "fail")))
    assert str(info.value).startswith("Beam step 'Fail' failed on Spark:")
    assert "ZeroDivisionError" in str(info.value)


def _in_windows(p, n):
    from apache_beam.transforms import window

    return (p | beam.Create(range(n)) | beam.Map(lambda i: window.TimestampedValue(i, i % 7))
            | beam.WindowInto(window.SlidingWindows(4, 2)) | beam.Map(lambda i: f"e{i}"))


def test_an_element_in_several_windows_is_written_once_per_window(spark, tmp_path):
    # As Beam's WriteImpl, which puts every element into the global window first.
    for runner, sub in (("DirectRunner", "d"), (SparkRunner(), "s")):
        with beam.Pipeline(runner=runner) as p:
            _ = _in_windows(p, 30) | beam.io.WriteToText(str(tmp_path / sub / "out"))
    lines = {sub: sorted(line for lines in _shards(tmp_path / sub).values() for line in lines if line)
             for sub in ("d", "s")}
    assert lines["s"] == lines["d"] == sorted(f"e{i}".encode() for i in range(30) for _ in range(2))


def test_unsupported_write_options_run_beams_write(spark, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = p | beam.Create(["a", "b", "c"]) | beam.io.WriteToText(
                str(tmp_path / "out"), max_records_per_shard=2)
    assert "it sets max_records_per_shard; running Beam's WriteToText" in caplog.text
    assert NATIVE_WRITE not in caplog.text
    assert sorted(line for name in os.listdir(tmp_path)
                  for line in (tmp_path / name).read_bytes().split(b"\n") if line) == [b"a", b"b", b"c"]


def test_read_then_write_round_trip(spark, tmp_path):
    _write_files(tmp_path, {"in.txt": b"w1 w2\r\nw2\n"})
    prefix = str(tmp_path / "out" / "counts")
    with beam.Pipeline(runner=SparkRunner()) as p:
        _ = (p | beam.io.ReadFromText(str(tmp_path / "in.txt")) | beam.FlatMap(str.split)
             | beam.combiners.Count.PerElement() | beam.MapTuple(lambda w, n: f"{w}:{n}")
             | beam.io.WriteToText(prefix, num_shards=2))
    assert sorted(_beam_lines(prefix + "*")) == ["w1:1", "w2:2"]


def _io_pipeline(tmp_path) -> beam.Pipeline:
    """Every IO step that has a native path, and one whose options keep Beam's."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from apache_beam.io import parquetio

    schema = pa.schema([("x", pa.int64())])
    (tmp_path / "in0.txt").write_text("a\nb\n")
    pq.write_table(pa.table({"x": [1, 2]}), str(tmp_path / "in0.parquet"))
    p = beam.Pipeline(runner=SparkRunner())
    lines = p | "Read" >> beam.io.ReadFromText(str(tmp_path / "in*.txt"))
    _ = lines | "Write" >> beam.io.WriteToText(str(tmp_path / "out"))
    _ = lines | "Custom" >> beam.io.WriteToText(str(tmp_path / "custom"), max_records_per_shard=2)
    rows = p | "Rows" >> parquetio.ReadFromParquet(str(tmp_path / "in*.parquet"))
    _ = rows | "WriteRows" >> parquetio.WriteToParquet(str(tmp_path / "rows"), schema)
    tables = p | "Tables" >> parquetio.ReadFromParquetBatched(str(tmp_path / "in*.parquet"))
    _ = tables | "WriteTables" >> parquetio.WriteToParquetBatched(str(tmp_path / "tables"), schema)
    return p


def test_native_io_swapped_in_place_gives_the_proto_of_beams_replace_all(tmp_path):
    from apache_beam.portability import common_urns, python_urns
    from apache_beam.transforms import environments

    from beam_ext.runner.planning import io_overrides, swap_native_io
    from beam_ext.transforms._native import NATIVE_PAYLOAD_ANNOTATION, NATIVE_URN_ANNOTATION

    def proto(swap):
        p = _io_pipeline(tmp_path)
        swap(p)
        return p.to_runner_api(default_environment=environments.EmbeddedPythonEnvironment.default())

    def without_pickles(pipeline_proto):
        # Pickled objects differ between any two constructions of a pipeline
        # (a sink's temporary directory is random): compare everything else.
        for transform in pipeline_proto.components.transforms.values():
            if transform.spec.urn in (common_urns.primitives.PAR_DO.urn, python_urns.PICKLED_TRANSFORM):
                transform.spec.ClearField("payload")
            if NATIVE_PAYLOAD_ANNOTATION in transform.annotations:
                transform.annotations[NATIVE_PAYLOAD_ANNOTATION] = b"pickled"
        return pipeline_proto

    replaced = without_pickles(proto(lambda p: p.replace_all(io_overrides())))
    swapped = without_pickles(proto(swap_native_io))
    natives = {t.unique_name for t in swapped.components.transforms.values()
               if NATIVE_URN_ANNOTATION in t.annotations}
    assert natives == {"Read", "Write", "Rows", "WriteRows", "Tables", "WriteTables"}
    assert swapped == replaced
