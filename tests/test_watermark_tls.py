"""The tracking service over TLS on loopback, and the plaintext policy.

A throwaway CA and a server certificate are made per module with
``cryptography`` (a dependency of apache-beam).
"""
import datetime
import ipaddress
from types import SimpleNamespace

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from beam_ext.watermark import LocalAgent, TrackerService, new_token
from beam_ext.watermark import _tracker_pb2 as pb
from beam_ext.watermark._transport import TOKEN_KEY, client_stubs

TOKEN = b"job-secret"
GRAPH = {"src/0": [], "sink/0": ["src/0"]}


def _certificate(subject: str, key, issuer_name: str, issuer_key, ca: bool, names=()):
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def _key():
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """CA, a tracker certificate it signed (for 127.0.0.1 and tracker.test), an unrelated CA."""
    d = tmp_path_factory.mktemp("pki")
    ca_key, other_key, key = _key(), _key(), _key()
    names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("tracker.test")]
    files = {
        "ca.pem": _certificate("test CA", ca_key, "test CA", ca_key, ca=True),
        "other-ca.pem": _certificate("other CA", other_key, "other CA", other_key, ca=True),
        "tracker.pem": _certificate("tracker", key, "test CA", ca_key, ca=False, names=names),
        "tracker.key": key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()),
    }
    for name, data in files.items():
        (d / name).write_bytes(data)
    return SimpleNamespace(ca=d / "ca.pem", other_ca=d / "other-ca.pem", cert=d / "tracker.pem",
                           key=d / "tracker.key", ca_pem=files["ca.pem"])


@pytest.fixture(scope="module")
def tls_service(pki):
    s = TrackerService(token=TOKEN, tls_cert=pki.cert, tls_key=str(pki.key)).start()
    s.register_graph(GRAPH)
    yield s
    s.stop()


def test_agents_over_tls_report_and_get_neoss(tls_service, pki):
    assert tls_service.address.startswith("127.0.0.1:")
    src = LocalAgent(tls_service.address, "src/0", TOKEN, flush_interval=None, tls_ca=pki.ca)
    # The CA as bytes, and the certificate checked against another of its names.
    sink = LocalAgent(tls_service.address, "sink/0", TOKEN, flush_interval=None, tls_ca=pki.ca_pem,
                      tls_server_name="tracker.test")
    tok = new_token()
    src.sent(1, tok, to="sink/0")
    src.promise(1)
    src.flush()
    assert not sink.ended(1)
    sink.received(1, tok)
    sink.flush()
    assert sink.wait(1, timeout=30)
    src.close()
    sink.close()


def test_clients_without_the_ca_are_refused(tls_service, pki):
    before = tls_service.stats()
    with pytest.raises(ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        LocalAgent(tls_service.address, "src/0", TOKEN, tls_ca=pki.other_ca, connect_timeout=1.0)
    # A name the certificate does not carry.
    with pytest.raises(ConnectionError, match="Hostname Verification"):
        LocalAgent(tls_service.address, "src/0", TOKEN, tls_ca=pki.ca, tls_server_name="other.test",
                   connect_timeout=1.0)
    # Plaintext against the TLS port.
    with pytest.raises(ConnectionError, match="unreachable"):
        LocalAgent(tls_service.address, "src/0", TOKEN, connect_timeout=1.0)
    # The system's roots do not trust a private CA either.
    channel = grpc.secure_channel(tls_service.address, grpc.ssl_channel_credentials())
    with pytest.raises(grpc.RpcError) as err:
        client_stubs(channel)["Hello"](pb.HelloRequest(process_id="src/0"),
                                       metadata=((TOKEN_KEY, TOKEN),), timeout=5)
    channel.close()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    # None of them reached the service: no call was answered, refused or counted.
    assert tls_service.stats()["hello_calls"] == before["hello_calls"]
    assert tls_service.stats()["rejected_calls"] == before["rejected_calls"]


def test_tls_still_requires_the_job_token(tls_service, pki):
    from beam_ext.watermark import TrackerAuthError

    with pytest.raises(TrackerAuthError):
        LocalAgent(tls_service.address, "src/0", b"wrong", tls_ca=pki.ca)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "tracker.example", "::"])
def test_plaintext_is_refused_off_loopback_unless_allowed(host, pki):
    with pytest.raises(ValueError, match=rf"'{host}' is not a loopback address.*tls_cert and tls_key"
                                         r".*allow_plaintext=True"):
        TrackerService(host=host, token=TOKEN)
    TrackerService(host=host, token=TOKEN, allow_plaintext=True)  # explicitly allowed
    TrackerService(host=host, token=TOKEN, tls_cert=pki.cert, tls_key=pki.key)  # encrypted
    with pytest.raises(ValueError, match=r"not a loopback address.*tls_ca.*allow_plaintext=True"):
        LocalAgent(f"[{host}]:4000" if ":" in host else f"{host}:4000", "src/0", TOKEN)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1"])
def test_loopback_stays_plaintext_by_default(host):
    TrackerService(host=host, token=TOKEN)


def test_a_key_that_does_not_match_the_certificate_fails_at_start(pki):
    stray = _key().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())
    s = TrackerService(token=TOKEN, tls_cert=pki.cert, tls_key=stray)
    with pytest.raises(OSError, match="tls_key is not the private key of tls_cert"):
        s.start()
    s.stop()


def test_tls_options_are_checked(tmp_path, pki):
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        TrackerService(token=TOKEN, tls_cert=pki.cert)
    with pytest.raises(ValueError, match=r"tls_key: cannot read '.*missing.key'"):
        TrackerService(token=TOKEN, tls_cert=pki.cert, tls_key=tmp_path / "missing.key")
    (tmp_path / "junk.pem").write_bytes(b"not a certificate")
    with pytest.raises(ValueError, match=r"tls_cert: '.*junk.pem' is not PEM"):
        TrackerService(token=TOKEN, tls_cert=tmp_path / "junk.pem", tls_key=pki.key)
    with pytest.raises(TypeError, match="tls_ca must be PEM bytes or a path"):
        LocalAgent("127.0.0.1:1", "src/0", TOKEN, tls_ca=42)
    with pytest.raises(ValueError, match="tls_server_name needs tls_ca"):
        LocalAgent("127.0.0.1:1", "src/0", TOKEN, tls_server_name="tracker.test")
