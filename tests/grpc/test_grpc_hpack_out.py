"""The server's HPACK encoder: no dynamic table, no Huffman coding, repeated blocks reused.

Golden bytes from RFC 7541: 6.1 (indexed field), 6.2.2 (literal without indexing), 5.1
(integers with an N-bit prefix), 6.3 (dynamic table size update); static table indexes
from its Appendix A (8 is ``:status 200``, 31 is ``content-type``).
"""

from __future__ import annotations

from collections.abc import Iterator

import h2.events
import h2.settings
import hpack
import pytest
from builders import H2Pair
from grpclib.const import Status
from hypothesis import given
from hypothesis import strategies as st

from dracpu.grpc import hpack_out
from dracpu.grpc.framing import encode_message
from dracpu.grpc.hpack_out import StatelessEncoder
from dracpu.grpc.status import RESPONSE_HEADERS, status_trailers, trailers_only

RESPONSE_BLOCK = b"\x88" + b"\x0f\x10" + b"\x10application/grpc"
OK_TRAILERS_BLOCK = b"\x00\x0bgrpc-status" + b"\x010"


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    """Each test starts with an empty block cache; the process's own is put back after."""
    saved = dict(hpack_out._block_cache)
    hpack_out._block_cache.clear()
    yield
    hpack_out._block_cache.clear()
    hpack_out._block_cache.update(saved)


def _decode(decoder: hpack.Decoder, block: bytes) -> list[tuple[bytes, bytes]]:
    return [(bytes(n), bytes(v)) for n, v in decoder.decode(block, raw=True)]


def test_golden_blocks_of_every_call() -> None:
    encoder = StatelessEncoder()
    assert encoder.encode(RESPONSE_HEADERS) == RESPONSE_BLOCK
    assert encoder.encode(status_trailers(Status.OK)) == OK_TRAILERS_BLOCK
    # Trailers-Only: the two blocks in one.
    assert encoder.encode(trailers_only(Status.OK)) == RESPONSE_BLOCK + OK_TRAILERS_BLOCK


def test_a_repeated_block_is_the_same_bytes_and_leaves_the_peer_table_empty() -> None:
    encoder, decoder = StatelessEncoder(), hpack.Decoder()
    blocks = [encoder.encode(RESPONSE_HEADERS) for _ in range(3)]
    assert blocks[0] == blocks[1] == blocks[2]
    for block in blocks:
        assert _decode(decoder, block) == RESPONSE_HEADERS
    assert len(decoder.header_table.dynamic_entries) == 0
    assert len(encoder.header_table.dynamic_entries) == 0


def test_long_names_and_values_use_multi_byte_lengths() -> None:
    name, value = b"x-" + b"n" * 200, b"v" * 300
    block = StatelessEncoder().encode([(name, value)])
    # 202 = 127 + 75; 300 = 127 + 173 = 127 + 0x80|45, 1
    assert block[:3] == b"\x00\x7f\x4b"
    assert block[3 : 3 + 202] == name
    assert block[205:208] == b"\x7f\xad\x01"
    assert block[208:] == value
    assert _decode(hpack.Decoder(), block) == [(name, value)]


def test_a_table_size_change_is_announced_once_at_the_start_of_the_next_block() -> None:
    encoder, decoder = StatelessEncoder(), hpack.Decoder()
    encoder.header_table_size = 100  # what h2 does on the peer's SETTINGS_HEADER_TABLE_SIZE
    first = encoder.encode(RESPONSE_HEADERS)
    assert first == b"\x3f\x45" + RESPONSE_BLOCK  # 100 = 31 + 69, 5-bit prefix, flag 001
    assert encoder.encode(RESPONSE_HEADERS) == RESPONSE_BLOCK
    assert _decode(decoder, first) == RESPONSE_HEADERS
    assert decoder.header_table.maxsize == 100


def test_the_blocks_of_every_call_come_from_the_cache() -> None:
    first = StatelessEncoder().encode(RESPONSE_HEADERS)
    assert StatelessEncoder().encode(RESPONSE_HEADERS) is first  # another connection too
    assert hpack_out._block_cache == {tuple(RESPONSE_HEADERS): RESPONSE_BLOCK}


def test_several_size_changes_announce_the_smallest_then_the_last() -> None:
    # RFC 7541 4.2: the peer's limit may have gone down and up again since the last block;
    # announcing only the values in order could pass its limit of the moment.
    encoder, decoder = StatelessEncoder(), hpack.Decoder()
    for size in (8192, 100, 4096):
        encoder.header_table_size = size
    block = encoder.encode(RESPONSE_HEADERS)
    # 100 = 31 + 69; 4096 = 31 + 4065 = 31 + 0x80|97, 31
    assert block == b"\x3f\x45" + b"\x3f\xe1\x1f" + RESPONSE_BLOCK
    assert _decode(decoder, block) == RESPONSE_HEADERS
    assert decoder.header_table.maxsize == 4096
    encoder.header_table_size = 8192  # larger than the default: announced as asked
    assert encoder.encode(RESPONSE_HEADERS) == b"\x3f\xe1\x3f" + RESPONSE_BLOCK


