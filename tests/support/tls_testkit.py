"""A throwaway certificate authority and a scripted https server, for fetching tests.

The server is real TLS over real sockets (asyncio), so the fetcher's name
checking, pinning and limits are exercised as they are in production; only the
answers are scripted, per path.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class ThrowawayCA:
    ca_pem: Path
    cert_pem: Path
    key_pem: Path

    def client_context(self) -> ssl.SSLContext:
        """Trusts this CA only."""
        return ssl.create_default_context(cafile=str(self.ca_pem))

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert_pem, self.key_pem)
        return context


def make_ca(directory: Path, *, dns_names: list[str], ip_addresses: list[str]) -> ThrowawayCA:
    """A CA and one server certificate for the given names and addresses, as PEM files."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandbox-mcp test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "document server")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    ca = ThrowawayCA(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    ca.ca_pem.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    ca.cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    ca.key_pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    # Send the body a byte at a time with this pause between bytes (a slow server).
    drip_s: float = 0.0
    # Claim a Content-Length other than the body's (None: the true one; -1: none, read to close).
    content_length: int | None = None


@dataclass
class Seen:
    path: str
    host: str


class DocumentServer:
    """An https server answering each path as scripted; it records what it was asked."""

    def __init__(self, context: ssl.SSLContext, host: str = "127.0.0.1", port: int = 0) -> None:
        self.answers: dict[str, Answer] = {}
        self.seen: list[Seen] = []
        self._context = context
        self._host = host
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self.port = port

    async def __aenter__(self) -> DocumentServer:
        self._server = await asyncio.start_server(
            self._serve, self._host, self.port, ssl=self._context, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        for handler in list(self._handlers):
            handler.cancel()  # a dripping answer must not outlive the test's event loop
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._writers.add(writer)
        self._handlers.add(task)
        try:
            await self._answer(reader, writer)
        finally:
            self._writers.discard(writer)
            self._handlers.discard(task)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            writer.close()
            return
        lines = head.decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1]
        hosts = [ln.split(":", 1)[1].strip() for ln in lines if ln.lower().startswith("host:")]
        host = hosts[0] if hosts else ""
        self.seen.append(Seen(path, host))
        answer = self.answers.get(path, Answer(404, b"not found"))
        headers = {"Content-Type": "application/json"}
        if answer.content_length is None:
            headers["Content-Length"] = str(len(answer.body))
        elif answer.content_length >= 0:
            headers["Content-Length"] = str(answer.content_length)
        headers.update(answer.headers)
        writer.write(
            f"HTTP/1.1 {answer.status} X\r\n".encode()
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode()
            + b"Connection: close\r\n\r\n"
        )
        try:
            if answer.drip_s:
                for byte in answer.body:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(answer.drip_s)
            else:
                writer.write(answer.body)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()
