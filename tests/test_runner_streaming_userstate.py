"""Beam's streaming user-state and timer tests (``transforms/userstate_test.py``) on SparkRunner.

Beam's ``StatefulDoFnOnDirectRunnerTest`` collects outputs in a class
attribute of the test's process, which only an in-process runner fills.
Its TestStream cases are ported here: the same DoFns (state, event-time,
processing-time and dynamic timers, watermark holds through timer output
timestamps) and the same streams, with outputs compared between SparkRunner
and the DirectRunner, both ``--streaming`` (``streaming_equals_direct``),
and against the values Beam's test expects. Cases that share one stream
run as branches of one pipeline, each output labelled with the Beam test it
comes from.

Not ported: ``test_stateful_set_state_compaction_race_portably`` (it delays
the SDK's gRPC state requests with a mock to race the state cache: a test
of the SDK harness, not of the runner) and the batch cases, which run in
``tests/beam_conformance`` through ``FnApiRunnerTest``.
"""
from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.coders import BytesCoder, ListCoder, StrUtf8Coder, VarIntCoder
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import combiners, trigger, window
from apache_beam.transforms.core import DoFn
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    CombiningValueStateSpec,
    ReadModifyWriteStateSpec,
    SetStateSpec,
    TimerSpec,
    on_timer,
)
from pipeline_outputs import streaming_equals_direct


def _flatten_labelled(branches: dict):
    """Flattens ``{beam test name: pcoll}`` into ``[name, element]`` pairs, in the global window.

    Beam's Flatten wants one windowing for all its inputs.
    """
    return ([pcoll | f"Label[{name}]" >> beam.Map(lambda x, n=name: [n, x])
             | f"Global[{name}]" >> beam.WindowInto(window.GlobalWindows())
             for name, pcoll in branches.items()] | beam.Flatten())


def _by_test(lines: list) -> dict[str, list]:
    out: dict[str, list] = {}
    for name, element in lines:
        out.setdefault(name, []).append(element)
    return out


# -- test_simple_stateful_dofn, test_simple_stateful_dofn_combining, test_index_assignment --------

class _BufferUntilTwenty(DoFn):
    BUFFER_STATE = BagStateSpec("buffer", BytesCoder())
    EXPIRY_TIMER = TimerSpec("expiry", TimeDomain.WATERMARK)

    def process(self, element, buffer=DoFn.StateParam(BUFFER_STATE), timer1=DoFn.TimerParam(EXPIRY_TIMER)):
        buffer.add(b"A" + str(element[1]).encode("latin1"))
        timer1.set(20)

    @on_timer(EXPIRY_TIMER)
    def expiry_callback(self, buffer=DoFn.StateParam(BUFFER_STATE)):
        yield b"".join(sorted(buffer.read())).decode("latin1")


class _CombineUntilTwenty(DoFn):
    BUFFER_STATE = CombiningValueStateSpec("buffer", ListCoder(VarIntCoder()), combiners.ToListCombineFn())
    EXPIRY_TIMER = TimerSpec("expiry1", TimeDomain.WATERMARK)

    def process(self, element, buffer=DoFn.StateParam(BUFFER_STATE), timer1=DoFn.TimerParam(EXPIRY_TIMER)):
        buffer.add(element[1])
        timer1.set(20)

    @on_timer(EXPIRY_TIMER)
    def expiry_callback(self, buffer=DoFn.StateParam(BUFFER_STATE)):
        yield "".join(str(x) for x in sorted(buffer.read()))


class _AssignIndex(DoFn):
    INDEX_STATE = CombiningValueStateSpec("index", sum)

    def process(self, element, state=DoFn.StateParam(INDEX_STATE)):
        yield element[1], state.read()
        state.add(1)


