"""HPACK for the header blocks a gRPC server sends: no dynamic table, no Huffman coding.

``StatelessEncoder`` replaces h2's encoder on the server's connections. A block depends
only on its fields, so the few blocks sent on every call are encoded once per process
(``_block_cache``); literals go without Huffman coding, whose hpack implementation is
quadratic in the value's length. Sans-IO: fields in, bytes out.
"""

from __future__ import annotations

from typing import Any

from hpack import Encoder, HeaderTuple
from hpack.hpack import encode_integer
from hpack.table import HeaderTable

__all__ = ["StatelessEncoder"]

# Header blocks the stateless encoder keeps, and the largest it keeps: the server sends
# the same few blocks (response headers, OK trailers, a few error statuses) over and over.
# A full cache starts over, so blocks that stopped coming leave it.
_BLOCK_CACHE_ENTRIES = 256
_BLOCK_CACHE_BYTES = 512
_block_cache: dict[tuple[tuple[bytes, bytes], ...], bytes] = {}
# First-byte patterns of RFC 7541 6.2.2 (without indexing) and 6.2.3 (never indexed).
_WITHOUT_INDEXING, _NEVER_INDEXED = 0x00, 0x10


def _hpack_int(value: int, prefix_bits: int, flags: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1, hpack's encoder) with ``flags`` in its first byte."""
    out = encode_integer(value, prefix_bits)
    out[0] |= flags
    return bytes(out)


def _hpack_field(name: bytes, value: bytes, literal: int = _WITHOUT_INDEXING) -> bytes:
    """One field with no dynamic-table state: a static-table index when the field is there
    whole (not for a never-indexed field), else a literal of the ``literal`` kind, its name
    from the static table where it is there, no Huffman coding."""
    static = HeaderTable.STATIC_TABLE_MAPPING.get(name)
    if static is not None:
        name_index, values = static
        whole = values.get(value)
        if whole is not None and literal == _WITHOUT_INDEXING:
            return _hpack_int(whole, 7, 0x80)
        head = _hpack_int(name_index, 4, literal)
    else:
        head = bytes((literal,)) + _hpack_int(len(name), 7, 0x00) + name
    return head + _hpack_int(len(value), 7, 0x00) + value


def _as_bytes(item: object) -> bytes:
    if isinstance(item, bytes):
        return item
    return str(item).encode("utf-8")


def _never_indexed(item: Any) -> bool:
    """hpack's two ways to mark a sensitive field: ``NeverIndexedHeaderTuple``, or a true
    third item in a plain tuple."""
    if isinstance(item, HeaderTuple):
        return not item.indexable
    return len(item) > 2 and bool(item[2])


def _size_updates(changes: list[int]) -> bytes:
    """Dynamic table size updates (RFC 7541 6.3) for the changes since the last block: the
    smallest, then the last if it differs (4.2), so none passes what the peer allows now."""
    smallest, last = min(changes), changes[-1]
    updates = [smallest] if smallest == last else [smallest, last]
    return b"".join(_hpack_int(size, 5, 0x20) for size in updates)


class StatelessEncoder(Encoder):
    """HPACK for what the server sends, with no dynamic table and no Huffman coding.

    - hpack's Huffman encoder builds one big integer a few bits at a time, which is
      quadratic in the value's length (a 64 KiB value took 0.4 s). On a unix socket the
      bytes Huffman coding saves are not worth any CPU.
    - Nothing is added to the dynamic table, so a block depends only on its fields: the
      blocks a server sends on every call (``:status 200`` and content-type, then
      ``grpc-status 0``) are encoded once per process and reused. hpack's encoder took
      ~20 µs a block; a repeated block now costs a dictionary look-up. The price is ~16
      bytes a call that indexing would have saved.
    - A sensitive field (hpack's ``NeverIndexedHeaderTuple``, or a third item that is
      true) goes as never indexed (RFC 7541 6.2.3), and its block is not kept.

    Table size changes asked for by the peer's SETTINGS are still announced at the start
    of the next block (RFC 7541 4.2): the table stays empty whatever its size.
    """

    def encode(self, headers: Any, huffman: bool = False) -> bytes:
        prefix = b""
        if self.table_size_changes:
            prefix = _size_updates(self.table_size_changes)
            self.table_size_changes = []
        items = list(headers.items() if isinstance(headers, dict) else headers)
        fields: list[tuple[bytes, bytes]] = []
        sensitive = False
        for item in items:
            fields.append((_as_bytes(item[0]), _as_bytes(item[1])))
            # h2 hands over plain 2-tuples: only other items are looked at further.
            if type(item) is not tuple or len(item) > 2:
                sensitive = sensitive or _never_indexed(item)
        if sensitive:
            return prefix + b"".join(
                _hpack_field(*field, _NEVER_INDEXED if _never_indexed(item) else _WITHOUT_INDEXING)
                for field, item in zip(fields, items, strict=True)
            )
        key = tuple(fields)
        block = _block_cache.get(key)
        if block is None:
            block = b"".join(_hpack_field(name, value) for name, value in key)
            if len(block) <= _BLOCK_CACHE_BYTES:
                if len(_block_cache) >= _BLOCK_CACHE_ENTRIES:
                    _block_cache.clear()
                _block_cache[key] = block
        return prefix + block if prefix else block
