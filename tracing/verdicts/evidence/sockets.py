"""Sockets a process's main thread waits on: the descriptor its call names, its epoll set, else its
open sockets; each TCP one's remote address, state and queues, and from a ``sock_diag`` netlink dump
(what ``ss`` reads; no privilege) how long nothing came in. The dump walks the kernel's whole
connection table: one per pass (``read_tcp``) serves every rank in the reader's network namespace;
a rank in another namespace is read from its own ``/proc/PID/net/tcp{,6}`` (no such time)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import socket
import struct
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from ...redact import printable
from .proc import Proc
from .values import MAX_SOCKETS, SOCKETISH, MainWait, Socket

Tcp = Mapping[int, "TcpRow"] | Callable[[], "Mapping[int, TcpRow] | None"] | None  # a table, or how to read it

_TCP_STATES = {
    1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT", 7: "CLOSE",
    8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING",
}  # fmt: skip
_UNIX_STATES = {1: "unconnected", 2: "connecting", 3: "connected", 4: "disconnecting"}


_SOCKET_LINK = re.compile(r"^socket:\[(\d+)\]$")


def _socket_inodes(proc: Proc, main: MainWait) -> tuple[dict[int, int | None], str | None]:
    """Socket inodes the main thread waits on -> their fd, and where they were found."""
    if main.kind not in SOCKETISH and main.kind not in ("unknown",):
        return {}, None
    if main.fd is not None and main.target and (m := _SOCKET_LINK.match(main.target)):
        return {int(m.group(1)): main.fd}, "the descriptor it waits on"
    if main.kind == "epoll" and main.fd is not None:
        info = proc.text(f"fdinfo/{main.fd}", "epoll set", limit=1 << 16) or ""
        found = {}
        for line in info.splitlines():
            m = re.match(r"^tfd:\s*(\d+).*\bino:([0-9a-f]+)", line)
            if m:
                found[int(m.group(2), 16)] = int(m.group(1))
        if found:
            return found, "its epoll set"
    if main.kind in ("poll", "epoll", "socket", "recv", "connect", "accept", "unknown"):
        found = {int(m.group(1)): fd for fd, link in proc.fds() if (m := _SOCKET_LINK.match(link))}
        return found, "its open sockets (the system call does not say which)" if found else None
    return {}, None


def _addr(hexaddr: str) -> str:
    """``0100007F:1F90`` -> ``127.0.0.1:8080``; IPv6 as ``[::1]:8080`` (IPv4-mapped as IPv4)."""
    host, _, port = hexaddr.partition(":")
    raw = bytes.fromhex(host)
    if sys.byteorder == "little":  # the kernel prints each 32-bit word in host order
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    text = f"[{ip}]" if ip.version == 6 else str(ip)
    return f"{text}:{int(port, 16)}"


@dataclass(frozen=True)
class TcpRow:
    """One TCP socket of a network namespace."""

    proto: str  # "tcp" | "tcp6"
    state: str
    local: str
    remote: str
    rx: int  # bytes received, not yet read
    tx: int  # bytes sent, not yet acknowledged
    retransmits: int
    last_recv_s: float | None = None  # since data (or the connection) last came in; sock_diag only
    last_sent_s: float | None = None


_NETLINK_SOCK_DIAG, _TCPDIAG_GETSOCK, _SOCK_DIAG_BY_FAMILY, _INET_DIAG_INFO = 4, 18, 20, 2
_NLM_REQUEST_DUMP, _NLMSG_ERROR, _NLMSG_DONE = 0x1 | 0x300, 2, 3
_ANY_STATE = 0xFFFFFFFF


def read_tcp(timeout_s: float = 1.0) -> dict[int, TcpRow] | None:
    """Every TCP socket of this process's network namespace, by inode, from a ``sock_diag`` netlink
    dump (what ``ss`` reads; no privilege), with ``tcp_info``'s time since data last came in; None
    when netlink is refused (``read`` then reads ``/proc/PID/net/tcp``). Either walks the kernel's
    whole connection hash table (milliseconds on a host with a large one), so one dump serves every
    rank of a pass: the IPv4-and-IPv6 request first (one walk), else one per family."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
    except (OSError, AttributeError):
        return None
    rows: dict[int, TcpRow] = {}
    with sock:
        sock.settimeout(timeout_s)  # a netlink dump never blocks for long; this bounds the rare case
        try:
            both = struct.pack("=BBBB", socket.AF_UNSPEC, 0, 0, 1 << (_INET_DIAG_INFO - 1)) + bytes(48)
            if _dump(sock, _TCPDIAG_GETSOCK, both + struct.pack("=II", _ANY_STATE, 0), rows):
                return rows
            for family in (socket.AF_INET, socket.AF_INET6):
                one = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 1 << (_INET_DIAG_INFO - 1), 0, _ANY_STATE)
                if not _dump(sock, _SOCK_DIAG_BY_FAMILY, one + bytes(48), rows):
                    return None
        except (OSError, struct.error, ValueError):
            return None
    return rows


