"""A loopback HTTP server that answers every GET with one prepared large body, framed the way real servers do.

Issue 22: a 5-10 MB Prometheus range answer was cut short. Prometheus (Go's net/http and its gzip writer) sends a
compressed answer in HTTP chunks, and the first chunk carries nothing but the gzip header; Go's Flush adds empty
deflate blocks (00 00 ff ff) that decode to nothing either. `Transfer` picks how the body goes out:
  encoding  identity, or gzip written as such a server writes it (the header alone, then blocks of up to
            `BLOCK` input bytes each with a sync flush, some followed by an empty flush block, then the trailer)
  framing   Content-Length, or chunked (one HTTP chunk per piece above)
  pace      None: as fast as the socket takes it; a number: a slow link, the framed bytes written in `SLICE`-byte
            writes with a `pace`-second pause every `PAUSE_EVERY` writes (so reads see partial data)
Keep-alive (HTTP/1.1), as Prometheus does. Each answer is counted (`answers`).
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

BLOCK = 32 * 1024
SLICE = 1460  # one Ethernet segment's payload
PAUSE_EVERY = 16


@dataclass(frozen=True)
class Transfer:
    encoding: str = "identity"  # identity | gzip
    framing: str = "length"  # length | chunked
    pace: float | None = None

    @property
    def name(self) -> str:
        slow = "-slow" if self.pace is not None else ""
        return f"{self.encoding}-{self.framing}{slow}"


TRANSFERS = (
    Transfer("identity", "length"),
    Transfer("identity", "chunked"),
    Transfer("gzip", "length"),
    Transfer("gzip", "chunked"),
    Transfer("gzip", "chunked", pace=0.0005),
)


def gzip_pieces(body: bytes) -> list[bytes]:
    """`body` gzip-compressed as a streaming server writes it: the 10-byte header alone first, then one sync-flushed
    deflate block per `BLOCK` input bytes (every third followed by an empty flush block), then the trailer."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    pieces: list[bytes] = []
    first = compressor.compress(b"")  # nothing yet: zlib holds the header back until it has output
    for index, offset in enumerate(range(0, len(body), BLOCK)):
        block = compressor.compress(body[offset : offset + BLOCK]) + compressor.flush(zlib.Z_SYNC_FLUSH)
        if index == 0:
            header, block = block[:10], block[10:]  # the gzip header goes out alone, as Go's writer does
            pieces.append(first + header)
        pieces.append(block)
        if index % 3 == 2:
            pieces.append(compressor.flush(zlib.Z_SYNC_FLUSH))  # an empty block: decodes to nothing
    pieces.append(compressor.flush(zlib.Z_FINISH))
    return [piece for piece in pieces if piece]


def identity_pieces(body: bytes) -> list[bytes]:
    return [body[offset : offset + BLOCK] for offset in range(0, len(body), BLOCK)]


class LargeAnswerServer:
    """Answers every GET with `body` (Content-Type `content_type`) sent as `transfer` says."""

    def __init__(self, body: bytes, transfer: Transfer, *, content_type: str = "application/json") -> None:
        self.body = body
        self.transfer = transfer
        self.answers = 0
        pieces = gzip_pieces(body) if transfer.encoding == "gzip" else identity_pieces(body)
        if transfer.framing == "chunked":
            framed = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"
            length_header = ("Transfer-Encoding", "chunked")
        else:
            framed = b"".join(pieces)
            length_header = ("Content-Length", str(len(framed)))
        headers = [("Content-Type", content_type), length_header]
        if transfer.encoding == "gzip":
            headers.append(("Content-Encoding", "gzip"))
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                for name, value in headers:
                    self.send_header(name, value)
                self.end_headers()
                for part in server._slices(framed):
                    self.wfile.write(part)
                self.wfile.flush()
                server.answers += 1

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def _slices(self, framed: bytes) -> Iterator[bytes]:
        if self.transfer.pace is None:
            yield framed
            return
        for index, offset in enumerate(range(0, len(framed), SLICE)):
            yield framed[offset : offset + SLICE]
            if index % PAUSE_EVERY == PAUSE_EVERY - 1:
                time.sleep(self.transfer.pace)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
