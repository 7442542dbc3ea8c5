"""Minimal protocol clients the lab talks to servers with: Redis (RESP) and the MySQL
client protocol (enough for SphinxQL). Each is a TCP connection to 127.0.0.1 by
default, usable as a context manager."""
from __future__ import annotations

import socket
import struct
from collections.abc import Iterable, Sequence
from typing import Optional, Self

# ---- the connection ------------------------------------------------------------------


class TcpClient:
    """A TCP connection for the minimal protocol clients below: sock (TCP_NODELAY) and f,
    its buffered reader; close() on leaving a with block."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 30.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.f = self.sock.makefile("rb")

    def close(self) -> None:
        try:
            self.f.close()
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- Redis ---------------------------------------------------------------------------


class RedisReplyError(Exception):
    """An error reply (-ERR ...) from Redis."""


class RedisClient(TcpClient):
    """Minimal RESP client: command() and pipeline()."""

    @staticmethod
    def encode(*args) -> bytes:
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(out)

    def _reply(self):
        line = self.f.readline()
        if not line:
            raise ConnectionError("redis closed the connection")
        t, rest = line[:1], line[1:-2]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            return RedisReplyError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)
            return data[:-2]
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise ConnectionError(f"bad RESP reply {line!r}")

    def command(self, *args):
        self.sock.sendall(self.encode(*args))
        r = self._reply()
        if isinstance(r, RedisReplyError):
            raise r
        return r

    def pipeline(self, commands: Iterable[Sequence], batch: int = 1000) -> int:
        """Sends commands in batches, reading the replies; returns the number of errors."""
        errors = 0
        buf: list[bytes] = []

        def flush():
            nonlocal errors
            self.sock.sendall(b"".join(buf))
            for _ in range(len(buf)):
                if isinstance(self._reply(), RedisReplyError):
                    errors += 1
            buf.clear()

        for c in commands:
            buf.append(self.encode(*c))
            if len(buf) >= batch:
                flush()
        if buf:
            flush()
        return errors

    def info(self, section: str = "memory") -> dict:
        text = self.command("INFO", section).decode()
        out = {}
        for line in text.splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                out[k] = v.strip()
        return out


# ---- MySQL protocol (SphinxQL) -------------------------------------------------------


class MySQLError(Exception):
    """An error packet from the server, or a reply MySQLMini cannot parse."""


class MySQLMini(TcpClient):
    """Just enough of the MySQL client protocol for SphinxQL: handshake without a
    password, COM_QUERY, text result sets (rows as lists of str/None)."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 30.0,
                 user: str = "keel"):
        super().__init__(port, host, timeout)
        self._read_packet()                          # server greeting
        caps = 0x0001 | 0x0200 | 0x8000               # long password, protocol 41, secure conn.
        payload = (struct.pack("<IIB", caps, 1 << 24, 33) + b"\0" * 23 + user.encode() + b"\0"
                   + b"\0")
        self._send(payload, 1)
        p = self._read_packet()
        if p[:1] == b"\xff":
            raise MySQLError(self._err(p))

    def _send(self, payload: bytes, seq: int) -> None:
        self.sock.sendall(struct.pack("<I", len(payload))[:3] + bytes([seq & 0xFF]) + payload)

    def _read_packet(self) -> bytes:
        hdr = self.f.read(4)
        if len(hdr) < 4:
            raise ConnectionError("server closed the connection")
        n = hdr[0] | hdr[1] << 8 | hdr[2] << 16
        data = self.f.read(n)
        if len(data) < n:
            raise ConnectionError("server closed the connection")
        return data

    @staticmethod
    def _err(p: bytes) -> str:
        msg = p[3:]
        if msg[:1] == b"#":
            msg = msg[6:]
        return msg.decode("utf-8", "replace")

    @staticmethod
    def _lenenc(p: bytes, i: int) -> tuple[Optional[int], int]:
        c = p[i]
        if c < 0xFB:
            return c, i + 1
        if c == 0xFB:
            return None, i + 1
        if c == 0xFC:
            return p[i + 1] | p[i + 2] << 8, i + 3
        if c == 0xFD:
            return p[i + 1] | p[i + 2] << 8 | p[i + 3] << 16, i + 4
        return struct.unpack_from("<Q", p, i + 1)[0], i + 9

    def query(self, sql: str) -> list[list[Optional[str]]]:
        self._send(b"\x03" + sql.encode(), 0)
        p = self._read_packet()
        if p[:1] == b"\xff":
            raise MySQLError(self._err(p))
        if p[:1] == b"\x00":
            return []
        ncols, _ = self._lenenc(p, 0)
        for _ in range(ncols or 0):
            self._read_packet()
        p = self._read_packet()                      # EOF after the column definitions
        if not (p[:1] == b"\xfe" and len(p) < 9):
            raise MySQLError("protocol: expected EOF after column definitions")
        rows: list[list[Optional[str]]] = []
        while True:
            p = self._read_packet()
            if p[:1] == b"\xfe" and len(p) < 9:
                return rows
            if p[:1] == b"\xff":
                raise MySQLError(self._err(p))
            row: list[Optional[str]] = []
            i = 0
            while i < len(p):
                n, i = self._lenenc(p, i)
                if n is None:
                    row.append(None)
                else:
                    row.append(p[i:i + n].decode("utf-8", "replace"))
                    i += n
            rows.append(row)

    def close(self) -> None:
        try:
            self._send(b"\x01", 0)                   # COM_QUIT
        except OSError:
            pass
        super().close()
