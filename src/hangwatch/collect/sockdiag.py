"""Listening TCP sockets from the kernel's sock_diag netlink interface.

/proc/net/tcp makes the kernel walk every socket hash bucket: 4 ms per read on a quiet machine
here, which alone would be a third of the supervisor's budget at one tick a second. sock_diag
asks only for sockets in LISTEN state and answers in tens of microseconds. Falls back to
/proc/net/tcp{,6} where netlink is not allowed (some sandboxes).
"""

from __future__ import annotations

import socket
import struct

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


def _dump(family: int) -> dict[int, int]:
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as sock:
        body = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 1 << _TCP_LISTEN, b"\0" * 48)
        header = _NLMSG_HEADER.pack(
            _NLMSG_HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0
        )
        sock.sendall(header + body)
        found: dict[int, int] = {}
        while True:
            data = sock.recv(65536)
            offset = 0
            while offset + _NLMSG_HEADER.size <= len(data):
                length, kind, _, _, _ = _NLMSG_HEADER.unpack_from(data, offset)
                if kind == _NLMSG_DONE:
                    return found
                if kind == _NLMSG_ERROR:
                    raise OSError("sock_diag returned an error")
                msg = offset + _NLMSG_HEADER.size
                # inet_diag_msg: family, state, timer, retrans (4 bytes), sockid (48), expires, rqueue,
                # wqueue, uid (16), inode (4).
                port = _MSG_SPORT.unpack_from(data, msg + 4)[0]
                inode = struct.unpack_from("=I", data, msg + 4 + 48 + 16)[0]
                found[inode] = port
                offset += (length + 3) & ~3
                if length == 0:
                    return found


def listening_inodes() -> dict[int, int]:
    """socket inode -> local port of every listening TCP socket in our network namespace."""
    try:
        return {**_dump(socket.AF_INET), **_dump(socket.AF_INET6)}
    except OSError:
        return procfs.read_listening()
