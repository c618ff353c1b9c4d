"""Sockets from the kernel's sock_diag netlink interface: listening TCP sockets, TCP connections with
their tcp_info, and which socket is connected to which (the peer of a socketpair, an accepted Unix
connection, the other end of a loopback TCP connection: who can wake a process blocked reading one).

/proc/net/tcp makes the kernel walk every socket hash bucket: 4 ms per read on a quiet machine
here, which alone would be a third of the supervisor's budget at one tick a second. sock_diag
asks only for sockets in LISTEN state and answers in tens of microseconds. Falls back to
/proc/net/tcp{,6} where netlink is not allowed (some sandboxes).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable

from hangwatch.collect import procfs

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 0x1
_NLM_F_DUMP = 0x300
_NLMSG_DONE = 3
_NLMSG_ERROR = 2
_TCP_LISTEN = 10
_NLMSG_HEADER = struct.Struct("=IHHII")
_REQUEST = struct.Struct("=BBBxI48s")  # inet_diag_req_v2: family, protocol, ext, pad, states, sockid
_MSG_SPORT = struct.Struct(">H")  # inet_diag_msg.id.idiag_sport, network byte order
_RTA = struct.Struct("=HH")  # rtattr: length, type
_INET_DIAG_REQ_BYTECODE = 1
_BC_OP = struct.Struct("=BBH")  # inet_diag_bc_op: code, yes, no (ports compared in host order)
_BC_JMP = 1
_BC_S_EQ = 11
_BC_D_EQ = 12


def port_filter(ports: Iterable[int]) -> bytes:
    """inet_diag bytecode keeping the sockets whose local or remote port is one of ``ports``.

    Without it a dump carries every TCP socket of the host with its tcp_info: on a busy node (a
    server with thousands of clients, a Ray cluster's own connections) that was most of the watch
    loop's CPU. The kernel runs the program per socket (net/ipv4/inet_diag.c, inet_diag_bc_run): an
    op whose condition holds jumps ``yes`` bytes, else ``no``; landing exactly on the end keeps the
    socket, jumping past it (end + 4) drops it. Its audit (inet_diag_bc_audit) walks the ``yes``
    jumps and wants every ``no`` target on that walk, so the OR of the tests is a chain
    ``test, JMP, test, JMP, ..., test``: a test that holds falls into its JMP, which jumps to the
    end; one that fails skips its JMP to the next test; the last one's failure jumps past the end.
    A port test is two ops (S_EQ/D_EQ, then the port in the second op's ``no``, in host order).
    """
    tests = [(code, port) for port in sorted(set(ports)) for code in (_BC_S_EQ, _BC_D_EQ)]
    size = 12 * len(tests) - 4
    program = b""
    for i, (code, port) in enumerate(tests):
        program += _BC_OP.pack(code, 8, 12) + _BC_OP.pack(0, 0, port)
        if i < len(tests) - 1:
            program += _BC_OP.pack(_BC_JMP, 4, size - (12 * i + 8))
    return program


def inet_diag(
    family: int, states: int, ext: int = 0, ports: Iterable[int] | None = None
) -> list[tuple[bytes, int, int]]:
    """Every TCP socket of ``family`` in ``states`` (a bitmask of TCP states): (buffer, start, end) of
    each inet_diag_msg with its attributes (``ext`` asks for them: 1 << (INET_DIAG_INFO - 1) for
    tcp_info). ``ports``: only sockets with one of them at either end (port_filter). One netlink
    request; the kernel answers in tens of microseconds."""
    body = _REQUEST.pack(family, socket.IPPROTO_TCP, ext, states, b"\0" * 48)
    if ports is not None:
        program = port_filter(ports)
        if not program:
            return []
        body += _RTA.pack(_RTA.size + len(program), _INET_DIAG_REQ_BYTECODE) + program
    return _dump_request(body)


def _dump_request(body: bytes) -> list[tuple[bytes, int, int]]:
    """Send one SOCK_DIAG_BY_FAMILY dump request; (buffer, start, end) of every message answered."""
    out: list[tuple[bytes, int, int]] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as sock:
        header = _NLMSG_HEADER.pack(
            _NLMSG_HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0
        )
        sock.sendall(header + body)
        while True:
            data = sock.recv(1 << 17)
            if not data:
                return out
            offset = 0
            while offset + _NLMSG_HEADER.size <= len(data):
                length, kind, _, _, _ = _NLMSG_HEADER.unpack_from(data, offset)
                if kind == _NLMSG_DONE or length == 0:
                    return out
                if kind == _NLMSG_ERROR:
                    raise OSError("sock_diag returned an error")
                out.append((data, offset + _NLMSG_HEADER.size, offset + length))
                offset += (length + 3) & ~3


# unix_diag_req: family, protocol, pad, states, ino, show, cookie[2]; unix_diag_msg: family, type,
# state, pad, ino, cookie[2]; then attributes, UNIX_DIAG_PEER (2) being the peer's inode.
_UNIX_REQUEST = struct.Struct("=BBHIIIII")
_UNIX_MSG = struct.Struct("=BBBxIII")
_UDIAG_SHOW_PEER = 0x4
_UNIX_DIAG_PEER = 2
_NO_COOKIE = 0xFFFFFFFF


def unix_peers() -> dict[int, int]:
    """socket inode -> the inode of the Unix socket it is connected to, for every connected Unix socket
    of our network namespace. Empty where netlink is refused (then no Unix wait has a known waker)."""
    body = _UNIX_REQUEST.pack(socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, _UDIAG_SHOW_PEER, _NO_COOKIE, _NO_COOKIE)
    try:
        messages = _dump_request(body)
    except OSError:
        return {}
    peers: dict[int, int] = {}
    for data, start, end in messages:
        inode = _UNIX_MSG.unpack_from(data, start)[3]
        offset = start + _UNIX_MSG.size
        while offset + _RTA.size <= end:
            length, kind = _RTA.unpack_from(data, offset)
            if length < _RTA.size:
                break
            if kind == _UNIX_DIAG_PEER and length >= _RTA.size + 4:
                peer = struct.unpack_from("=I", data, offset + _RTA.size)[0]
                if peer:
                    peers[inode] = peer
            offset += (length + 3) & ~3
    return peers


_TCP_ESTABLISHED = 1
_SOCKID = struct.Struct(">HH16s16s")  # inet_diag_sockid: sport, dport (network order), src, dst


def tcp_peers() -> dict[int, int]:
    """socket inode -> the inode of the socket at the other end, for every established TCP connection of
    our network namespace whose both ends are here (loopback: a rank's connection to a peer rank, to the
    store, to an RPC server of the tree). Empty where netlink is refused (then no TCP wait has a known
    waker). The whole table is dumped: this runs once per stack capture, not per tick."""
    ends: dict[tuple[int, bytes, int, bytes, int], int] = {}
    try:
        for family in (socket.AF_INET, socket.AF_INET6):
            for data, msg, _ in inet_diag(family, 1 << _TCP_ESTABLISHED):
                sport, dport, src, dst = _SOCKID.unpack_from(data, msg + 4)
                inode = struct.unpack_from("=I", data, msg + 4 + 48 + 16)[0]
                if inode:
                    ends[(int(family), src, sport, dst, dport)] = inode
    except OSError:
        return {}
    peers: dict[int, int] = {}
    for (fam, src, sport, dst, dport), inode in ends.items():
        other = ends.get((fam, dst, dport, src, sport))
        if other is not None:
            peers[inode] = other
    return peers


def _dump(family: int) -> dict[int, int]:
    found: dict[int, int] = {}
    for data, msg, _ in inet_diag(family, 1 << _TCP_LISTEN):
        # inet_diag_msg: family, state, timer, retrans (4 bytes), sockid (48), expires, rqueue,
        # wqueue, uid (16), inode (4).
        port = _MSG_SPORT.unpack_from(data, msg + 4)[0]
        inode = struct.unpack_from("=I", data, msg + 4 + 48 + 16)[0]
        found[inode] = port
    return found


def listening_inodes() -> dict[int, int]:
    """socket inode -> local port of every listening TCP socket in our network namespace."""
    try:
        return {**_dump(socket.AF_INET), **_dump(socket.AF_INET6)}
    except OSError:
        return procfs.read_listening()