def test_bag_and_combining_state_flushed_by_a_watermark_timer(spark, tmp_path):
    def build(p):
        keyed = (p | TestStream().advance_watermark_to(10).add_elements([1, 2]).add_elements([3])
                 .advance_watermark_to(25).add_elements([4])
                 | beam.Map(lambda x: ("mykey", x)))
        return _flatten_labelled({
            "test_simple_stateful_dofn": keyed | "Bag" >> beam.ParDo(_BufferUntilTwenty()),
            "test_simple_stateful_dofn_combining": keyed | "Combining" >> beam.ParDo(_CombineUntilTwenty()),
            "test_index_assignment": keyed | "Index" >> beam.ParDo(_AssignIndex()),
        })

    out = _by_test(streaming_equals_direct(build, tmp_path))
    # The timer fires once the watermark passes 20, and again at once for element 4,
    # which sets it behind the watermark.
    assert sorted(out["test_simple_stateful_dofn"]) == ["A1A2A3", "A1A2A3A4"]
    assert sorted(out["test_simple_stateful_dofn_combining"]) == ["123", "1234"]
    assert sorted(out["test_index_assignment"]) == [[1, 0], [2, 1], [3, 2], [4, 3]]


# -- test_clearing_bag_state, test_two_timers_one_function, test_clearing_set_state ---------------

class _ClearBagAt100(DoFn):
    BAG_STATE = BagStateSpec("bag_state", StrUtf8Coder())
    EMIT_TIMER = TimerSpec("emit_timer", TimeDomain.WATERMARK)
    CLEAR_TIMER = TimerSpec("clear_timer", TimeDomain.WATERMARK)

    def process(self, element, bag_state=DoFn.StateParam(BAG_STATE), emit_timer=DoFn.TimerParam(EMIT_TIMER),
                clear_timer=DoFn.TimerParam(CLEAR_TIMER)):
        bag_state.add(element[1])
        clear_timer.set(100)
        emit_timer.set(1000)

    @on_timer(EMIT_TIMER)
    def emit_values(self, bag_state=DoFn.StateParam(BAG_STATE)):
        yield from bag_state.read()
        yield "extra"

    @on_timer(CLEAR_TIMER)
    def clear_values(self, bag_state=DoFn.StateParam(BAG_STATE)):
        bag_state.clear()


class _TwoTimersOneCallback(DoFn):
    BAG_STATE = BagStateSpec("bag_state", StrUtf8Coder())
    EMIT_TIMER = TimerSpec("emit_timer", TimeDomain.WATERMARK)
    EMIT_TWICE_TIMER = TimerSpec("clear_timer", TimeDomain.WATERMARK)

    def process(self, element, bag_state=DoFn.StateParam(BAG_STATE), emit_timer=DoFn.TimerParam(EMIT_TIMER),
                emit_twice_timer=DoFn.TimerParam(EMIT_TWICE_TIMER)):
        bag_state.add(element[1])
        emit_twice_timer.set(100)
        emit_timer.set(1000)

    @on_timer(EMIT_TWICE_TIMER)
    @on_timer(EMIT_TIMER)
    def emit_values(self, bag_state=DoFn.StateParam(BAG_STATE)):
        yield from bag_state.read()


class _ClearSetAt100(DoFn):
    SET_STATE = SetStateSpec("buffer", StrUtf8Coder())
    EMIT_TIMER = TimerSpec("emit_timer", TimeDomain.WATERMARK)
    CLEAR_TIMER = TimerSpec("clear_timer", TimeDomain.WATERMARK)

    def process(self, element, set_state=DoFn.StateParam(SET_STATE), emit_timer=DoFn.TimerParam(EMIT_TIMER),
                clear_timer=DoFn.TimerParam(CLEAR_TIMER)):
        set_state.add(element[1])
        clear_timer.set(100)
        emit_timer.set(1000)

    @on_timer(EMIT_TIMER)
    def emit_values(self, set_state=DoFn.StateParam(SET_STATE)):
        yield from set_state.read()

    @on_timer(CLEAR_TIMER)
    def clear_values(self, set_state=DoFn.StateParam(SET_STATE)):
        set_state.clear()
        set_state.add("different-value")


