"""A job on a TLS cluster: `dask scheduler` and `dask worker` processes started with
``--tls-*`` options on ``tls://127.0.0.1``. The data path (worker to worker), the balancer
plugin's RPC, checkpoints and the dashboard all go over TLS; a client without the
certificates is refused."""
import datetime
import ipaddress
import json
import ssl
import time
import urllib.request

import dask
import numpy as np
import pandas as pd
import pytest
from bokeh.models import Div
from streamz import Stream

import streamlb
from conftest import client_refusal, dask_cli_cluster, tls_security

pytestmark = pytest.mark.cluster

AGG = {"n": ("value", "count"), "total": ("value", "sum")}


def make_certificates(directory) -> tuple[str, str, str]:
    """A CA and one certificate it signs for 127.0.0.1 and localhost, for servers and
    clients alike (as `dask scheduler`, `dask worker` and the client each present one).
    Returns the paths ``(ca_file, cert_file, key_file)``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def build(subject, issuer, public, signer, *extensions):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public)
             .serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False))
        for ext, critical in extensions:
            b = b.add_extension(ext, critical=critical)
        return b.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "streamlb test CA")])
    ca = build(ca_name, ca_name, ca_key.public_key(), ca_key,
               (x509.BasicConstraints(ca=True, path_length=0), True),
               (x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                              key_encipherment=False, data_encipherment=False, key_agreement=False,
                              encipher_only=False, decipher_only=False), True))
    cert = build(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]), ca_name, key.public_key(), ca_key,
                 (x509.BasicConstraints(ca=False, path_length=None), True),
                 (x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                               x509.DNSName("localhost")]), False),
                 (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), False),
                 (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False))
    paths = tuple(str(directory / name) for name in ("ca.pem", "cert.pem", "key.pem"))
    for path, data in zip(paths, (ca.public_bytes(serialization.Encoding.PEM),
                                  cert.public_bytes(serialization.Encoding.PEM),
                                  key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))):
        with open(path, "wb") as f:
            f.write(data)
    return paths


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    """``(address, files)``: a TLS scheduler and 2 TLS workers; the dashboard is served over
    https with the same certificate (distributed serves it over plain http unless
    ``distributed.scheduler.dashboard.tls.*`` is set)."""
    files = make_certificates(tmp_path_factory.mktemp("tls"))
    env = {f"DASK_DISTRIBUTED__SCHEDULER__DASHBOARD__TLS__{k}": v
           for k, v in zip(("CA_FILE", "CERT", "KEY"), files)}
    with dask_cli_cluster(tls=files, env=env) as address:
        yield address, files


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    rng = np.random.default_rng(5)
    n = 120_000
    w = 1.0 / np.arange(1, 2001)
    df = pd.DataFrame({"key": rng.choice(2000, size=n, p=w / w.sum()).astype(np.int64),
                       "value": rng.integers(0, 1000, n).astype(float)})
    path = tmp_path_factory.mktemp("skewed")
    for p in range(2):
        df.iloc[p::2].to_parquet(path / f"part-{p}.parquet", index=False)
    return str(path), df.groupby("key").agg(**AGG)


def keyed_totals(path, rate=None):
    src = Stream.from_parquet(path, batch_size=5_000, rate=rate)
    src.key_by("key").aggregate(AGG, parallelism=4, name="agg")
    return src


def get(url, files):
    context = ssl.create_default_context(cafile=files[0])
    with urllib.request.urlopen(url, timeout=10, context=context) as resp:
        return resp.status, resp.read().decode()


def pull_document(url, files, monkeypatch):
    """The bokeh document behind a dashboard page, pulled over its websocket (``wss://``)
    as the page's script does in a browser that trusts the CA."""
    import functools

    from bokeh.client import connection, pull_session
    from tornado.httpclient import HTTPRequest

    context = ssl.create_default_context(cafile=files[0])
    monkeypatch.setattr(connection, "HTTPRequest", functools.partial(HTTPRequest, ssl_options=context))
    with pull_session(url=url) as session:
        return session.document


def test_a_job_on_a_tls_cluster(tls_cluster, skewed, tmp_path, monkeypatch):
    from distributed import Client

    address, files = tls_cluster
    path, truth = skewed
    with Client(address, security=tls_security(files)) as client, \
            streamlb.run(keyed_totals(path, rate=40_000), client=client, key_groups=128, window="250ms",
                         balancer="autoflow", checkpoint=str(tmp_path / "ck"), checkpoint_interval=0.3) as job:
        dashboard = f"https://127.0.0.1:{client.scheduler_info()['services']['dashboard']}"
        deadline = time.time() + 20
        while job.checkpoints().empty and time.time() < deadline:
            time.sleep(0.05)
        status, page = get(f"{dashboard}/streamlb", files)
        assert status == 200 and 'href="streamlb">Streamlb' in page and "embed_items" in page
        doc = pull_document(f"{dashboard}/streamlb", files, monkeypatch)
        texts = " ".join(d.text for d in doc.select({"type": Div}))
        assert doc.title == "Dask: streamlb" and f"job {job.id}" in texts and "operator agg" in texts
        status, body = get(f"{dashboard}/streamlb/state.json", files)
        assert status == 200 and job.id in json.loads(body)["jobs"]
        job.wait(timeout=60)
        pd.testing.assert_frame_equal(job.state("agg"), truth, check_dtype=False)
        state = job.balancer_state()
        assert state["balancer"] == "autoflow" and state["operators"]["agg"]["imbalance"]
        assert len(job.history) >= 1            # the plugin moved key groups live, over TLS
        assert job.routing("agg").epoch == job.history[-1]["epoch"]
        assert len(job.checkpoints()) >= 1
        assert {a.split("://")[0] for a in job.workers_of.values()} == {"tls"}
        assert len(set(job.metrics().worker)) == 2
        with pytest.raises(OSError):            # plain http on the https dashboard
            urllib.request.urlopen(f"{dashboard.replace('https', 'http')}/streamlb", timeout=5)


def test_address_only_reads_the_certificates_from_dask_config(tls_cluster, skewed):
    """Also while another cluster's client is the current one (an enclosing ``with
    Client(...)``): the job's actors are called through the job's own client. Bound to the
    current client, as Dask binds them, their calls went through the plain cluster's
    scheduler, which cannot reach TLS workers, and waited for ever."""
    from distributed import Client, LocalCluster

    address, files = tls_cluster
    path, truth = skewed
    tls = {"distributed.comm.tls.ca-file": files[0], "distributed.comm.tls.client.cert": files[1],
           "distributed.comm.tls.client.key": files[2], "distributed.comm.require-encryption": True}
    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as other, Client(other):
        with dask.config.set(tls), streamlb.run(keyed_totals(path), address=address, balancer=None) as job:
            job.wait(timeout=60)
            pd.testing.assert_frame_equal(job.state("agg"), truth, check_dtype=False)


def test_a_client_without_the_certificates_is_refused(tls_cluster, tmp_path):
    from distributed.security import Security

    address, (ca_file, _, _) = tls_cluster

    class CertificateLess(Security):
        """Trusts the cluster's CA but presents no certificate of its own."""

        def get_connection_args(self, role):
            context = ssl.create_default_context(cafile=ca_file)
            context.check_hostname = False
            return {"ssl_context": context, "require_encryption": True, "extra_conn_args": {}}

    _, stranger_cert, stranger_key = make_certificates(tmp_path)   # signed by another CA
    stranger = Security(tls_ca_file=ca_file, tls_client_cert=stranger_cert, tls_client_key=stranger_key,
                        require_encryption=True)
    kind, message = client_refusal(address)                        # no TLS configured at all
    assert kind is TypeError and "TLS expects a `ssl_context`" in message
    for security in (CertificateLess(), stranger):                  # the scheduler checks the certificate
        kind, message = client_refusal(address, security)
        assert issubclass(kind, OSError) and "SSL" in message, (kind, message)
    kind, _ = client_refusal(address.replace("tls://", "tcp://"))  # plain tcp to a TLS listener
    assert issubclass(kind, OSError)


def test_a_job_submitted_to_a_tls_cluster_runs_and_is_listed_over_tls(tls_cluster, skewed, tmp_path):
    """The scheduler has no job registry yet: ``submit`` registers one; its driver joins the
    cluster with the scheduler's certificates; the CLI reaches it with Dask's TLS options."""
    import subprocess
    import sys

    address, files = tls_cluster
    path, truth = skewed
    src = Stream.from_parquet(path, batch_size=5_000)
    out = str(tmp_path / "out")
    src.key_by("key").aggregate(AGG, parallelism=2, name="agg").to_parquet(out)
    job = streamlb.submit(src, address=address, name="over-tls", security=tls_security(files))
    job.wait(timeout=120)
    assert job.status == "finished"
    tls = ["--address", address, "--tls-ca-file", files[0], "--tls-cert", files[1], "--tls-key", files[2]]
    listed = subprocess.run([sys.executable, "-m", "streamlb.cli", "jobs", "--json", *tls], capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert [r["status"] for r in json.loads(listed.stdout) if r["name"] == "over-tls"] == ["finished"]
    plain = subprocess.run([sys.executable, "-m", "streamlb.cli", "jobs", "--address", address],
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode != 0         # no certificates: refused
    got = pd.read_parquet(out).reset_index()
    final = got.sort_values("n", kind="stable").groupby("key").last()[list(truth.columns)]
    pd.testing.assert_frame_equal(final.sort_index(), truth.sort_index(), check_dtype=False, check_names=False)
    job.close()
