"""A git repository served over https (git's dumb protocol: static files) with a self-signed
certificate, which git trusts through ``GIT_SSL_CAINFO``."""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from llmgw.testing.serving import serving

LOOPBACK = "127.0.0.1"


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key: (certificate, key) files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(LOOPBACK))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def git(*args: str, cwd: Path) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}  # fmt: skip
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def commit_files(work: Path, files: dict[str, str], message: str) -> str:
    """Write ``files`` into the work tree ``work`` and commit them; the commit's full hash."""
    for name, text in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", message, cwd=work)
    return git("rev-parse", "HEAD", cwd=work)


def publish(work: Path, bare: Path) -> None:
    """Make ``bare`` a copy of ``work`` that git's dumb https protocol can clone."""
    if not bare.exists():
        git("clone", "-q", "--bare", str(work), str(bare), cwd=work.parent)
    else:
        git("push", "-q", "--all", str(bare), cwd=work)
    git("update-server-info", cwd=bare)


@dataclass(frozen=True)
class HttpsGit:
    url: str
    """The https URL of the served folder's parent: ``<url>/<name>.git``."""
    ca_file: Path
    """For ``GIT_SSL_CAINFO``."""


@asynccontextmanager
async def serving_git(folder: Path, certs: Path) -> AsyncIterator[HttpsGit]:
    """Serve ``folder`` (bare repositories in it) over https until the block ends."""
    cert, key = self_signed(certs)
    app = Starlette(routes=[Mount("/", app=StaticFiles(directory=folder))])
    async with serving(app, ssl_certfile=str(cert), ssl_keyfile=str(key)) as url:
        yield HttpsGit(url.replace("http://", "https://"), cert)
