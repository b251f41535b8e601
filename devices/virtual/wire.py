"""The adb transport's framing: 24-byte little-endian message headers and their constants.

Read from AOSP packages/modules/adb (adb.h, protocol.txt, transport.cpp check_header). A header is
command, arg0, arg1, data_length, data_check, magic (= command ^ 0xffffffff). From A_VERSION
0x01000001 on, nobody verifies data_check, but a peer still on 0x01000000 wants the byte sum.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from engine.units import KIB, MIB

HEADER = struct.Struct("<6I")
HEADER_BYTES = HEADER.size  # 24


def _cmd(text: str) -> int:
    return int.from_bytes(text.encode("ascii"), "little")


A_SYNC = _cmd("SYNC")
A_CNXN = _cmd("CNXN")
A_OPEN = _cmd("OPEN")
A_OKAY = _cmd("OKAY")
A_CLSE = _cmd("CLSE")
A_WRTE = _cmd("WRTE")
A_AUTH = _cmd("AUTH")
A_STLS = _cmd("STLS")
KNOWN_COMMANDS = {A_SYNC, A_CNXN, A_OPEN, A_OKAY, A_CLSE, A_WRTE, A_AUTH, A_STLS}

A_VERSION_MIN = 0x01000000
A_VERSION_SKIP_CHECKSUM = 0x01000001
A_VERSION = 0x01000001
MAX_PAYLOAD_V1 = 4 * KIB
MAX_PAYLOAD = MIB  # what a current adbd offers; the server takes min(its, ours)


class ProtocolError(Exception):
    """The peer sent something that is not an adb message: the connection is dropped."""


@dataclass(frozen=True)
class Header:
    command: int
    arg0: int
    arg1: int
    data_length: int
    data_check: int
    magic: int

    @property
    def name(self) -> str:
        return command_name(self.command)


def command_name(command: int) -> str:
    raw = command.to_bytes(4, "little")
    return raw.decode("ascii") if command in KNOWN_COMMANDS else f"0x{command:08x}"


def parse_header(raw: bytes, max_payload: int) -> Header:
    """Check a header the way transport.cpp's check_header does (magic, payload bound) and more:
    unknown commands are refused too, since nothing else could follow them sensibly."""
    h = Header(*HEADER.unpack(raw))
    if h.magic != (h.command ^ 0xFFFFFFFF):
        raise ProtocolError(f"bad magic 0x{h.magic:08x} for command 0x{h.command:08x}")
    if h.command not in KNOWN_COMMANDS:
        raise ProtocolError(f"unknown command {h.name}")
    if h.data_length > max_payload:
        raise ProtocolError(f"{h.name} payload of {h.data_length} bytes exceeds {max_payload}")
    return h


def checksum(payload: bytes | bytearray | memoryview) -> int:
    return sum(payload) & 0xFFFFFFFF


def pack_header(command: int, arg0: int, arg1: int, payload: bytes | memoryview = b"",
                with_checksum: bool = False) -> bytes:
    check = checksum(payload) if with_checksum else 0
    return HEADER.pack(command, arg0 & 0xFFFFFFFF, arg1 & 0xFFFFFFFF, len(payload), check,
                       command ^ 0xFFFFFFFF)
