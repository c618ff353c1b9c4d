"""The server's client connections, from the kernel's TCP state (sock_diag with tcp_info).

Whether requests wait on a server can be seen from outside it: on each connection accepted on its
listening port, tcp_info says how long ago the server last sent data and last received data, and
how many bytes it has sent (acknowledged) and received. A connection whose last data came from the
client, after the server's last answer, holds a request waiting for its answer; bytes sent rising
are answers and streamed tokens going out. Only connections on the tree's own listening ports are
read, and only their counters: no payload, no address beyond the port.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterable

from hangwatch.collect import procfs
from hangwatch.collect.sockdiag import inet_diag
from hangwatch.model.samples import ConnectionSample
from hangwatch.model.samples import ServerConnection

_TCP_ESTABLISHED = 1
_TCP_CLOSE_WAIT = 8
_INET_DIAG_INFO = 2
_MSG_SIZE = 72  # inet_diag_msg
_PORTS = struct.Struct(">HH")  # sport, dport at offset 4, network byte order
_RTA = struct.Struct("=HH")
# struct tcp_info offsets (linux/tcp.h): times in ms since the event; byte counters since connect.
_LAST_DATA_SENT = 44
_LAST_DATA_RECV = 52
_BYTES_ACKED = 120
_BYTES_RECEIVED = 128


def _dump(family: int) -> list[tuple[int, int, int, bytes]]:
    """(sport, dport, inode, tcp_info) of every established or close-wait TCP socket of the family."""
    states = (1 << _TCP_ESTABLISHED) | (1 << _TCP_CLOSE_WAIT)
    out = []
    for data, msg, end in inet_diag(family, states, 1 << (_INET_DIAG_INFO - 1)):
        sport, dport = _PORTS.unpack_from(data, msg + 4)
        inode = struct.unpack_from("=I", data, msg + 4 + 48 + 16)[0]
        out.append((sport, dport, inode, _info(data, msg + _MSG_SIZE, end)))
    return out


def _info(data: bytes, start: int, end: int) -> bytes:
    """The INET_DIAG_INFO attribute (struct tcp_info) among the message's attributes."""
    while start + _RTA.size <= end:
        rta_len, rta_type = _RTA.unpack_from(data, start)
        if rta_len < _RTA.size:
            break
        if rta_type == _INET_DIAG_INFO:
            return bytes(data[start + _RTA.size : start + rta_len])
        start += (rta_len + 3) & ~3
    return b""


def _u32(info: bytes, offset: int) -> int | None:
    return struct.unpack_from("=I", info, offset)[0] if len(info) >= offset + 4 else None


def _u64(info: bytes, offset: int) -> int | None:
    return struct.unpack_from("=Q", info, offset)[0] if len(info) >= offset + 8 else None


def connection_of(
    port: int, peer_port: int, info: bytes, ours: bool, internal: bool = False
) -> ServerConnection:
    sent_ms, recv_ms = _u32(info, _LAST_DATA_SENT), _u32(info, _LAST_DATA_RECV)
    acked, received = _u64(info, _BYTES_ACKED), _u64(info, _BYTES_RECEIVED)
    unanswered = None
    # The client spoke last (a request), and the server has not answered since: waiting this long.
    if recv_ms is not None and sent_ms is not None and received and (recv_ms < sent_ms or not acked):
        unanswered = recv_ms / 1000.0
    return ServerConnection(port, peer_port, received, acked, unanswered, ours, internal)


class ConnectionWatcher:
    """Reads the connections on the tree's listening ports each tick.

    hangwatch's own connections (probes, /metrics scrapes, its own request) are told apart by their
    client end: on loopback both ends are in the dump, and ours is a socket this process holds.
    """

    def __init__(self, pid: int | None = None) -> None:
        self._pid = pid if pid is not None else os.getpid()
        self.unavailable: str | None = None

    def read(self, ports: Iterable[int], members: Iterable[int] = ()) -> ConnectionSample | None:
        """``members``: the tree's processes; a connection whose client end one of them holds is the
        tree talking to itself (an idle SGLang TP=2: TP1's TCPStore connection to TP0 read as a request
        unanswered for minutes), not a client."""
        wanted = tuple(sorted(set(ports)))
        if not wanted or self.unavailable is not None:
            return None
        try:
            rows = _dump(socket.AF_INET) + _dump(socket.AF_INET6)
        except OSError as exc:
            self.unavailable = f"sock_diag unavailable ({exc}): requests waiting are not seen from outside"
            return ConnectionSample(wanted, error=self.unavailable)
        mine = procfs.socket_inodes(self._pid)
        tree = {inode for pid in set(members) for inode in procfs.socket_inodes(pid)}
        ours = {sport for sport, dport, inode, _ in rows if dport in wanted and inode in mine}
        inside = {sport for sport, dport, inode, _ in rows if dport in wanted and inode in tree}
        found = tuple(
            connection_of(sport, dport, info, dport in ours, dport in inside)
            for sport, dport, _, info in rows
            if sport in wanted
        )
        return ConnectionSample(wanted, found)