def test_a_size_change_set_twice_to_the_same_value_is_still_announced() -> None:
    # hpack's own flag says "unchanged" after the second, equal, setting.
    encoder = StatelessEncoder()
    encoder.header_table_size = 0
    encoder.header_table_size = 0
    assert encoder.encode(RESPONSE_HEADERS) == b"\x20" + RESPONSE_BLOCK
    assert encoder.encode(RESPONSE_HEADERS) == RESPONSE_BLOCK


def test_sensitive_fields_go_never_indexed_and_are_not_kept() -> None:
    encoder, decoder = StatelessEncoder(), hpack.Decoder()
    fields = [
        hpack.HeaderTuple(b":status", b"200"),
        hpack.NeverIndexedHeaderTuple(b"authorization", b"secret"),
        (b"x-token", b"t", True),
    ]
    block = encoder.encode(fields)
    # authorization is static index 23: 0x10 | 15, 23 - 15; x-token has a literal name.
    assert block == b"\x88" + b"\x1f\x08\x06secret" + b"\x10\x07x-token\x01t"
    decoded = decoder.decode(block, raw=True)
    assert [type(f) for f in decoded[1:]] == [hpack.NeverIndexedHeaderTuple] * 2
    assert hpack_out._block_cache == {}


def test_text_fields_are_encoded_as_utf8() -> None:
    block = StatelessEncoder().encode([(":status", "200"), ("grpc-message", "ü")])
    assert _decode(hpack.Decoder(), block) == [
        (b":status", b"200"),
        (b"grpc-message", "ü".encode()),
    ]


def test_the_cache_is_bounded_in_entries_and_in_block_size() -> None:
    encoder = StatelessEncoder()
    big = [(b"grpc-message", b"m" * (hpack_out._BLOCK_CACHE_BYTES + 1))]
    assert encoder.encode(big) == encoder.encode(big)  # encoded each time, not kept
    assert tuple(big) not in hpack_out._block_cache
    for i in range(hpack_out._BLOCK_CACHE_ENTRIES + 50):
        fields = [(b"grpc-status", b"2"), (b"grpc-message", b"error %d" % i)]
        assert _decode(hpack.Decoder(), encoder.encode(fields)) == fields
    assert len(hpack_out._block_cache) <= hpack_out._BLOCK_CACHE_ENTRIES
    # A full cache starts over: blocks that are still sent get back in.
    encoder.encode(RESPONSE_HEADERS)
    assert tuple(RESPONSE_HEADERS) in hpack_out._block_cache


_names = st.one_of(
    st.sampled_from([b":status", b"content-type", b"grpc-status", b"grpc-message", b"date"]),
    st.binary(min_size=1, max_size=300).map(lambda b: b.lower()),
)
_values = st.one_of(st.sampled_from([b"200", b"404", b"0", b""]), st.binary(max_size=600))


@given(st.lists(st.lists(st.tuples(_names, _values), max_size=6), min_size=1, max_size=5))
def test_any_blocks_decode_to_what_was_encoded(blocks: list[list[tuple[bytes, bytes]]]) -> None:
    encoder, decoder = StatelessEncoder(), hpack.Decoder()
    decoder.max_header_list_size = 1 << 20
    for fields in blocks:
        assert _decode(decoder, encoder.encode(fields)) == fields
    assert len(decoder.header_table.dynamic_entries) == 0


@pytest.mark.parametrize("settings", [[0], [0, 0], [8192, 4096], [8192, 100, 4096]])
def test_a_client_that_changes_its_table_size_still_reads_every_reply(settings: list[int]) -> None:
    pair = H2Pair()
    for size in settings:  # each SETTINGS frame acknowledged before the next reply
        pair.client.update_settings({h2.settings.SettingCodes.HEADER_TABLE_SIZE: size})
    pair.exchange()
    for _ in range(2):
        sid = pair.request(encode_message(b"x"))
        pair.exchange()
        pair.server.send_message(sid, b"reply")
        pair.server.send_status(sid, Status.OK)
        pair.exchange()
        (resp,) = pair.of(h2.events.ResponseReceived, sid)
        assert resp.headers == RESPONSE_HEADERS
        (trailers,) = pair.of(h2.events.TrailersReceived, sid)
        assert trailers.headers == [(b"grpc-status", b"0")]
    assert pair.client.decoder.header_table.maxsize == settings[-1]