def test_timers_that_clear_state_before_a_later_timer_reads_it(spark, tmp_path):
    def build(p):
        stream = (p | TestStream().advance_watermark_to(0).add_elements([("key", "value")])
                  .advance_watermark_to(100))
        return _flatten_labelled({
            "test_clearing_bag_state": stream | "Bag" >> beam.ParDo(_ClearBagAt100()),
            "test_two_timers_one_function": stream | "TwoTimers" >> beam.ParDo(_TwoTimersOneCallback()),
            "test_clearing_set_state": stream | "Set" >> beam.ParDo(_ClearSetAt100()),
        })

    out = _by_test(streaming_equals_direct(build, tmp_path))
    assert out["test_clearing_bag_state"] == ["extra"]
    assert out["test_two_timers_one_function"] == ["value", "value"]
    assert out["test_clearing_set_state"] == ["different-value"]


# -- test_simple_read_modify_write_stateful_dofn, test_clearing_read_modify_write_state ----------

class _LastElement(DoFn):
    VALUE_STATE = ReadModifyWriteStateSpec("value", StrUtf8Coder())

    def process(self, element, last_element=DoFn.StateParam(VALUE_STATE)):
        last_element.write(f"{element[0]}:{element[1]}")
        yield last_element.read()


class _ClearedLastElement(DoFn):
    VALUE_STATE = ReadModifyWriteStateSpec("value", StrUtf8Coder())

    def process(self, element, last_element=DoFn.StateParam(VALUE_STATE)):
        value = last_element.read()
        if value is not None:
            yield value
        last_element.clear()
        last_element.write(f"{last_element.read()}:{element[1]}")
        if element[1] == 5:
            yield last_element.read()


@pytest.mark.slow_streaming
def test_read_modify_write_state_across_micro_batches(spark, tmp_path):
    def build(p):
        stream = (p | TestStream().advance_watermark_to(0).add_elements([("a", 1)])
                  .advance_watermark_to(10).add_elements([("a", 3)])
                  .advance_watermark_to(20).add_elements([("a", 5)]))
        return _flatten_labelled({
            "test_simple_read_modify_write_stateful_dofn": stream | "Last" >> beam.ParDo(_LastElement()),
            "test_clearing_read_modify_write_state": stream | "Cleared" >> beam.ParDo(_ClearedLastElement()),
        })

    out = _by_test(streaming_equals_direct(build, tmp_path))
    assert sorted(out["test_simple_read_modify_write_stateful_dofn"]) == ["a:1", "a:3", "a:5"]
    assert sorted(out["test_clearing_read_modify_write_state"]) == ["None:1", "None:3", "None:5"]


# -- test_simple_set_stateful_dofn ----------------------------------------------------------------

class _SetUntilTwenty(DoFn):
    BUFFER_STATE = SetStateSpec("buffer", VarIntCoder())
    EXPIRY_TIMER = TimerSpec("expiry", TimeDomain.WATERMARK)

    def process(self, element, buffer=DoFn.StateParam(BUFFER_STATE), timer1=DoFn.TimerParam(EXPIRY_TIMER)):
        buffer.add(element[1])
        timer1.set(20)

    @on_timer(EXPIRY_TIMER)
    def expiry_callback(self, buffer=DoFn.StateParam(BUFFER_STATE)):
        yield sorted(buffer.read())


@pytest.mark.slow_streaming
def test_set_state_keeps_distinct_values_until_a_timer(spark, tmp_path):
    def build(p):
        return (p | TestStream().advance_watermark_to(10).add_elements([1, 2, 3]).add_elements([2])
                .advance_watermark_to(24)
                | beam.Map(lambda x: ("mykey", x)) | beam.ParDo(_SetUntilTwenty()))

    assert streaming_equals_direct(build, tmp_path) == [[1, 2, 3]]


# -- test_timer_output_timestamp, ..._and_window, test_timer_default_tag, test_dynamic_timer_simple_dofn

class _ThreeTimers(DoFn):
    EMIT_TIMER_1 = TimerSpec("emit1", TimeDomain.WATERMARK)
    EMIT_TIMER_2 = TimerSpec("emit2", TimeDomain.WATERMARK)
    EMIT_TIMER_3 = TimerSpec("emit3", TimeDomain.WATERMARK)

    def process(self, element, timer1=DoFn.TimerParam(EMIT_TIMER_1), timer2=DoFn.TimerParam(EMIT_TIMER_2),
                timer3=DoFn.TimerParam(EMIT_TIMER_3)):
        timer1.set(10)
        timer2.set(20)
        timer3.set(30)

    @on_timer(EMIT_TIMER_1)
    def emit_callback_1(self):
        yield "timer1"

    @on_timer(EMIT_TIMER_2)
    def emit_callback_2(self):
        yield "timer2"

    @on_timer(EMIT_TIMER_3)
    def emit_callback_3(self):
        yield "timer3"


