"""Merging real captured stacks across ranks: prefix tree, rank ranges, equivalence classes, odd ones out."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from fixtures.stacks import loader
from hangwatch.analyse.stackframes import significant_frames
from hangwatch.analyse.stackframes import wait_point
from hangwatch.analyse.stackranks import rank_label
from hangwatch.analyse.stacktree import build_tree
from hangwatch.analyse.stacktree import equivalence_classes
from hangwatch.analyse.stacktree import unchanged_threads
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackNode
from hangwatch.model.stacks import StackSample
from hangwatch.ranges import _NUMBERED
from hangwatch.ranges import compact_ranges
from hangwatch.ranges import split_label
from hangwatch.render.stacktext import tree_lines


@pytest.mark.parametrize(
    ("labels", "text"),
    [
        (["TP0", "TP1", "TP2", "TP3", "TP4", "TP5", "TP6"], "TP0-6"),
        (["TP7", "TP0", "TP1", "TP2", "TP4"], "TP0-2,TP4,TP7"),
        (["rank1", "main[812]", "rank0", "rank3"], "rank0-1,rank3,main[812]"),
        (["DP0_TP1", "DP0_TP0"], "DP0_TP0-1"),
        (["TP1", "TP1"], "TP1"),
        ([], ""),
        # Across nodes (the merge labels ranks node:rankN): global ranks run on across one host list.
        (["hwnode1:rank0", "hwnode1:rank1", "hwnode2:rank2", "hwnode3:rank3"], "hwnode[1-3]:rank0-3"),
        (["hwnode3:rank3"], "hwnode3:rank3"),
        (
            [f"node{r // 10}:rank{r}" for r in range(10_000) if r != 1042],
            "node[0-104]:rank0-1041,node[104-999]:rank1043-9999",
        ),
        # Zero-padded host names keep their width; unpadded ones fold whatever their length.
        ([f"nid{r // 4:05d}:rank{r}" for r in range(64)], "nid[00000-00015]:rank0-63"),
        (["node9:rank0", "node10:rank1", "node11:rank2"], "node[9-11]:rank0-2"),
        (["node1:rank0", "node3:rank1"], "node[1,3]:rank0-1"),
        # Another host list, or a name without a number, starts a run of its own.
        (
            ["alpha:rank0", "alpha:rank1", "beta:rank2", "gpu-a1:rank3", "gpu-b1:rank4"],
            "alpha:rank0-1,beta:rank2,gpu-a1:rank3,gpu-b1:rank4",
        ),
        # Numbers each node gives its own processes (or two jobs): per node, as they are.
        (["n1:TP0", "n1:TP1", "n2:TP0", "n2:TP1"], "n1:TP0-1,n2:TP0-1"),
        (["n1:rank0", "n2:rank0", "n2:rank1"], "n1:rank0,n2:rank0-1"),
        # Whatever has no number stays as it is, after the runs.
        (["n1:rank0", "n2:rank1", "n1:main[9]", "launcher[3]"], "n[1-2]:rank0-1,launcher[3],n1:main[9]"),
    ],
)
def test_compact_ranges(labels, text):
    assert compact_ranges(labels) == text


@pytest.mark.parametrize("seed", range(40))
def test_the_trees_labels_are_compact_ranges_of_their_members(seed):
    # The tree and the classes compact their members' labels by their own scans: their text must be
    # compact_ranges' for any mix of nodes (numbered, padded, plain), gaps, shared numbers and roles.
    rng = random.Random(seed)
    hosts = rng.choice(
        [["n1", "n2", "n3"], ["nid007", "nid008", "nid010"], ["alpha", "beta"], ["g9", "g10", "x"]]
    )
    labels = []
    for rank in rng.sample(range(40), rng.randint(1, 30)):
        labels.append(f"{rng.choice(hosts)}:rank{rank}")
        if rng.random() < 0.1:
            labels.append(f"{rng.choice(hosts)}:rank{rank}")  # the same number on another node
    labels += [f"{rng.choice(hosts)}:main[{i}]" for i in range(rng.randint(0, 2))]
    rng.shuffle(labels)
    main = loader.samples("missing_collective")[-1].dumped[0].main_thread
    assert main is not None
    procs = tuple(
        replace(_proc(100 + i, "python", rank=label), threads=(replace(main, tid=100 + i),))
        for i, label in enumerate(labels)
    )
    tree = build_tree([StackSample(0.0, procs, 0.0)])
    expected = compact_ranges(labels)
    assert tree.roots[0].label == expected
    (cls,) = tree.classes
    assert cls.label == expected


def _proc(pid: int, name: str, rank: str | None = None, role: str | None = None) -> ProcessStacks:
    return ProcessStacks(pid, name, role, rank, DumpOutcome.OK)


def test_rank_labels_from_profile_title_or_role():
    assert rank_label(_proc(1, "VLLM::Worker_TP3", "TP3", "Worker")) == "TP3"
    assert rank_label(_proc(2, "python", "5", "rank")) == "rank5"  # RANK=5 from the environment
    assert rank_label(_proc(3, "gloo_rank2")) == "rank2"  # only the title says it
    assert rank_label(_proc(4, "dead_peer:r1")) == "rank1"
    assert rank_label(_proc(5, "python", None, "main")) == "main[5]"
    assert rank_label(_proc(6, "compile_worker_")) == "compile_worker_[6]"


def test_missing_collective_tree_marks_the_rank_elsewhere():
    tree = build_tree(loader.samples("missing_collective"))
    culprit = loader.pid_of("missing_collective", "gloo_rank2")
    assert tree.samples == 2 and tree.processes == 5 and tree.threads == 8
    assert tree.summary.startswith("rank0-1 in all_reduce > c10d::Work::wait; rank2 in rank_busy_elsewhere")
    odd = [c for c in tree.classes if c.minority]
    assert [c.pids for c in odd] == [(culprit,)]
    leaves = _leaves(tree.roots)
    reduce_leaf = next(n for n in leaves if "pthread_cond_wait" in n.name)
    assert reduce_leaf.label == "rank0-1" and reduce_leaf.unchanged == reduce_leaf.ends == 2
    marked = [n for n in _nodes(tree.roots) if n.minority]
    assert marked and all(n.pids == (culprit,) for n in marked)
    # Frames merge on the function: both rank_main lines (36 elsewhere, 39 all_reduce) in one node.
    rank_main = next(n for n in _nodes(tree.roots) if n.name == "rank_main")
    assert rank_main.lines == (36, 39) and rank_main.label == "rank0-2"


def test_graph_capture_minority_is_the_capturing_rank():
    classes = equivalence_classes(loader.samples("graph_capture")[-1].dumped)
    odd = [c for c in classes if c.minority]
    assert len(odd) == 1 and odd[0].label == "rank1"
    assert odd[0].where == "CudaGraphRunner.capture > Event.wait"
    big = classes[0]
    assert big.label == "rank0,rank2" and big.where == "barrier > c10d::Work::wait"


def test_python_only_dump_merges_the_same_way():
    tree = build_tree(loader.samples("missing_collective", "python"))
    assert tree.summary.startswith("rank0-1 in all_reduce; rank2 in rank_busy_elsewhere")


def test_glue_frames_are_dropped_native_waits_kept():
    sample = loader.samples("missing_collective")[0]
    main = next(p for p in sample.dumped if p.name == "gloo_rank0").main_thread
    assert main is not None
    names = [f.name for f in significant_frames(main)]
    assert names[0] == "<module>" and "??" not in names
    assert not any(n.startswith("pybind11") for n in names)
    assert names[-3:] == ["c10d::Work::wait", "std::condition_variable::wait", "pthread_cond_wait"]
    assert wait_point(main) == "all_reduce > c10d::Work::wait"


def test_unchanged_needs_two_samples_and_same_lines():
    samples = loader.samples("silent_compile")
    still = unchanged_threads(samples)
    burner = loader.pid_of("silent_compile", "compile_worker_")
    assert unchanged_threads(samples[:1]) == set()
    # The native dumps caught the burner's main thread at different lines: it moved.
    assert (burner, burner) not in still
    launcher = loader.load("silent_compile")["samples"][0]["processes"][0]["pid"]
    assert (launcher, launcher) in still  # the launcher sat in join() both times


def test_dead_and_stopped_processes_are_listed_not_merged():
    tree = build_tree(loader.samples("self_stop"))
    assert any("stopped" in p for p in tree.problems)
    tree = build_tree(loader.samples("dead_peer"))
    assert any("gone" in p for p in tree.problems)


def test_rendered_tree_is_compact_and_marks_the_odd_one():
    lines = tree_lines(build_tree(loader.samples("missing_collective")), width=200)
    text = "\n".join(lines)
    assert "[rank2] rank_busy_elsewhere (gloo_missing_collective.py:26)" in text
    assert "<< odd one out" in text and "[unchanged]" in text
    assert len(lines) <= 12


def test_highlight_names_the_rule_culprits_unless_everyone_is_one():
    samples = loader.samples("missing_collective")
    rank2 = loader.pid_of("missing_collective", "gloo_rank2")
    tree = build_tree(samples, highlight=[rank2])
    marked = [n for n in _nodes(tree.roots) if n.minority]
    assert marked and {n.pids for n in marked} == {(rank2,)}
    everyone = [loader.pid_of("missing_collective", f"gloo_rank{r}") for r in range(3)]
    assert not any(n.minority for n in _nodes(build_tree(samples, highlight=everyone).roots))


def test_ten_thousand_rank_stacks_merge_into_one_odd_class():
    """10,000 ranks from real stacks merge, the odd ones in one class (its speed: benchmarks/, not here)."""
    sample = loader.samples("missing_collective")[0]
    ranks = [p for p in sample.dumped if p.name.startswith("gloo_rank")]
    processes = []
    for i in range(10_000):
        src = ranks[2] if i % 97 == 5 else ranks[i % 2]
        processes.append(replace(src, pid=100_000 + i, name=f"gloo_rank{i}"))
    big = StackSample(0.0, tuple(processes), 0.0)
    tree = build_tree([big, big])
    assert tree.processes == 10_000
    odd = [c for c in tree.classes if c.minority]
    assert len(odd) == 1 and len(odd[0].pids) == 104


def _nodes(nodes: tuple[StackNode, ...]) -> list[StackNode]:
    out: list[StackNode] = []
    for n in nodes:
        out.append(n)
        out.extend(_nodes(n.children))
    return out


def _leaves(nodes: tuple[StackNode, ...]) -> list[StackNode]:
    return [n for n in _nodes(nodes) if n.ends]


def test_the_frame_cache_shares_one_computation_per_stack_and_resets_whole():
    """Equal stacks are one interned tuple, so each is computed once; ``reset`` empties both parts."""
    from hangwatch.model.stacks import FRAME_CACHE
    from hangwatch.model.stacks import Frame
    from hangwatch.model.stacks import ThreadStack
    from hangwatch.model.stacks import intern_frames

    def stack() -> list[Frame]:  # a new list of new (equal) frames each time, as py-spy's parser gives
        return [Frame("run", "serve.py", 10), Frame("all_reduce", "distributed_c10d.py", 20)]

    FRAME_CACHE.reset()
    assert FRAME_CACHE.sizes == (0, 0)
    a = ThreadStack(1, "MainThread", False, False, intern_frames(stack()))
    b = ThreadStack(2, "MainThread", False, False, intern_frames(stack()))
    assert a.frames is b.frames
    calls: list[int] = []

    def count(frames: tuple[Frame, ...]) -> int:
        calls.append(1)
        return len(frames)

    assert FRAME_CACHE.memo("test", a.frames, count) == FRAME_CACHE.memo("test", b.frames, count) == 2
    assert len(calls) == 1
    assert wait_point(a) == wait_point(b) == "all_reduce"
    assert FRAME_CACHE.sizes[0] == 1 and FRAME_CACHE.sizes[1] >= 2
    FRAME_CACHE.reset()
    assert FRAME_CACHE.sizes == (0, 0)
    assert FRAME_CACHE.memo("test", a.frames, count) == 2
    assert len(calls) == 2  # computed again after the reset
    assert intern_frames(stack()) is not a.frames  # a new tuple: the old one is no longer known


@pytest.mark.parametrize(
    "label",
    [
        "",
        "7",
        "rank",
        "rank3",
        "rank0042",
        "TP7",
        "hwn2:rank13",
        "main[812]",
        "a[1]2",
        "x\n3",
        "rank3\n",
        "rank٣",
    ],
)
def test_split_label_reads_the_trailing_number_as_its_regex_does(label):
    # split_label skips its regex on one line of ASCII: the answer must be the regex's.
    m = _NUMBERED.match(label)
    expected = (m.group(1), int(m.group(2))) if m and "[" not in label else (label, None)
    assert split_label(label) == expected


def test_class_labels_are_compact_ranges_of_their_members():
    # The classes' labels come from the prefix and number each process was split into once.
    names = ["rank3", "rank1", "rank2", "rank10", "TP0", "TP1", "launcher", "hwn1:rank4", "hwn1:rank5"]
    main = loader.samples("missing_collective")[-1].dumped[0].main_thread
    assert main is not None
    procs = [
        replace(_proc(100 + i, "python", rank=name[4:] if name[4:].isdigit() else name), threads=(main,))
        for i, name in enumerate(names)
    ]
    (cls,) = equivalence_classes(procs)
    assert cls.label == compact_ranges(rank_label(p) for p in procs)
