"""The gRPC method table of the Tracker service and the wire <-> table codecs.

Written by hand (three methods) so that only the protobuf gencode is
checked in and nothing needs grpcio-tools at run time.
"""
from __future__ import annotations

from typing import Any, Callable

import grpc

from beam_ext.watermark import _tracker_pb2 as pb
from beam_ext.watermark._table import Batch, Substream

SERVICE = "beam_ext.watermark.Tracker"
TOKEN_KEY = "beam-ext-job-token-bin"

_METHODS = {
    "Hello": ("unary_unary", pb.HelloRequest, pb.HelloReply),
    "Report": ("unary_unary", pb.ReportBatch, pb.ReportAck),
    "Subscribe": ("unary_stream", pb.SubscribeRequest, pb.Notification),
}


def encode_substream(s: Substream) -> pb.Substream:
    if isinstance(s, int):
        return pb.Substream(int_id=s)
    return pb.Substream(bytes_id=s)


def decode_substream(m: pb.Substream) -> Substream:
    if m.WhichOneof("id") == "bytes_id":
        return bytes(m.bytes_id)
    return int(m.int_id)


def encode_at(process: str, s: Substream) -> pb.HostSubstream:
    return pb.HostSubstream(substream=encode_substream(s), process=process)


def decode_at(m: pb.HostSubstream) -> tuple[Substream, str]:
    return decode_substream(m.substream), m.process


def decode_batch(m: pb.ReportBatch) -> Batch:
    agent = m.process_id
    return Batch(
        process=agent,
        seq=int(m.seq),
        entries=[
            (decode_substream(e.substream), e.sender or agent, e.segment, int(e.xor)) for e in m.entries
        ],
        promises=[decode_at(x) for x in m.source_promises],
        labels=[(decode_substream(l.substream), int(l.label)) for l in m.labels],
        acks=[decode_at(x) for x in m.host_acks],
        resync=bool(m.resync),
        retired=[decode_substream(s) for s in m.retired],
    )


def server_handler(impl: Any) -> grpc.GenericRpcHandler:
    """Route the three methods to ``impl.Hello/Report/Subscribe``."""
    handlers = {}
    for name, (kind, req, resp) in _METHODS.items():
        make = grpc.unary_unary_rpc_method_handler if kind == "unary_unary" else grpc.unary_stream_rpc_method_handler
        handlers[name] = make(
            getattr(impl, name),
            request_deserializer=req.FromString,
            response_serializer=resp.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


def client_stubs(channel: grpc.Channel) -> dict[str, Callable]:
    """Callables for the three methods on ``channel``."""
    stubs = {}
    for name, (kind, req, resp) in _METHODS.items():
        factory = channel.unary_unary if kind == "unary_unary" else channel.unary_stream
        stubs[name] = factory(
            f"/{SERVICE}/{name}",
            request_serializer=req.SerializeToString,
            response_deserializer=resp.FromString,
        )
    return stubs