class _TimerWithWindow(DoFn):
    EMIT_TIMER_1 = TimerSpec("emit1", TimeDomain.WATERMARK)

    def process(self, element, timer1=DoFn.TimerParam(EMIT_TIMER_1)):
        timer1.set(10)

    @on_timer(EMIT_TIMER_1)
    def emit_callback_1(self, window=DoFn.WindowParam, ts=DoFn.TimestampParam, key=DoFn.KeyParam):
        yield f"timer1-{key}", int(ts), int(window.start), int(window.end)


class _DefaultTag(DoFn):
    EMIT_TIMER_FAMILY = TimerSpec("emit", TimeDomain.WATERMARK)

    def process(self, element, emit=DoFn.TimerParam(EMIT_TIMER_FAMILY)):
        emit.set(10)
        emit.set(20, dynamic_timer_tag="")

    @on_timer(EMIT_TIMER_FAMILY)
    def emit_callback(self, ts=DoFn.TimestampParam, tag=DoFn.DynamicTimerTagParam):
        yield tag, int(ts)


class _DynamicTimers(DoFn):
    EMIT_TIMER_FAMILY = TimerSpec("emit", TimeDomain.WATERMARK)

    def process(self, element, emit=DoFn.TimerParam(EMIT_TIMER_FAMILY)):
        emit.set(10, dynamic_timer_tag="emit1")
        emit.set(20, dynamic_timer_tag="emit2")
        emit.set(30, dynamic_timer_tag="emit3")

    @on_timer(EMIT_TIMER_FAMILY)
    def emit_callback(self, ts=DoFn.TimestampParam, tag=DoFn.DynamicTimerTagParam):
        yield tag, int(ts)


def _one_element_at_ten(p):
    return (p | TestStream().advance_watermark_to(10).add_elements([1]).advance_watermark_to_infinity()
            | beam.Map(lambda x: ("mykey", x)))


def test_timer_outputs_are_stamped_at_the_timer_and_held_until_it_fires(spark, tmp_path):
    def build(p):
        keyed = _one_element_at_ten(p)
        return _flatten_labelled({
            "test_timer_output_timestamp": keyed | "Three" >> beam.ParDo(_ThreeTimers())
            | "Stamp" >> beam.Map(lambda x, ts=DoFn.TimestampParam: (x, int(ts))),
            "test_dynamic_timer_simple_dofn": keyed | "Dynamic" >> beam.ParDo(_DynamicTimers()),
        })

    out = _by_test(streaming_equals_direct(build, tmp_path))
    assert sorted(out["test_timer_output_timestamp"]) == [["timer1", 10], ["timer2", 20], ["timer3", 30]]
    assert sorted(out["test_dynamic_timer_simple_dofn"]) == [["emit1", 10], ["emit2", 20], ["emit3", 30]]


@pytest.mark.slow_streaming
def test_timers_in_a_window_and_with_the_default_dynamic_tag(spark, tmp_path):
    def build(p):
        keyed = _one_element_at_ten(p)
        return _flatten_labelled({
            "test_timer_output_timestamp_and_window": keyed
            | beam.WindowInto(window.FixedWindows(5), accumulation_mode=trigger.AccumulationMode.DISCARDING)
            | "Window" >> beam.ParDo(_TimerWithWindow()),
            "test_timer_default_tag": keyed | "DefaultTag" >> beam.ParDo(_DefaultTag()),
        })

    out = _by_test(streaming_equals_direct(build, tmp_path))
    assert out["test_timer_output_timestamp_and_window"] == [["timer1-mykey", 10, 10, 15]]
    assert out["test_timer_default_tag"] == [["", 20]]


# -- test_dynamic_timer_multiple, test_dynamic_timer_and_simple_timer, test_dynamic_timer_clear_timer

