"""A real Slurm cluster (Debian's slurm-wlm 22.05 and munge) on the emulated nodes of nodes_emulation.py.

One ``munged`` for the whole cluster (the nodes share this machine's file system, and a path-bound unix
socket is reachable from every network namespace), ``slurmctld`` inside hwnode1 (its hostname is the
controller's, its port is private to its network namespace, so concurrent runs do not meet) and one
``slurmd -N hwnodeK`` inside each node, each with its own spool directory, pid file and log under the
test's directory. Nothing under /etc is read or written: every daemon and client gets ``-f``/``SLURM_CONF``
and munge's socket through ``AuthInfo=socket=``.

What the emulation needs that a real cluster has anyway (docs/multinode.md 6):

* ``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none``: no cgroup hierarchy is delegated
  to a node's namespaces (``ip netns exec`` remounts /sys);
* ``NodeAddr`` = the node's bridge address (no DNS for hwnodeK), ``SlurmdUser``/``SlurmUser`` root;
* ``CPUs`` = what each node sees (they share this machine's cores).

Every daemon is started by ``EmulatedNodes.run_on`` (or here, for munged) and stopped, descendants first,
by ``close``: slurmds, slurmctld, munged, then the nodes themselves.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from nodes_emulation import EmulatedNodes
from proc_helpers import kill_tree
from proc_helpers import wait_until

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/slurmstepd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
START_S = 60.0


def slurm_skip_reason() -> str | None:
    """Why a real Slurm cluster cannot be started here, or None."""
    for path in DAEMONS:
        if not Path(path).exists():
            return f"{path} is missing: apt-get install --no-install-recommends slurmctld slurmd slurm-client munge"
    for tool in (*CLIENTS, "mungekey"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (slurm-client, munge)"
    return None


@dataclass
class SlurmCluster:
    """slurmctld on the first node and a slurmd on every node of ``nodes``."""

    nodes: EmulatedNodes
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    started: list[subprocess.Popen[Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.dir = self.nodes.work / "slurm"
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket"

    @property
    def env(self) -> dict[str, str]:
        """What a client of this cluster needs in its environment."""
        return {"SLURM_CONF": str(self.conf)}

    def client_env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, **self.env, **extra}

    # -- set-up ---------------------------------------------------------------------------------------
    def start(self) -> SlurmCluster:
        t0 = time.monotonic()
        try:
            self.dir.mkdir()
            self._munged()
            self.timings["munged_s"] = time.monotonic() - t0
            self._write_conf()
            self._slurmctld()
            self.timings["slurmctld_s"] = time.monotonic() - t0
            self._slurmds()
            self.timings["nodes_idle_s"] = time.monotonic() - t0
        except BaseException:
            self.close()
            raise
        return self

    def _munged(self) -> None:
        mdir = self.munge_socket.parent
        mdir.mkdir(mode=0o700)
        key = self.dir / "munge.key"
        subprocess.run(["mungekey", "--create", "--keyfile", str(key)], check=True, capture_output=True)
        key.chmod(0o400)
        proc = subprocess.Popen(
            ["/usr/sbin/munged", "--foreground", "--force", "--socket", str(self.munge_socket),
             "--key-file", str(key), "--pid-file", str(mdir / "munged.pid"),
             "--log-file", str(self.dir / "munged.log"), "--seed-file", str(mdir / "munged.seed")],
            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.started.append(proc)

        def answers() -> bool:
            probe = subprocess.run(
                f"munge -n --socket {self.munge_socket} | unmunge --socket {self.munge_socket}",
                shell=True, capture_output=True, check=False,
            )  # fmt: skip
            return probe.returncode == 0

        wait_until(answers, START_S, interval=0.1, what="munged")

    def _write_conf(self) -> None:
        d, first = self.dir, self.nodes.nodes[0]
        lines = [
            "ClusterName=hwtest",
            f"SlurmctldHost={first.name}({first.address})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "SlurmctldPort=6817",
            "SlurmdPort=6818",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d / 'ctld'}",
            f"SlurmdSpoolDir={d / 'spool-%n'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "ReturnToService=2",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "KillWait=2",
            "MinJobAge=10",
            "InactiveLimit=0",
        ]
        for n in self.nodes.nodes:
            lines.append(f"NodeName={n.name} NodeAddr={n.address} CPUs={self.cpus} State=UNKNOWN")
        names = ",".join(n.name for n in self.nodes.nodes)
        lines.append(f"PartitionName=hw Nodes={names} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        # slurmd 22.05 always loads a cgroup plugin (autodetect fails: "No filesystem mounted on
        # /sys/fs/cgroup"); v1 is only loaded here, never used (linuxproc, task/none).
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        (d / "ctld").mkdir()
        for n in self.nodes.nodes:
            # slurmd does not create its spool directory ("Domain socket directory ...: No such file").
            (d / f"spool-{n.name}").mkdir()

    def _slurmctld(self) -> None:
        first = self.nodes.nodes[0]
        proc = self.nodes.run_on(
            first, ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)],
            env=self.client_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.started.append(proc)

        def answers() -> bool:
            ping = self.run(["scontrol", "ping"], timeout=10)
            return ping.returncode == 0 and "UP" in ping.stdout

        wait_until(answers, START_S, interval=0.2, what="slurmctld")

    def _slurmds(self) -> None:
        for n in self.nodes.nodes:
            # `ip netns exec` mounted a fresh /sys in the node: an empty /sys/fs/cgroup, which slurmd's
            # cgroup plugin refuses. A tmpfs there (in the node's own mount namespace, gone with it).
            subprocess.run(
                ["nsenter", "--target", str(n.init_pid), "--mount", "--", "mount", "-t", "tmpfs",
                 "-o", "size=1m,mode=755", "hwcgroup", "/sys/fs/cgroup"],
                check=True, capture_output=True,
            )  # fmt: skip
            proc = self.nodes.run_on(
                n, ["/usr/sbin/slurmd", "-D", "-N", n.name, "-f", str(self.conf)],
                env=self.client_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            self.started.append(proc)

        def all_idle() -> bool:
            out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10).stdout.split()
            states = dict(zip(out[::2], out[1::2], strict=False))
            return len(states) == len(self.nodes.nodes) and all(s == "idle" for s in states.values())

        wait_until(all_idle, START_S, interval=0.2, what="every slurmd registered idle")

    # -- use ------------------------------------------------------------------------------------------
    def run(self, argv: list[str], timeout: float = 30, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=self.client_env(**env), check=False
        )

    def job_state(self, job: str) -> str:
        return self.run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip()

    def submit(self, script: str, *sbatch_args: str, **env: str) -> str:
        """``sbatch --parsable`` a batch script (its text); the job id. The job's output goes to the
        cluster's directory (job-J.out)."""
        path = self.dir / f"batch-{len(list(self.dir.glob('batch-*')))}.sh"
        path.write_text(script)
        out = self.run(
            ["sbatch", "--parsable", "-o", str(self.dir / "job-%j.out"), *sbatch_args, str(path)],
            **env,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().split(";")[0]

    def wait_running(self, job: str) -> None:
        wait_until(lambda: self.job_state(job) == "RUNNING", START_S, interval=0.2, what=f"job {job} running")

    def cancel(self, job: str) -> None:
        """scancel, then wait until the job has left the queue (its steps and tasks ended on every node)."""
        self.run(["scancel", job])
        wait_until(lambda: self.job_state(job) == "", START_S, interval=0.2, what=f"job {job} gone")

    def leftovers(self) -> list[str]:
        """Processes of this cluster still alive (after ``close``: none)."""
        mark = str(self.dir)
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                    if mark in cmdline and Path(f"/proc/{entry}/stat").read_text().split()[2] != "Z":
                        out.append(f"{entry}: {cmdline.strip()}")
        return out

    # -- tear-down ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Every job cancelled while the daemons still run (slurmd ends its steps), then the daemons,
        slurmds first, descendants first; the nodes' pid 1s take whatever is left (close of the nodes)."""
        if self.started and self.conf.exists():
            with contextlib.suppress(Exception):
                jobs = self.run(["squeue", "-h", "-o", "%i"], timeout=10).stdout.split()
                for job in jobs:
                    self.cancel(job)
        for proc in reversed(self.started):
            with contextlib.suppress(Exception):
                kill_tree(proc)
            with contextlib.suppress(ValueError):
                self.nodes.started.remove(proc)
        self.started.clear()
