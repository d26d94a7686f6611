"""Issue 22 (1): `read_raw_within` reads a body to its real end, whatever the HTTP library's read1 does.

A read whose bytes decode to nothing yet (a gzip header alone, an empty flush block) may come back empty with the
rest of the body still on the wire (urllib3-future's read1 does); only an empty read that took nothing from the
wire, or a closed response, ends the body. A double of a streamed response stands for the library, so this holds
for any urllib3 installed (tests/integration/test_large_answers.py reads real sockets)."""

from __future__ import annotations

import gzip
import io
import zlib

import pytest
import urllib3

from tailguard.controller.kit.http import DeadlineExceeded, read_raw_within


class StreamedBody:
    """A streamed response: `reads` is what each read1 returns after taking `wire` bytes from the socket."""

    def __init__(self, reads: list[tuple[int, bytes]]) -> None:
        self._reads = list(reads)
        self._taken = 0
        self.closed = False
        self.calls = 0

    def tell(self) -> int:
        return self._taken

    def read1(self, amt: int, decode_content: bool = False) -> bytes:
        self.calls += 1
        if not self._reads:
            self.closed = True
            return b""
        wire, data = self._reads.pop(0)
        self._taken += wire
        return data


def test_an_empty_read_that_took_bytes_from_the_wire_is_not_the_end() -> None:
    # The gzip header alone (10 bytes, nothing decoded), data, an empty flush block (5 bytes), data, the trailer.
    raw = StreamedBody([(10, b""), (4000, b"a" * 65536), (5, b""), (3000, b"b" * 30000), (8, b"")])
    assert read_raw_within(raw, deadline=float("inf")) == b"a" * 65536 + b"b" * 30000
    assert raw.closed  # read to the real end


def test_an_empty_read_that_took_nothing_ends_the_body() -> None:
    raw = StreamedBody([(100, b"x" * 100), (0, b""), (50, b"never read")])
    assert read_raw_within(raw, deadline=float("inf")) == b"x" * 100
    assert raw.calls == 2


def test_a_body_whose_reads_never_end_is_cut_at_the_deadline() -> None:
    raw = StreamedBody([(1, b"")] * 1000)
    ticks = iter(range(1000))
    with pytest.raises(DeadlineExceeded):
        read_raw_within(raw, deadline=5.0, timer=lambda: float(next(ticks)))


def test_a_gzip_body_in_flush_blocks_through_the_installed_urllib3() -> None:
    """The installed urllib3's own response over an in-memory gzip stream of sync-flushed blocks."""
    body = b"".join(f'{{"sample": {index}}}\n'.encode() for index in range(50_000))
    compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    blocks = []
    for offset in range(0, len(body), 4096):
        blocks.append(compressor.compress(body[offset : offset + 4096]) + compressor.flush(zlib.Z_SYNC_FLUSH))
        blocks.append(compressor.flush(zlib.Z_SYNC_FLUSH))  # an empty block: decodes to nothing
    stream = b"".join(blocks) + compressor.flush()
    assert gzip.decompress(stream) == body
    response = urllib3.HTTPResponse(
        body=io.BytesIO(stream), headers={"Content-Encoding": "gzip"}, preload_content=False, decode_content=True
    )
    assert read_raw_within(response, deadline=float("inf")) == body
