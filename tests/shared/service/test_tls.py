"""TLS: `labeldp labels serve --ssl-certfile/--ssl-keyfile` serves HTTPS, the labels-party client verifies
certificates by default (a self-signed one is refused before any request is sent) and accepts one signed by a CA
it is given; the trainer verifies its labels party the same way (``upstream_ca_bundle``)."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import ssl
import subprocess
import sys
from types import SimpleNamespace

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from features_party.client import LabelsPartyClient, NotFound
from features_party.planning import labels_party_client
from features_party.settings import TrainerSettings
from labeldp.local_services import free_port, serve_process


def _certificate(tmp_path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (its own CA) and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "labeldp test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                  critical=False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_file), str(key_file)


@contextlib.contextmanager
def https_labels_server(tmp_path, cert: str, key: str):
    env = {**os.environ, "LABELDP_DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite",
           "LABELDP_DATA_DIR": str(tmp_path / "data")}
    cli = [sys.executable, "-m", "labeldp", "labels"]
    api_key = subprocess.run(cli + ["create-key", "--org", "owner", "--role", "admin"], env=env,
                             capture_output=True, text=True, check=True).stdout.strip()
    port = free_port()
    command = cli + ["serve", "--port", str(port), "--ssl-certfile", cert, "--ssl-keyfile", key]
    with serve_process(command, f"https://127.0.0.1:{port}", env=env,
                       verify=ssl.create_default_context(cafile=cert)):
        yield f"https://127.0.0.1:{port}", api_key


@pytest.mark.slow
def test_https_is_served_and_certificates_are_verified_by_default(tmp_path):
    cert, key = _certificate(tmp_path)
    with https_labels_server(tmp_path, cert, key) as (url, api_key):
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            with LabelsPartyClient(url, api_key, retries=0) as client:
                client.budget("d" * 32)
        with LabelsPartyClient(url, api_key, retries=0, verify=cert) as client, pytest.raises(NotFound):
            client.budget("d" * 32)  # the TLS connection is made and the request answered
        with pytest.raises(httpx.RemoteProtocolError):  # plain HTTP gets no answer
            httpx.get(url.replace("https", "http") + "/healthz")
        for ca_bundle in (None, cert):
            trainer = SimpleNamespace(settings=TrainerSettings(labels_parties={"office": url}, upstream_retries=0,
                                                               upstream_ca_bundle=ca_bundle))
            verified = ca_bundle is not None
            with labels_party_client(trainer, url, api_key) as client:
                if verified:
                    with pytest.raises(NotFound):
                        client.budget("d" * 32)
                else:
                    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                        client.budget("d" * 32)


@pytest.mark.parametrize("party", ["labels", "features"])
@pytest.mark.parametrize(("flags", "message"), [
    (["--ssl-certfile", "cert.pem"], "--ssl-certfile and --ssl-keyfile go together"),
    (["--ssl-certfile", "missing.pem", "--ssl-keyfile", "missing.pem"], "--ssl-certfile: cannot read missing.pem"),
])
def test_tls_flags_are_checked_before_anything_starts(tmp_path, party, flags, message):
    done = subprocess.run([sys.executable, "-m", "labeldp", party, "serve", *flags,
                           "--database-url", f"sqlite:///{tmp_path}/db.sqlite"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode != 0 and done.stderr.strip() == f"labeldp: error: {message}"
    assert not (tmp_path / "db.sqlite").exists()
