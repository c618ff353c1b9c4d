"""Nodes emulated on this machine: one network namespace per node on a Linux bridge, each with its own PID and
UTS namespace (its own pid 1, hostname and /proc) and its own sshd, reached with a test key (multinode.md 4.4).

Everything lives in private addresses of a /24 this module picks unused, and in names carrying this
test process's pid, so concurrent runs do not meet. The bridge is the recipe's lesson: one subnet for
every node, so node-to-node traffic (the TCPStore, gloo) needs no IP forwarding on the host.

Every process is started here, each in a session of its own, and ``close`` stops them descendants
first (``proc_helpers.kill_tree``), then each node's pid 1 (which takes whatever is left in its PID
namespace with it), then removes the namespaces and the bridge. Nothing else is ever signalled.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import hangwatch
from proc_helpers import kill_tree
from proc_helpers import proc_state
from proc_helpers import wait_until

PROGRAMS = Path(__file__).resolve().parent / "programs"
SSHD = "/usr/sbin/sshd"
TORCH_START_S = 120.0
START_S = 15.0


def skip_reason() -> str | None:
    """Why nodes cannot be emulated here, or None."""
    if os.geteuid() != 0:
        return "emulated nodes need root (network and PID namespaces)"
    for tool in ("ip", "unshare", "nsenter", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2, util-linux, openssh-client)"
    if not Path(SSHD).exists():
        return f"{SSHD} is missing (apt-get install openssh-server)"
    probe = f"hwprobe{os.getpid() % 100_000}"
    checks = (
        ("a network namespace", ["ip", "netns", "add", probe], ["ip", "netns", "del", probe]),
        ("a bridge", ["ip", "link", "add", probe, "type", "bridge"], ["ip", "link", "del", probe]),
        (
            "PID and UTS namespaces",
            ["unshare", "--uts", "--pid", "--fork", "--mount-proc", "--", "true"],
            None,
        ),
    )
    for what, make, undo in checks:
        made = subprocess.run(make, capture_output=True, text=True, check=False)
        if undo is not None:
            subprocess.run(undo, capture_output=True, check=False)
        if made.returncode != 0:
            return f"cannot create {what} here: {made.stderr.strip()}"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _used_subnets() -> set[str]:
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=False).stdout
    return {".".join(word.split("/")[0].split(".")[:3]) for word in out.split() if word.count(".") == 3}


@dataclass
class Node:
    index: int
    name: str  # hostname inside the node, and its alias in ssh_config
    netns: str
    address: str
    host_if: str  # our end of the node's veth pair, on the bridge
    init: subprocess.Popen[Any]  # `unshare`, parent of the node's pid 1
    init_pid: int = 0  # the node's pid 1, as the host sees it
    sshd: subprocess.Popen[Any] | None = None


@dataclass
class EmulatedNodes:
    """``count`` nodes reachable as ``hwnodeN`` through ``ssh -F self.ssh_config``."""

    work: Path
    count: int = 3
    nodes: list[Node] = field(default_factory=list)
    started: list[subprocess.Popen[Any]] = field(default_factory=list)
    bridge: str = ""
    subnet: str = ""

    def leftovers(self) -> list[str]:
        """Namespaces and links of ours that still exist (after ``close``: none)."""
        tag = self.bridge[3:]
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
        return [
            w for w in (netns + links).replace(":", " ").replace("@", " ").split() if w.startswith(f"hw{tag}")
        ] + ([self.bridge] if f" {self.bridge} " in f" {links.replace(':', ' ')} " else [])

    def __post_init__(self) -> None:
        tag = os.getpid() % 100_000
        self.bridge = f"hwb{tag}"
        used = _used_subnets()
        self.subnet = next(
            f"10.231.{n}" for n in range(tag % 200, tag % 200 + 50) if f"10.231.{n}" not in used
        )
        self.bridge_address = f"{self.subnet}.1"  # this machine, as the nodes reach it
        self.ssh_config = self.work / "ssh_config"
        self.hangwatch = self.work / "hangwatch"  # how the nodes start hangwatch (see _write_client_files)

    # -- set-up ---------------------------------------------------------------------------------------
    def start(self) -> EmulatedNodes:
        try:
            self._keys()
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(1, self.count + 1):
                self.nodes.append(self._node(i))
            self._write_client_files()
            for node in self.nodes:
                self.start_sshd(node)
        except BaseException:
            self.close()
            raise
        return self

    def _keys(self) -> None:
        for name in ("host_key", "id_test", "id_wrong"):
            subprocess.run(
                [
                    "ssh-keygen",
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-C",
                    "hangwatch-test",
                    "-f",
                    str(self.work / name),
                ],
                check=True,
            )
        (self.work / "authorized_keys").write_text((self.work / "id_test.pub").read_text())
        # sshd's privilege separation directory; the package creates it only when its service starts.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)

    def _node(self, i: int) -> Node:
        tag = self.bridge[3:]
        netns, host_if, address = f"hw{tag}n{i}", f"hw{tag}v{i}", f"{self.subnet}.{10 + i}"
        _ip("netns", "add", netns)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("link", "set", host_if, "master", self.bridge)
        _ip("link", "set", host_if, "up")
        for args in (
            ("addr", "add", f"{address}/24", "dev", "eth0"),
            ("link", "set", "eth0", "up"),
            ("link", "set", "lo", "up"),
        ):
            _ip("netns", "exec", netns, "ip", *args)
        name = f"hwnode{i}"
        # The node's pid 1 only holds the namespaces open: sshd and the job are started beside it, so
        # stopping sshd leaves the job running, as on a real node.
        init = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                netns,
                "unshare",
                "--uts",
                "--pid",
                "--fork",
                "--mount-proc",
                "--",
                "sh",
                "-c",
                f"hostname {name} && exec sleep 100000",
            ],
            start_new_session=True,
            stderr=subprocess.DEVNULL,  # unshare complains when its child is SIGKILLed at the end
        )
        node = Node(i, name, netns, address, host_if, init)

        def pid1() -> int:
            for child in _children(init.pid):
                if Path(f"/proc/{child}/comm").read_text().strip() == "sleep":
                    return child
            return 0

        node.init_pid = wait_until(pid1, START_S, what=f"pid 1 of {name}")
        # A /dev/shm of the node's own, as a real machine has: engines decide which ranks share a node
        # by opening a POSIX shm segment another rank created (SGLang's in_the_same_node_as), so with
        # the host's /dev/shm every emulated node passes for one machine (docs/multinode.md 5b). The tmpfs
        # lives in the node's mount namespace (unshare made it private) and goes with it.
        subprocess.run(
            ["nsenter", "--target", str(node.init_pid), "--mount", "--", "mount", "-t", "tmpfs",
             "-o", "size=512m,mode=1777", f"hwshm{tag}n{i}", "/dev/shm"],
            check=True, capture_output=True,
        )  # fmt: skip
        return node

    def _write_client_files(self) -> None:
        host_pub = (self.work / "host_key.pub").read_text().split()
        # The bridge's own address too: a Ray head on this machine is a node at that address
        # (start_host_sshd), and Ray gives every node as an address, never as an alias.
        (self.work / "known_hosts").write_text(
            "".join(
                f"{a} {host_pub[0]} {host_pub[1]}\n"
                for a in [self.bridge_address] + [n.address for n in self.nodes]
            )
        )
        entries = []
        for n in self.nodes:
            entries.append((n.name, n.address, "id_test"))
            entries.append((f"{n.name}-wrongkey", n.address, "id_wrong"))
        common = (
            "  User root\n  IdentitiesOnly yes\n  UserKnownHostsFile {kh}\n  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n  LogLevel ERROR\n"
            # The post-quantum default exchange costs 0.14 s of client CPU per connection (multinode.md 2.8).
            "  KexAlgorithms curve25519-sha256\n"
        ).format(kh=self.work / "known_hosts")
        text = "".join(
            f"Host {alias}\n  HostName {addr}\n  IdentityFile {self.work / key}\n{common}"
            for alias, addr, key in entries
        )
        # Last, so the aliases above win: any address of the subnet (what Ray's state API gives).
        text += f"Host {self.subnet}.*\n  IdentityFile {self.work / 'id_test'}\n{common}"
        self.ssh_config.write_text(text)
        # The nodes share this machine's file system: hangwatch from this checkout, this interpreter.
        src = Path(hangwatch.__file__).resolve().parents[1]
        self.hangwatch.write_text(f'#!/bin/sh\nPYTHONPATH={src} exec {sys.executable} -m hangwatch "$@"\n')
        self.hangwatch.chmod(0o755)

    def start_sshd(self, node: Node) -> None:
        conf = self.work / f"sshd_{node.index}.conf"
        conf.write_text(
            f"ListenAddress {node.address}\nHostKey {self.work / 'host_key'}\nPidFile none\n"
            f"AuthorizedKeysFile {self.work / 'authorized_keys'}\nUsePAM no\nStrictModes no\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
            "KexAlgorithms curve25519-sha256\nMaxStartups 100\nLogLevel ERROR\n"
        )
        node.sshd = self.run_on(node, [SSHD, "-D", "-e", "-f", str(conf)], stderr=subprocess.DEVNULL)

        def answers() -> bool:
            probe = subprocess.run(
                [
                    "ssh",
                    "-F",
                    str(self.ssh_config),
                    "-o",
                    "BatchMode=yes",
                    "-o",
                    "ConnectTimeout=2",
                    node.name,
                    "true",
                ],
                capture_output=True,
                check=False,
            )
            return probe.returncode == 0

        wait_until(answers, START_S, interval=0.2, what=f"sshd of {node.name}")

    def start_host_sshd(self) -> subprocess.Popen[Any]:
        """An sshd on this machine listening only on the bridge's address: the way to a node that is this
        machine itself (a Ray head started here), with the same keys as the nodes'."""
        conf = self.work / "sshd_host.conf"
        conf.write_text(
            f"ListenAddress {self.bridge_address}\nHostKey {self.work / 'host_key'}\nPidFile none\n"
            f"AuthorizedKeysFile {self.work / 'authorized_keys'}\nUsePAM no\nStrictModes no\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
            "KexAlgorithms curve25519-sha256\nMaxStartups 100\nLogLevel ERROR\n"
        )
        proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(conf)], start_new_session=True, stderr=subprocess.DEVNULL
        )
        self.started.append(proc)

        def answers() -> bool:
            argv = ["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", "-o", "ConnectTimeout=2"]
            return subprocess.run([*argv, self.bridge_address, "true"], capture_output=True).returncode == 0

        wait_until(answers, START_S, interval=0.2, what="sshd at the bridge address")
        return proc

    def stop_host_sshd(self, proc: subprocess.Popen[Any]) -> None:
        kill_tree(proc)
        self.started.remove(proc)

    def stop_sshd(self, node: Node) -> None:
        if node.sshd is not None:
            kill_tree(node.sshd)
            self.started.remove(node.sshd)
            node.sshd = None

    def run_on(self, node: Node, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the node (its network, PID, mount and UTS namespaces), in a session of its own."""
        enter = ["nsenter", "--target", str(node.init_pid), "--net", "--pid", "--mount", "--uts", "--"]
        proc = subprocess.Popen([*enter, *argv], start_new_session=True, **kwargs)
        self.started.append(proc)
        return proc

    # -- tear-down ------------------------------------------------------------------------------------
    def close(self) -> None:
        for proc in reversed(self.started):
            with contextlib.suppress(Exception):
                kill_tree(proc)
        self.started.clear()
        for node in self.nodes:
            # pid 1 last: the kernel then kills anything left in the node's PID namespace (ssh sessions).
            with contextlib.suppress(ProcessLookupError):
                if node.init_pid:
                    os.kill(node.init_pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.init.wait(timeout=10)
        for node in self.nodes:
            subprocess.run(["ip", "netns", "del", node.netns], capture_output=True, check=False)
            # The kernel frees a namespace's devices asynchronously: delete our end of the pair now.
            subprocess.run(["ip", "link", "del", node.host_if], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
        self.nodes.clear()


class Job:
    """One job's agents, one per node: ``layout`` maps a node index to its global ranks."""

    def __init__(
        self,
        cluster: EmulatedNodes,
        name: str,
        layout: dict[int, list[int]],
        world: int,
        port: int,
        **extra: str,
    ) -> None:
        self.cluster, self.name = cluster, name
        self.ready = cluster.work / f"ready-{name}"
        self.ready.mkdir()
        self.ranks = [r for ranks in layout.values() for r in ranks]
        master = cluster.nodes[0].address
        self.agents = []
        for index, ranks in layout.items():
            node = cluster.nodes[index - 1]
            argv = [
                sys.executable,
                str(PROGRAMS / "gloo_node_job.py"),
                "--job",
                name,
                "--ranks",
                ",".join(map(str, ranks)),
                "--node-rank",
                str(index - 1),
                "--world-size",
                str(world),
                "--master-addr",
                master,
                "--master-port",
                str(port),
                "--ready-dir",
                str(self.ready),
            ]
            for key, value in extra.items():
                argv += [f"--{key}", value]
            env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "PYTHONUNBUFFERED": "1"}
            log = (cluster.work / f"{name}-{node.name}.log").open("w")
            self.agents.append(cluster.run_on(node, argv, env=env, stdout=log, stderr=subprocess.STDOUT))

    def wait_ready(self) -> None:
        """Every rank announced its blocking call (or its loop, with ``progress-for``)."""
        for rank in self.ranks:
            target = self.ready / f"rank{rank}"
            wait_until(target.exists, TORCH_START_S, interval=0.2, what=f"{self.name} rank {rank} ready")

    def wait_blocked(self) -> None:
        """Every rank announced its blocking call, and every process of the job sleeps in it."""
        self.wait_ready()
        pids = [pid for agent in self.agents for pid in descendants(agent.pid)]

        def all_asleep() -> bool:
            return all(proc_state(p) == "S" for p in pids)

        wait_until(all_asleep, 30, interval=0.2, what=f"{self.name} ranks blocked")

    def match(self) -> str:
        return f"gloo_node_job.py --job {self.name} "

    def stop(self) -> None:
        """Stop this job's agents and their ranks (descendants first), and forget them."""
        for agent in self.agents:
            kill_tree(agent)
            self.cluster.started.remove(agent)
        self.agents = []


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (by the main threads' children lists), parents before children."""
    out: list[int] = []
    frontier = [pid]
    while frontier:
        children = _children(frontier.pop())
        out += children
        frontier += children
    return out


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []
