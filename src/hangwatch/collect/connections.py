"""The server's client connections, from the kernel's TCP state (sock_diag with tcp_info).

Whether requests wait on a server can be seen from outside it: on each connection accepted on its
listening port, tcp_info says how long ago the server last sent data and last received data, and
how many bytes it has sent (acknowledged) and received. A connection whose last data came from the
client, after the server's last answer, holds a request waiting for its answer; bytes sent rising
are answers and streamed tokens going out. Only connections on the tree's own listening ports are
read, and only their counters: no payload, no address beyond the port.
"""

from __future__ import annotations

import enum
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
# inet_diag_msg after its 4 header bytes, 48 of socket id and 4 of expires: rqueue, wqueue, uid, inode.
# An established socket's rqueue is what arrived and its process has not read.
_QUEUES_UID_INODE = struct.Struct("=IIII")
# struct tcp_info offsets (linux/tcp.h): times in ms since the event; byte counters since connect.
_LAST_DATA_SENT = 44
_LAST_DATA_RECV = 52
_BYTES_ACKED = 120
_BYTES_RECEIVED = 128
EMPTY_EVERY = 5  # a family without the tree's connections is dumped on one read in this many


Row = tuple[int, int, int, int, bytes]  # sport, dport, inode, bytes unread in its receive queue, tcp_info


def _dump(family: int, ports: tuple[int, ...] | None) -> list[Row]:
    """(sport, dport, inode, rqueue, tcp_info) of every established or close-wait TCP socket of the
    family with one of ``ports`` at either end. A connection the server has not accepted yet is there
    too, with inode 0: the kernel completed its handshake and holds it in the listening socket's queue."""
    states = (1 << _TCP_ESTABLISHED) | (1 << _TCP_CLOSE_WAIT)
    out = []
    for data, msg, end in inet_diag(family, states, 1 << (_INET_DIAG_INFO - 1), ports):
        sport, dport = _PORTS.unpack_from(data, msg + 4)
        rqueue, _wqueue, _uid, inode = _QUEUES_UID_INODE.unpack_from(data, msg + 4 + 48 + 4)
        out.append((sport, dport, inode, rqueue, _info(data, msg + _MSG_SIZE, end)))
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
    port: int, peer_port: int, info: bytes, ours: bool, internal: bool = False, *, unread: int = 0
) -> ServerConnection:
    sent_ms, recv_ms = _u32(info, _LAST_DATA_SENT), _u32(info, _LAST_DATA_RECV)
    acked, received = _u64(info, _BYTES_ACKED), _u64(info, _BYTES_RECEIVED)
    unanswered = None
    # The client spoke last (a request), and the server has not answered since: waiting this long.
    if recv_ms is not None and sent_ms is not None and received and (recv_ms < sent_ms or not acked):
        unanswered = recv_ms / 1000.0
    # Bytes still in the receive queue came no later than the client's last data: they have waited
    # unread at least that long.
    unread_s = recv_ms / 1000.0 if unread > 0 and recv_ms is not None else None
    return ServerConnection(port, peer_port, received, acked, unanswered, ours, internal, unread_s)


class Owner(enum.Enum):
    """Who holds the client end of a connection to the tree."""

    OURS = "ours"  # hangwatch: a probe, a /metrics scrape, its own request
    TREE = "tree"  # a process of the watched tree
    OTHER = "other"  # a client (or a client end not on this host)


