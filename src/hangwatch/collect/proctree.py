"""Sample the whole process tree once per tick: membership, per-process counters, exits.

Membership is decided from a full scan of /proc (one stat read per process) every few seconds,
so that a process is found however it was started; between scans only the members and their
main threads' children are read, which keeps a tick cheap on a host with a thousand processes.
A process once seen stays a member while it lives, even after its parent dies and it is
reparented (pid reuse is ruled out by its start time).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path

from hangwatch.collect import procfs
from hangwatch.collect import sockdiag
from hangwatch.collect.deaths import DeathWatcher
from hangwatch.errors import UsageError
from hangwatch.model.samples import ExitHow
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import ProcessId
from hangwatch.model.samples import ProcessSample
from hangwatch.model.samples import ProcState
from hangwatch.redact import redact_argv

RoleNamer = Callable[[str, tuple[str, ...], bool, dict[str, str]], tuple[str | None, str | None]]
"""(title, cmdline, is_root, rank environment) -> (role, rank)."""

# Environment variables that name a rank (torchrun, SLURM, MPI). Only these are ever read.
FULL_SCAN_EVERY_S = 5.0
RANK_ENV_KEYS = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"})


@dataclass
class _Known:
    identity: ProcessId
    first_seen: float
    name: str
    role: str | None
    rank: str | None
    cpu_s: float
    rchar: int | None
    wchar: int | None
    exit_recorded: bool = False
    rank_env: dict[str, str] | None = None
    first_comm: str = ""  # its comm when first seen (before any title it sets)
    # The last command line read and its redaction: redacting every member's argv every tick was a
    # fifth of the supervisor's CPU on a TP=2 vLLM tree, and a command line rarely changes.
    argv: tuple[str, ...] = ()
    argv_redacted: tuple[str, ...] = ()


@dataclass(frozen=True)
class TreeReading:
    processes: tuple[ProcessSample, ...]
    exits: tuple[ExitRecord, ...]


def decode_wait_status(status: int) -> tuple[int | None, int | None]:
    """(exit_code, signal) from a waitpid status word."""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None


class TreeSampler:
    """Tracks the processes descending from ``roots``.

    ``adopter`` is our own pid when we are the tree's subreaper: orphans of the tree are then
    reparented to us, and our children other than ``exclude`` (our own helpers) belong to it.
    ``exclude``: processes that are never members, nor any process below them (hangwatch itself and
    its helpers when the named tree contains it: ``exclude=own_processes``).
    ``reap`` waits for our zombie children and returns their statuses.
    """

    def __init__(
        self,
        roots: Iterable[int],
        namer: RoleNamer,
        *,
        adopter: int | None = None,
        exclude: Callable[[], set[int]] = set,
        reap: Callable[[Iterable[int]], dict[int, int]] | None = None,
        reaped_status: Callable[[int], int | None] = lambda pid: None,
        root: Path = procfs.PROC,
        watch_deaths: bool = True,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._roots = set(roots)
        self._namer = namer
        self._adopter = adopter
        self._exclude = exclude
        self._reap = reap
        self._reaped_status = reaped_status  # statuses reaped outside sample() (by the clean-up)
        self._root = root
        self._known: dict[int, _Known] = {}
        self._port_owner: dict[int, int] = {}  # socket inode -> pid
        # Listening sockets no member held when last scanned (other programs' servers), and the members
        # scanned then: fds are read again only for a new socket or a new member, not every tick.
        self._foreign: set[int] = set()
        self._ports_scanned: set[int] = set()
        self._deaths = DeathWatcher(root, clock) if watch_deaths else None
        self._root_identities: set[ProcessId] = set()
        self._last_full_scan: float | None = None
        self._hints: dict[int, str] = {}  # pid -> the title its log lines give it

    def learn_titles(self, titles: Iterable[tuple[int, str]]) -> None:
        """Titles for untitled members, from what their log lines say they are."""
        self._hints.update(titles)

    @property
    def root_pids(self) -> set[int]:
        return set(self._roots)

    def close(self) -> None:
        if self._deaths is not None:
            self._deaths.close()

    def identities(self) -> set[ProcessId]:
        """(pid, start time) of every live member: what cleanup and the guardian may signal."""
        return {k.identity for k in self._known.values() if not k.exit_recorded}

    def known_pids(self) -> set[int]:
        return {k.identity.pid for k in self._known.values() if not k.exit_recorded}

    def _read_stats(self, t: float) -> dict[int, procfs.Stat]:
        if self._last_full_scan is None or t - self._last_full_scan >= FULL_SCAN_EVERY_S:
            self._last_full_scan = t
            candidates = procfs.list_pids(self._root)
        else:
            candidates = list(self._roots | set(self._known))
            if self._adopter is not None:
                candidates += procfs.read_children(self._adopter, self._root)
            seen = set(candidates)
            frontier = list(candidates)
            while frontier:  # follow the main threads' children down the tree
                for child in procfs.read_children(frontier.pop(), self._root):
                    if child not in seen:
                        seen.add(child)
                        candidates.append(child)
                        frontier.append(child)
        stats: dict[int, procfs.Stat] = {}
        for pid in candidates:
            stat = procfs.read_stat(pid, self._root)
            if stat is not None:
                stats[pid] = stat
        return stats

    def sample(self, t: float) -> TreeReading:
        stats = self._read_stats(t)
        members = self._members(stats)
        exits: list[ExitRecord] = []

        # Our own zombie children: waitpid gives the exact status (and must be called anyway).
        reaped: dict[int, int] = {}
        if self._reap is not None:
            ours = [pid for pid in members if stats[pid].ppid == os.getpid() or pid in self._roots]
            reaped = self._reap(ours) if ours else {}

        listening = (
            sockdiag.listening_inodes() if self._root == procfs.PROC else procfs.read_listening(self._root)
        )
        self._attribute_ports(listening, members)
        samples: list[ProcessSample] = []
        for pid in sorted(members):
            stat = stats[pid]
            known = self._known.get(pid)
            if known is not None and known.identity != stat.identity:
                # The pid was reused: the process we knew ended unseen.
                exits.append(self._exit_of(known, t, None))
                known = None
            if known is None:
                known = self._first_sight(stat, t)
            if pid in reaped:
                # A zombie seen while another parent held it, reaped by us once re-parented (its launcher
                # killed): its exit was recorded then. Twice, one SIGKILL read as a tear-down of two
                # (sglang-tp2-TP1-serving-sigkill-run, 2026-12-04).
                if not known.exit_recorded:
                    exits.append(self._exit_of(known, t, reaped[pid], ExitHow.WAITPID))
                continue
            if stat.state == ProcState.ZOMBIE:
                if not known.exit_recorded:
                    exits.append(self._exit_of(known, t, stat.exit_code, ExitHow.ZOMBIE_STAT))
                continue
            samples.append(self._sample_of(stat, known, listening))
        samples = self._launchers_are_not_ranks(samples)

        for pid, known in list(self._known.items()):
            if pid not in members or stats.get(pid) is None:
                if not known.exit_recorded:
                    exits.append(self._vanished(known, t))
                del self._known[pid]
        return TreeReading(tuple(samples), tuple(exits))

    def _launchers_are_not_ranks(self, samples: list[ProcessSample]) -> list[ProcessSample]:
        """A Slurm (or MPI) task that started processes with a ``RANK`` of their own is their launcher.

        ``SLURM_PROCID`` numbers a step's tasks, one per node when a job runs ``srun torchrun ...``:
        with a real Slurm the agents (SLURM_PROCID 0-2) were taken for ranks 0-2 beside the workers'
        RANK 0-3, every rank "found twice" and the agents blamed as culprits (docs/multinode.md 6).
        """
        env_of = {s.pid: self._known[s.pid].rank_env or {} for s in samples if s.pid in self._known}
        parents = {s.ppid for s in samples if "RANK" in env_of.get(s.pid, {})}
        out = []
        for sample in samples:
            known = self._known.get(sample.pid)
            launcher = sample.role == "rank" and sample.pid in parents and "RANK" not in env_of[sample.pid]
            if known is not None and launcher:
                role = "main" if known.identity in self._root_identities else None
                known.role, known.rank = role, None
                sample = replace(sample, role=role, rank=None)  # noqa: PLW2901
            out.append(sample)
        return out

    def _name_at_end(self, known: _Known) -> tuple[str, str | None, str | None]:
        """Name, role and rank of a member that ended: as last seen, else by the title it set after our
        last look (its zombie's comm) or its log lines gave it."""
        name, role, rank = known.name, known.role, known.rank
        last_name = self._deaths.name_at_end(known.identity) if self._deaths is not None else None
        hint = self._hints.get(known.identity.pid)
        if hint is not None and (name in (known.first_comm, "") or (hint != name and hint.startswith(name))):
            last_name, name = hint, known.first_comm  # named by its log lines, alive or at its death
        if last_name and last_name != name and name in (known.first_comm, ""):
            # It set a title after our last look and died: name it by that (comm keeps 15 bytes of it).
            name = last_name
            role, rank = self._namer(
                name, (name,), known.identity in self._root_identities, known.rank_env or {}
            )
        return name, role, rank

    def _vanished(self, known: _Known, t: float) -> ExitRecord:
        """A member gone from /proc: its status from waitpid elsewhere, from its zombie, or unknown."""
        status = self._reaped_status(known.identity.pid)
        if status is not None:
            return self._exit_of(known, t, status, ExitHow.WAITPID)
        status = self._deaths.status_of(known.identity) if self._deaths else None
        return self._exit_of(known, t, status, ExitHow.ZOMBIE_STAT)

    def _members(self, stats: dict[int, procfs.Stat]) -> set[int]:
        children: dict[int, list[int]] = {}
        for pid, stat in stats.items():
            children.setdefault(stat.ppid, []).append(pid)
        excluded = self._exclude()
        seeds = {pid for pid in self._roots if pid in stats}
        seeds |= {pid for pid, k in self._known.items() if pid in stats and stats[pid].identity == k.identity}
        if self._adopter is not None:
            # Orphans re-parented to us (a subreaper) are ours only if born after our tree's root: in
            # one hangwatch process that supervises one tree after another (isolate's trials, bench's
            # two servers), the last tree's leftovers are adopted too, and were taken for this tree's
            # members (a trial's verdict blamed the baseline's processes, killed at its clean-up).
            births = [stats[r].identity.start_ticks for r in self._roots if r in stats]
            births += [i.start_ticks for i in self._root_identities]
            if births:
                born = min(births)
                seeds |= {c for c in children.get(self._adopter, []) if stats[c].identity.start_ticks >= born}
        members: set[int] = set()
        stack = list(seeds - excluded)
        while stack:
            pid = stack.pop()
            if pid in members or pid in excluded:  # an excluded process and everything below it
                continue
            members.add(pid)
            stack.extend(children.get(pid, ()))
        return members

    def _first_sight(self, stat: procfs.Stat, t: float) -> _Known:
        if self._deaths is not None:
            self._deaths.watch(stat.identity)
        known = _Known(
            identity=stat.identity,
            first_seen=t,
            name=stat.comm,
            role=None,
            rank=None,
            cpu_s=stat.cpu_s,
            rchar=None,
            wchar=None,
            rank_env=procfs.read_environ(stat.pid, RANK_ENV_KEYS, self._root),
            first_comm=stat.comm,
        )
        if stat.pid in self._roots:
            self._root_identities.add(stat.identity)
        self._known[stat.pid] = known
        return known

    def _sample_of(self, stat: procfs.Stat, known: _Known, listening: dict[int, int]) -> ProcessSample:
        pid = stat.pid
        cmdline = procfs.read_cmdline(pid, self._root) or ()
        if cmdline and known.argv and cmdline != known.argv:
            # It exec'd (or set its title): an exec brings a new environment, so read its ranks again. A
            # launch script's ranks are first seen as the shell before `exec python`, without the RANK
            # the exec gives them, and the count of ranks changed from run to run (issue 23). Kept when
            # the new read finds none: setproctitle overwrites the environment's area with the title.
            fresh = procfs.read_environ(pid, RANK_ENV_KEYS, self._root)
            if fresh:
                known.rank_env = fresh
        # Titles change during startup (VLLM::Worker becomes VLLM::Worker_TP1), so rename every tick.
        name = procfs.process_title(cmdline, stat.comm)
        hint = self._hints.get(pid)
        if hint is not None and ("::" not in name or (hint != name and hint.startswith(name))):
            name = hint  # not titled yet (or titled less precisely), but its log lines say who it is
        role, rank = self._namer(name, cmdline, stat.identity in self._root_identities, known.rank_env or {})
        parent = self._known.get(stat.ppid)
        if (
            role is not None
            and parent is not None
            and (parent.name, parent.role, parent.rank) == (name, role, rank)
            # ...with its parent's environment too: a torchrun worker (RANK=0) under a Slurm task
            # (SLURM_PROCID=0, both `python`) is a rank of its own (_launchers_are_not_ranks).
            and (parent.rank_env or {}) == (known.rank_env or {})
        ):
            # A child forked with its parent's title and identity (a compile helper of a scheduler) is not
            # that rank again. A launcher's children that share its plain title but carry ranks of their
            # own (RANK=0 and RANK=1 under a `python3` launcher) are the ranks.
            role, rank = None, None
        io = procfs.read_io(pid, self._root)
        io_error = None
        rchar = wchar = None
        if isinstance(io, procfs.Denied):
            io_error = io.reason
        elif io is not None:
            rchar, wchar = io
        io_delta = 0
        if rchar is not None and wchar is not None and known.rchar is not None and known.wchar is not None:
            io_delta = max(0, (rchar - known.rchar) + (wchar - known.wchar))
        cpu_delta = max(0.0, stat.cpu_s - known.cpu_s)  # 0 at first sight: known.cpu_s starts there
        known.cpu_s, known.rchar, known.wchar = stat.cpu_s, rchar, wchar
        known.name, known.role, known.rank = name, role, rank
        ports = tuple(
            sorted({port for inode, port in listening.items() if self._port_owner.get(inode) == pid})
        )
        return ProcessSample(
            pid=pid,
            ppid=stat.ppid,
            name=name,
            cmdline=self._redacted(known, cmdline),
            state=stat.state,
            cpu_s=stat.cpu_s,
            cpu_delta_s=cpu_delta,
            rchar=rchar,
            wchar=wchar,
            io_delta_bytes=io_delta,
            threads=stat.num_threads,
            rss_bytes=stat.rss_pages * procfs.PAGE_SIZE,
            listening_ports=ports,
            role=role,
            rank=rank,
            io_error=io_error,
            faults=stat.faults,
        )

    def _attribute_ports(self, listening: dict[int, int], members: set[int]) -> None:
        """Map listening sockets to member processes, scanning fds only when a new socket appears."""
        self._port_owner = {i: p for i, p in self._port_owner.items() if i in listening and p in members}
        unknown = set(listening) - set(self._port_owner)
        fresh = unknown - self._foreign
        joined = members - self._ports_scanned
        if unknown and (fresh or joined):
            # A new socket may be any member's; a new member may hold a socket seen before (inherited).
            for pid in members if fresh else joined:
                for inode in procfs.socket_inodes(pid, self._root) & unknown:
                    self._port_owner[inode] = pid
        self._foreign = unknown - set(self._port_owner)
        self._ports_scanned = set(members)

    @staticmethod
    def _redacted(known: _Known, cmdline: tuple[str, ...]) -> tuple[str, ...]:
        if cmdline != known.argv or not known.argv_redacted:
            known.argv, known.argv_redacted = cmdline, redact_argv(cmdline)
        return known.argv_redacted

    def _exit_of(
        self, known: _Known, t: float, status: int | None, how: ExitHow = ExitHow.VANISHED
    ) -> ExitRecord:
        known.exit_recorded = True
        code, sig = decode_wait_status(status) if status is not None else (None, None)
        if status is None:
            how = ExitHow.VANISHED
        name, role, rank = self._name_at_end(known)
        ended = self._deaths.ended_at(known.identity) if self._deaths is not None else None
        written = self._deaths.written_at_end(known.identity) if self._deaths is not None else None
        return ExitRecord(
            t=ended if ended is not None else t,  # the moment it ended (it may fall after the tick began)
            pid=known.identity.pid,
            name=name,
            role=role,
            rank=rank,
            how=how,
            exit_code=code,
            signal=sig,
            lifetime_s=t - known.first_seen,
            wchar_at_end=written,
            untitled=name in (known.first_comm, ""),
        )


def own_processes() -> set[int]:
    """hangwatch itself, to exclude from a tree it watches but did not start (attach, stacks): the tree of
    pid 1, of the shell that started hangwatch, of a tmux server, contains it. Excluding our pid cuts
    everything below it too: the py-spy dumpers, the guardian, any helper we start."""
    return {os.getpid()}


def whole_machine_note(pid: int) -> str | None:
    """What ``--pid 1`` means, said where it is asked for."""
    if pid != 1:
        return None
    return (
        "pid 1 is the ancestor of every process of this machine (or of this container, in one): the tree "
        "watched is all of them, hangwatch itself and its helpers excepted"
    )


KTHREADD = 2  # the parent of every kernel thread


def is_kernel_thread(pid: int, stat: procfs.Stat | None = None) -> bool:
    """kthreadd or one of its kernel threads: PF_KTHREAD, or (where the flags read 0, as some
    emulations give) no command line and kthreadd for a parent."""
    stat = stat if stat is not None else procfs.read_stat(pid)
    if pid == KTHREADD or (stat is not None and stat.kernel_thread):
        return True
    return stat is not None and stat.ppid == KTHREADD and not procfs.read_cmdline(pid)


def is_whole_machine(pid: int) -> bool:
    """The tree of ``pid`` is every process of the machine: our init (pid 1), or the init of a pid
    namespace (a container's init seen from the host: NSpid ends in 1)."""
    if pid == 1:
        return True
    nspid = procfs.read_nspid(pid)
    return len(nspid) > 1 and nspid[-1] == 1


def own_chain(stats: dict[int, procfs.Stat] | None = None) -> list[int]:
    """hangwatch itself and its ancestors, nearest first (ours, then the shell, ..., up to init)."""
    chain: list[int] = []
    pid = os.getpid()
    while pid > 0 and pid not in chain:
        stat = stats.get(pid) if stats is not None else procfs.read_stat(pid)
        if stat is None:
            break
        chain.append(pid)
        pid = stat.ppid
    return chain


def _holds_others(root: int, chain: set[int]) -> bool:
    """Whether the tree of ``root`` holds a process that is neither hangwatch's ancestor nor below
    hangwatch (its own helpers): what attach or stacks would have to watch."""
    children: dict[int, list[int]] = {}
    for pid in procfs.list_pids():  # a full scan: a child a thread other than main forked counts too
        stat = procfs.read_stat(pid)
        if stat is not None and not stat.exited:
            children.setdefault(stat.ppid, []).append(pid)
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child == os.getpid():
                continue  # hangwatch and everything below it
            if child not in chain:
                return True
            todo.append(child)
    return False


def check_target(
    target: str,
    pids: Iterable[int],
    *,
    whole_machine_flag: str | None = None,
    whole_machine: bool = False,
    stats: dict[int, procfs.Stat] | None = None,
    others_ok: bool = False,
) -> None:
    """Refuse (exit 2) a tree no command may take as its target; ``pids`` are the root named (attach,
    stacks) or every member of the tree (cleanup).

    Never a kernel thread (nothing of ours to watch, dump or signal there); never hangwatch itself or a
    process whose tree holds it (its parent shell, ...): watching it sees nothing but our own helpers,
    stopping it stops us. A whole-machine tree (init, a container's init) is every process of the
    machine, strangers included: only where the command offers a flag for it (``whole_machine_flag``)
    and it was given (``whole_machine``). ``others_ok`` (attach, stacks: they only read, and leave
    hangwatch out): an ancestor of hangwatch is a target when its tree holds other processes too (a
    batch script that started a server in the background and then ``hangwatch attach --pid $$``).
    """
    pids = set(pids)

    def which(pid: int) -> str:  # "it" where the target already says the pid ("--pid 2", "pid 2")
        return "it" if target.rsplit(" ", 1)[-1] == str(pid) else f"pid {pid}"

    for pid in sorted(pids):
        if is_kernel_thread(pid, stats.get(pid) if stats is not None else None):
            what = "kthreadd, the parent of every kernel thread" if pid == KTHREADD else "a kernel thread"
            raise UsageError(
                f"{target}: {which(pid)} is {what}; hangwatch never watches, dumps or signals kernel threads",
                "Give the pid of the server's main (launcher) process (`ps -ef` lists them).",
            )
    whole = sorted(p for p in pids if is_whole_machine(p))
    if whole:
        if whole_machine_flag is not None and whole_machine:
            return  # asked for by name: every process, hangwatch and its helpers left out (own_processes)
        offer = (
            f", or add {whole_machine_flag} for every process of the machine" if whole_machine_flag else ""
        )
        raise UsageError(
            f"{target}: refusing a tree that contains pid {whole[0]} (init): every process of the machine",
            f"Give the pid of the server's main (launcher) process (`ps -ef` lists them){offer}.",
        )
    chain = own_chain(stats)
    ours = [p for p in chain if p in pids]
    if ours and others_ok and ours[0] != os.getpid() and _holds_others(ours[0], set(chain)):
        return
    if ours:
        who = "hangwatch itself" if ours[0] == os.getpid() else "an ancestor of hangwatch (its shell, ...)"
        raise UsageError(
            f"{target}: {which(ours[0])} is {who}: its tree contains hangwatch itself",
            "Give the pid of the server's main (launcher) process, and run hangwatch from outside its tree.",
        )


def _ancestors(pid: int, root: Path) -> set[int]:
    """Our own chain up to init: the ssh session's shell has ``--match``'s pattern in its command line."""
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        stat = procfs.read_stat(pid, root)
        if stat is None:
            break
        pid = stat.ppid
    return out


# A hangwatch collector's command line, or a transport client's that starts one (``ssh NODE 'hangwatch'
# collect --match ...``, ``kubectl exec ... -- hangwatch collect``, ``srun ... python -m hangwatch collect``),
# the controller's own (``hangwatch attach --hosts ... --match``, run on one of the nodes), or a sidecar's
# (``hangwatch watch --match``): they carry the --match pattern, and are never the server.
_COLLECTOR = re.compile(r"hangwatch\S*\s+(?:collect|attach|stacks|watch)(?:\s|$)")


def is_collector(cmdline: tuple[str, ...] | list[str]) -> bool:
    return bool(_COLLECTOR.search(" ".join(cmdline)))


def matching_roots(
    pattern: re.Pattern[str] | None, root: Path = procfs.PROC, cgroup: re.Pattern[str] | None = None
) -> list[int]:
    """The roots of the trees whose command line or title matches ``pattern`` and whose cgroup path
    matches ``cgroup`` (either may be left out: a container's processes are its cgroup's, whatever they
    run): the topmost matching processes, never hangwatch itself, its own chain, its children or another
    hangwatch that carries the pattern."""
    ours = _ancestors(os.getpid(), root)
    parents: dict[int, int] = {}
    matched: set[int] = set()
    for pid in procfs.list_pids(root):
        stat = procfs.read_stat(pid, root)
        if stat is None:
            continue
        parents[pid] = stat.ppid
        if pid in ours or stat.ppid == os.getpid():
            continue
        cmdline = procfs.read_cmdline(pid, root) or ()
        if is_collector(cmdline):
            continue  # another collector (a second stream on this host), or the client that started it
        title = procfs.process_title(cmdline, stat.comm)
        if pattern is not None and not (pattern.search(title) or pattern.search(" ".join(cmdline))):
            continue
        if cgroup is not None and not any(cgroup.search(path) for path in _cgroup_paths(pid, root)):
            continue
        matched.add(pid)

    def under_another(pid: int) -> bool:
        seen = set()
        parent = parents.get(pid, 0)
        while parent > 1 and parent not in seen:
            if parent in matched:
                return True
            seen.add(parent)
            parent = parents.get(parent, 0)
        return False

    return sorted(p for p in matched if not under_another(p))


def _cgroup_paths(pid: int, root: Path) -> list[str]:
    """Every cgroup path of a process: v2's one (``0::/...``) and v1's one per hierarchy."""
    try:
        lines = (root / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return []
    return [line.split(":", 2)[2] for line in lines if line.count(":") >= 2]