class _TwoTimerFamilies(DoFn):
    EMIT_TIMER_FAMILY1 = TimerSpec("emit_family_1", TimeDomain.WATERMARK)
    EMIT_TIMER_FAMILY2 = TimerSpec("emit_family_2", TimeDomain.WATERMARK)

    def process(self, element, emit1=DoFn.TimerParam(EMIT_TIMER_FAMILY1),
                emit2=DoFn.TimerParam(EMIT_TIMER_FAMILY2)):
        emit1.set(10, dynamic_timer_tag="emit11")
        emit1.set(20, dynamic_timer_tag="emit12")
        emit1.set(30, dynamic_timer_tag="emit13")
        emit2.set(30, dynamic_timer_tag="emit21")
        emit2.set(20, dynamic_timer_tag="emit22")
        emit2.set(10, dynamic_timer_tag="emit23")

    @on_timer(EMIT_TIMER_FAMILY1)
    def emit_callback(self, ts=DoFn.TimestampParam, tag=DoFn.DynamicTimerTagParam):
        yield tag, int(ts)

    @on_timer(EMIT_TIMER_FAMILY2)
    def emit_callback_2(self, ts=DoFn.TimestampParam, tag=DoFn.DynamicTimerTagParam):
        yield tag, int(ts)


class _DynamicAndGcTimer(DoFn):
    EMIT_TIMER_FAMILY = TimerSpec("emit", TimeDomain.WATERMARK)
    GC_TIMER = TimerSpec("gc", TimeDomain.WATERMARK)

    def process(self, element, emit=DoFn.TimerParam(EMIT_TIMER_FAMILY), gc=DoFn.TimerParam(GC_TIMER)):
        emit.set(10, dynamic_timer_tag="emit1")
        emit.set(20, dynamic_timer_tag="emit2")
        emit.set(30, dynamic_timer_tag="emit3")
        gc.set(40)

    @on_timer(EMIT_TIMER_FAMILY)
    def emit_callback(self, ts=DoFn.TimestampParam, tag=DoFn.DynamicTimerTagParam):
        yield tag, int(ts)

    @on_timer(GC_TIMER)
    def gc(self, ts=DoFn.TimestampParam):
        yield "gc", int(ts)


class _SetThenClearDynamic(DoFn):
    EMIT_TIMER_FAMILY = TimerSpec("emit", TimeDomain.WATERMARK)

    def process(self, element, emit=DoFn.TimerParam(EMIT_TIMER_FAMILY)):
        if element[1] == "set":
            emit.set(10, dynamic_timer_tag="emit1")
            emit.set(20, dynamic_timer_tag="emit2")
            emit.set(30, dynamic_timer_tag="emit3")
        if element[1] == "clear":
            emit.clear(dynamic_timer_tag="emit3")

    @on_timer(EMIT_TIMER_FAMILY)
    def emit_callback(self, ts=DoFn.TimestampParam, tag=DoFn.DynamicTimerTagParam):
        yield tag, int(ts)


@pytest.mark.slow_streaming
def test_dynamic_timer_families_fire_each_tag(spark, tmp_path):
    def build(p):
        keyed = (p | TestStream().advance_watermark_to(5).add_elements(["1"]).advance_watermark_to_infinity()
                 | beam.Map(lambda x: ("mykey", x)))
        return _flatten_labelled({
            "test_dynamic_timer_multiple": keyed | "Families" >> beam.ParDo(_TwoTimerFamilies()),
            "test_dynamic_timer_and_simple_timer": keyed | "WithGc" >> beam.ParDo(_DynamicAndGcTimer()),
        })

    out = _by_test(streaming_equals_direct(build, tmp_path))
    assert sorted(out["test_dynamic_timer_multiple"]) == [
        ["emit11", 10], ["emit12", 20], ["emit13", 30], ["emit21", 30], ["emit22", 20], ["emit23", 10]]
    assert sorted(out["test_dynamic_timer_and_simple_timer"]) == [
        ["emit1", 10], ["emit2", 20], ["emit3", 30], ["gc", 40]]