def _dump(sock: socket.socket, kind: int, request: bytes, rows: dict[int, TcpRow]) -> bool:
    """Send one dump request and read its answers (``inet_diag_msg`` + ``tcp_info``) into ``rows``;
    False when the kernel refuses it."""
    sock.send(struct.pack("=IHHII", 16 + len(request), kind, _NLM_REQUEST_DUMP, 1, 0) + request)
    while True:
        data, off = sock.recv(1 << 16), 0
        while off + 16 <= len(data):
            length, what = struct.unpack_from("=IH", data, off)
            if length < 16 or what == _NLMSG_DONE:
                return True
            if what == _NLMSG_ERROR:
                return False
            if length >= 16 + 72:
                _row(data, off + 16, off + length, rows)
            off += (length + 3) & ~3


def _row(data: bytes, m: int, end: int, rows: dict[int, TcpRow]) -> None:
    family, state, _, retrans = struct.unpack_from("=BBBB", data, m)
    if family not in (socket.AF_INET, socket.AF_INET6):
        return
    width = 4 if family == socket.AF_INET else 16
    sport, dport = struct.unpack_from("!HH", data, m + 4)
    rq, wq, _, inode = struct.unpack_from("=IIII", data, m + 56)
    last_recv = last_sent = None
    a = m + 72
    while a + 4 <= end:  # attributes: tcp_info (last_data_sent at 44, last_data_recv at 52, in ms)
        alen, atype = struct.unpack_from("=HH", data, a)
        if alen < 4:
            break
        if atype == _INET_DIAG_INFO and alen >= 4 + 56:
            sent_ms, _, recv_ms = struct.unpack_from("=III", data, a + 4 + 44)
            last_sent, last_recv = sent_ms / 1000, recv_ms / 1000
        a += (alen + 3) & ~3
    if inode:
        rows[inode] = TcpRow(
            "tcp" if family == socket.AF_INET else "tcp6",
            _TCP_STATES.get(state, str(state)),
            _host_port(data[m + 8 : m + 8 + width], sport),
            _host_port(data[m + 24 : m + 24 + width], dport),
            rq,
            wq,
            retrans,
            last_recv,
            last_sent,
        )


def _host_port(raw: bytes, port: int) -> str:
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def _proc_tcp(proc: Proc, inodes: Collection[int]) -> dict[int, TcpRow]:
    """The sockets ``inodes`` from ``/proc/PID/net/tcp{,6}`` (the pid's own network namespace)."""
    rows: dict[int, TcpRow] = {}
    for proto in ("tcp", "tcp6"):
        for line in (proc.text(f"net/{proto}", f"{proto} table") or "").splitlines()[1:]:
            f = line.split()
            if len(f) < 10 or not f[9].isdigit() or int(f[9]) not in inodes:
                continue
            with contextlib.suppress(ValueError, IndexError):
                tx, rx = (int(x, 16) for x in f[4].split(":"))
                state = _TCP_STATES.get(int(f[3], 16), f[3])
                rows[int(f[9])] = TcpRow(proto, state, _addr(f[1]), _addr(f[2]), rx, tx, int(f[6], 16))
    return rows


