"""The gRPC method table of the Tracker service, the wire <-> table codecs,
and the channel security policy (TLS, or plaintext on loopback only).

Written by hand (three methods) so that only the protobuf gencode is
checked in and nothing needs grpcio-tools at run time.
"""
from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any, Callable

import grpc

from beam_ext.watermark import _tracker_pb2 as pb
from beam_ext.watermark._table import Batch, Substream

SERVICE = "beam_ext.watermark.Tracker"
TOKEN_KEY = "beam-ext-job-token-bin"

Pem = bytes | str | os.PathLike  # PEM itself, or a path to a PEM file

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
        labels=[(decode_substream(lab.substream), int(lab.label)) for lab in m.labels],
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


def read_pem(value: Pem, option: str) -> bytes:
    """PEM bytes from ``value``: the PEM itself (bytes or text) or a file's path."""
    if isinstance(value, str) and value.lstrip().startswith("-----BEGIN"):
        value = value.encode()
    if isinstance(value, bytes):
        data, where = value, "the bytes given"
    elif isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"{option}: cannot read {path!r}: {exc.strerror}") from None
        where = repr(path)
    else:
        raise TypeError(f"{option} must be PEM bytes or a path to a PEM file, got {type(value).__name__}")
    if b"-----BEGIN " not in data:
        raise ValueError(f"{option}: {where} is not PEM (no '-----BEGIN' line)")
    return data


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP literal, possibly in brackets, or a name) is
    loopback. Names other than ``localhost`` are not resolved: they count as
    reachable from the network."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_plaintext(host: str, allow_plaintext: bool, who: str, tls_options: str) -> None:
    """Refuse plaintext gRPC off loopback unless ``allow_plaintext``: the job
    token and every report would cross the network readable."""
    if allow_plaintext or is_loopback(host):
        return
    raise ValueError(
        f"{who}: {host!r} is not a loopback address, and without {tls_options} the job token and "
        f"the reports would cross the network in plaintext. Pass {tls_options} (see 'On a cluster' "
        f"in docs/watermark.md), or allow_plaintext=True on a network you trust"
    )


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