def test_a_dynamic_timer_cleared_in_a_later_micro_batch_does_not_fire(spark, tmp_path):
    def build(p):
        return (p | TestStream().advance_watermark_to(5).add_elements(["set"])
                .advance_watermark_to(10).add_elements(["clear"]).advance_watermark_to_infinity()
                | beam.Map(lambda x: ("mykey", x)) | beam.ParDo(_SetThenClearDynamic()))

    assert streaming_equals_direct(build, tmp_path) == [["emit1", 10], ["emit2", 20]]


# -- test_hash_join ---------------------------------------------------------------------------------

class _HashJoin(DoFn):
    BUFFER_STATE = BagStateSpec("buffer", BytesCoder())
    UNMATCHED_TIMER = TimerSpec("unmatched", TimeDomain.WATERMARK)

    def process(self, element, state=DoFn.StateParam(BUFFER_STATE), timer=DoFn.TimerParam(UNMATCHED_TIMER)):
        key, value = element
        existing_values = list(state.read())
        if not existing_values:
            state.add(value)
            timer.set(100)
        else:
            yield (b"Record<%s,%s,%s>" % (key, existing_values[0], value)).decode()
            state.clear()
            timer.clear()

    @on_timer(UNMATCHED_TIMER)
    def expiry_callback(self, state=DoFn.StateParam(BUFFER_STATE)):
        buffered = list(state.read())
        assert len(buffered) == 1, buffered
        state.clear()
        yield (b"Unmatched<%s>" % (buffered[0],)).decode()


@pytest.mark.slow_streaming
def test_hash_join_with_a_cleared_timer(spark, tmp_path):
    def build(p):
        return (p | TestStream().advance_watermark_to(10).add_elements([(b"A", b"a"), (b"B", b"b")])
                .add_elements([(b"A", b"aa"), (b"C", b"c")])
                .advance_watermark_to(25).add_elements([(b"A", b"aaa"), (b"B", b"bb")])
                .add_elements([(b"D", b"d"), (b"D", b"dd"), (b"D", b"ddd"), (b"D", b"dddd")])
                .advance_watermark_to(125).add_elements([(b"C", b"cc")])
                | beam.ParDo(_HashJoin()))

    assert streaming_equals_direct(build, tmp_path) == sorted([
        "Record<A,a,aa>", "Record<B,b,bb>", "Record<D,d,dd>", "Record<D,ddd,dddd>",
        "Unmatched<aaa>", "Unmatched<c>", "Unmatched<cc>"])


# -- test_generate_sequence_with_realtime_timer ----------------------------------------------------

class _GenerateRecords(DoFn):
    EMIT_TIMER = TimerSpec("emit_timer", TimeDomain.REAL_TIME)
    COUNT_STATE = CombiningValueStateSpec("count_state", VarIntCoder(), combiners.CountCombineFn())

    def __init__(self, frequency, total_records):
        self.total_records = total_records
        self.frequency = frequency

    def process(self, element, emit_timer=DoFn.TimerParam(EMIT_TIMER)):
        # Processing-time timers are set at absolute times (the TestStream's clock).
        emit_timer.set(self.frequency)
        yield element[1]

    @on_timer(EMIT_TIMER)
    def emit_values(self, emit_timer=DoFn.TimerParam(EMIT_TIMER), count_state=DoFn.StateParam(COUNT_STATE)):
        count = count_state.read() or 0
        if self.total_records == count:
            return
        count_state.add(1)
        emit_timer.set(count + 1 + self.frequency)
        yield "value"


def test_processing_time_timers_follow_the_test_stream_clock(spark, tmp_path):
    def build(p):
        return (p | TestStream().advance_watermark_to(0).add_elements([("key", 0)])
                .advance_processing_time(1).add_elements([("key", 1)])
                .advance_processing_time(1).add_elements([("key", 2)])
                .advance_processing_time(1).add_elements([("key", 3)])
                | beam.ParDo(_GenerateRecords(1, 3)))

    # Beam's test sees [0, 'value', 1, 'value', 2, 'value', 3] in that order.
    out = streaming_equals_direct(build, tmp_path)
    assert sorted(x for x in out if x != "value") == [0, 1, 2, 3] and out.count("value") == 3