class ConnectionWatcher:
    """Reads the connections on the tree's listening ports each tick.

    Who holds each connection's client end is told by that end's socket inode (on loopback both ends
    are in the dump): hangwatch's own, a process of the tree's (the engines' processes connect to each
    other on the tree's ports: an 8-byte handshake vLLM never answers looked like a request waiting for
    a minute), or a client's. The owner of an inode never changes, so each is looked up once, and only
    the fds of the processes that could hold it are read (this was the supervisor's largest cost left).
    """

    def __init__(self, pid: int | None = None) -> None:
        self._pid = pid if pid is not None else os.getpid()
        self.unavailable: str | None = None
        self._owners: dict[int, Owner] = {}  # client-end inode -> its holder, for live connections
        self._members: set[int] = set()  # the pids whose fds the OTHER verdicts were checked against
        self._filtered = True  # the kernel takes a port filter (sockdiag.port_filter)
        self._reads = 0
        self._empty: dict[int, int] = {socket.AF_INET: 0, socket.AF_INET6: 0}  # reads in a row: none found

    def _families(self) -> list[int]:
        """The families to dump this time. A dump walks the kernel's whole table of established
        sockets whatever the filter keeps (262,144 buckets here: 0.9 ms a family), so a family where
        the tree has had no connection lately while the other has (IPv6 beside vLLM's IPv4, mostly)
        is dumped on every EMPTY_EVERY-th read only. Where neither has, both are read every time: a
        client's first request must be seen at once (the wedge-while-serving latency counts from it)."""
        live = {f for f, empty in self._empty.items() if empty < 3}
        if not live or self._reads % EMPTY_EVERY == 0:
            return list(self._empty)
        return sorted(live)

    def _dump_family(self, family: int, wanted: tuple[int, ...]) -> list[Row]:
        try:
            rows = _dump(family, wanted if self._filtered else None)
        except OSError:
            if not self._filtered:
                raise
            # A kernel older than the port tests of inet_diag's bytecode refuses the filter: take
            # the whole dump (its rows are matched to the ports by the caller anyway).
            self._filtered = False
            rows = _dump(family, None)
        self._empty[family] = 0 if any(sport in wanted for sport, *_ in rows) else self._empty[family] + 1
        return rows

    def read(self, ports: Iterable[int], members: Iterable[int] = ()) -> ConnectionSample | None:
        """``members``: the pids of the tree, whose connections to its own ports are internal (an idle
        SGLang TP=2: TP1's TCPStore connection to TP0 read as a request unanswered for minutes)."""
        wanted = tuple(sorted(set(ports)))
        if not wanted or self.unavailable is not None:
            return None
        self._reads += 1
        try:
            rows = [row for family in self._families() for row in self._dump_family(family, wanted)]
        except OSError as exc:
            self.unavailable = f"sock_diag unavailable ({exc}): requests waiting are not seen from outside"
            return ConnectionSample(wanted, error=self.unavailable)
        client_end = {(sport, dport): inode for sport, dport, inode, *_ in rows if dport in wanted}
        served = [
            (sport, dport, info, client_end.get((dport, sport)), unread)
            for sport, dport, _, unread, info in rows
            if sport in wanted
        ]
        self._classify({inode for *_, inode, _unread in served if inode}, members)
        found = tuple(
            connection_of(
                sport,
                dport,
                info,
                self._owners.get(inode or 0) is Owner.OURS,
                self._owners.get(inode or 0) is Owner.TREE,
                unread=unread,
            )
            for sport, dport, info, inode, unread in served
        )
        return ConnectionSample(wanted, found)

    def _classify(self, inodes: set[int], members: Iterable[int]) -> None:
        self._owners = {i: o for i, o in self._owners.items() if i in inodes}  # closed ones go
        pids = set(members)
        unknown = inodes - self._owners.keys()
        # A client end judged no member's may belong to a process that joined the tree since.
        joined = pids - self._members
        others = {i for i, o in self._owners.items() if o is Owner.OTHER}
        self._members = pids
        for pid in joined if others else ():
            for inode in others & procfs.socket_inodes(pid):
                self._owners[inode] = Owner.TREE
        if not unknown:
            return
        mine = procfs.socket_inodes(self._pid)
        for inode in unknown & mine:
            self._owners[inode] = Owner.OURS
        unknown -= mine
        for pid in pids if unknown else ():
            held = unknown & procfs.socket_inodes(pid)
            for inode in held:
                self._owners[inode] = Owner.TREE
            unknown -= held
            if not unknown:
                break
        for inode in unknown:
            self._owners[inode] = Owner.OTHER