def _same_netns(pid: int) -> bool | None:
    try:
        return os.stat("/proc/self/ns/net").st_ino == os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def waited_on(proc: Proc, main: MainWait, rendezvous: str | None, tcp: Tcp) -> tuple[list[Socket], str | None]:
    inodes, where = _socket_inodes(proc, main)
    if not inodes:
        return [], None
    table = None
    if _same_netns(proc.pid):
        table = tcp() if callable(tcp) else tcp if tcp is not None else read_tcp()
    if table is None:
        table = _proc_tcp(proc, inodes)
    out: list[Socket] = []
    for inode, fd in inodes.items():
        row = table.get(inode)
        if row is None:
            continue
        out.append(
            Socket(
                inode=inode,
                proto=row.proto,  # type: ignore[arg-type]
                fd=fd,
                local=row.local,
                remote=row.remote,
                state=row.state,
                rx_queue=row.rx,
                tx_queue=row.tx if row.state != "SYN_SENT" else 0,  # a SYN counts as one byte in flight
                retransmits=row.retransmits,
                last_recv_s=round(row.last_recv_s, 1) if row.last_recv_s is not None else None,
                role="rendezvous" if rendezvous and _same_addr(row.remote, rendezvous) else None,
                meaning=_tcp_meaning(row),
            )
        )
    if len(out) < len(inodes):
        for line in (proc.text("net/unix") or "").splitlines()[1:]:
            f = line.split(maxsplit=7)
            if len(f) < 7 or not f[6].isdigit() or int(f[6]) not in inodes:
                continue
            st = _UNIX_STATES.get(int(f[5], 16), f[5]) if re.fullmatch(r"[0-9A-Fa-f]+", f[5]) else f[5]
            path = printable(f[7]) if len(f) > 7 else None
            out.append(
                Socket(
                    inode=int(f[6]),
                    proto="unix",
                    fd=inodes[int(f[6])],
                    remote=path,
                    state=st,
                    meaning=f"unix socket {path or '(unnamed)'}, {st}",
                )
            )
    rank = {"SYN_SENT": 0, "ESTABLISHED": 1, "CLOSE_WAIT": 2}
    out.sort(
        key=lambda s: (s.role != "rendezvous", rank.get(s.state, 3 if s.proto != "unix" else 4), -(s.tx_queue or 0))
    )
    return out[:MAX_SOCKETS], where


def _tcp_meaning(row: TcpRow) -> str:
    """The TCP state in words. The queues are what is there now: "nothing received" means nothing
    unread at this moment; how long since anything came in, only where ``tcp_info`` says."""
    state, rx, tx = row.state, row.rx, row.tx
    if state == "SYN_SENT":
        return f"connecting (SYN_SENT), no answer yet, SYN sent {row.retransmits + 1} times"
    if state == "ESTABLISHED":
        if rx:
            text = f"connected, {rx} B received and not yet read"
        elif row.last_recv_s is not None:  # tcp_info: since data last came in, or since it connected
            text = f"connected, nothing received for {row.last_recv_s:.0f} s"
        else:
            text = "connected, nothing received to read"
        if tx:
            text += f", {tx} B sent and not acknowledged ({row.retransmits} retransmits)"
        return text
    return {
        "CLOSE_WAIT": "CLOSE_WAIT: the peer closed the connection",
        "LISTEN": "listening",
        "SYN_RECV": "SYN_RECV: a peer is connecting",
    }.get(state, state)


def _same_addr(remote: str, wanted: str) -> bool:
    wanted = re.sub(r"^\w+://", "", wanted.strip())
    host, _, port = wanted.rpartition(":")
    r_host, _, r_port = remote.rpartition(":")
    if port != r_port:
        return False
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host) == ipaddress.ip_address(r_host.strip("[]"))
    except ValueError:
        return True  # a host name: the port is what can be checked
