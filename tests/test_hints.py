"""Hints from known fixes: each pattern of ``tracing.verdicts.hints`` on a synthetic run, through the real
watchdog, whose verdict line is followed by one ``HINT (not a verdict)`` line citing its source.

Ranks sit on another host name, so the watchdog judges them from their journals alone (their pids
are made up), as ``test_diagnose`` does.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from sglang_phasetrace.tracing.journal import records
from sglang_phasetrace.tracing.reader.view import RunView
from sglang_phasetrace.tracing.verdicts import hints
from sglang_phasetrace.tracing.verdicts.diagnose import Finding, Thresholds
from sglang_phasetrace.tracing.verdicts.findings import alarms, findings
from sglang_phasetrace.tracing.verdicts.watchdog import Watchdog

S = 1_000_000_000
NOW = 1_900_000_000 * S
TH = Thresholds(heartbeat_s=5, silent_s=15, stall_s=30, no_progress_s=120, blocked_s=30, busy_s=60)
ROOT = Path(__file__).resolve().parents[1]
BARRIER_FAILURE = (
    "TP rank 1 could finish the model loading, but there are other ranks that didn't finish loading. "
    "It is likely due to unexpected failures (e.g., OOM) or a slow node."
)


class Rank:
    """One rank's journal: phases nested as given (``enter``/``leave``), collectives, an end."""

    def __init__(self, run: Path, world: int) -> None:
        self.world, self.n = world, 1
        self.path = run / "journal" / f"other-{100 + world}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.root = f"{world:x}{1:015x}"
        self.stack = [self.root]
        self.records: list[dict] = [
            {"kind": "process", "t": NOW - 300 * S, "pid": 100 + world, "host": "other", "resource": {}},
            {
                "kind": "identity",
                "t": NOW - 300 * S,
                "label": f"tp{world}",
                "role": "rank",
                "attrs": {"sglang.world_rank": world, "sglang.tp_rank": world},
            },
            {
                "kind": "begin",
                "t": NOW - 300 * S,
                "span": self.root,
                "parent": None,
                "trace": "a" * 32,
                "name": f"rank tp{world}",
                "attrs": {"sglang.phase": "rank"},
            },
        ]

    def enter(self, *names: str, ago: float) -> Rank:
        for i, name in enumerate(names):  # each nested one a little later
            self.n += 1
            span = f"{self.world:x}{self.n:015x}"
            self.records.append(
                {
                    "kind": "begin",
                    "t": NOW - int((ago - i * 0.01) * S),
                    "span": span,
                    "parent": self.stack[-1],
                    "trace": "a" * 32,
                    "name": name,
                    "attrs": {"sglang.phase": name},
                }
            )
            self.stack.append(span)
        return self

    def leave(self, ago: float, error: str | None = None) -> Rank:
        span = self.stack.pop()
        end = {"kind": "end", "t": NOW - int(ago * S), "span": span, "status": "error" if error else "ok", "attrs": {}}
        if error:
            end["error"] = {"type": "ValueError", "message": error}
        self.records.append(end)
        return self

    def fail(self, ago: float, error: str) -> Rank:
        while self.stack:
            self.leave(ago, error)
        return self

    def waits(self, op: str, seq: int, ago: float) -> Rank:
        self.records.append(
            {
                "kind": "collective",
                "t": NOW - int(ago * S),
                "edge": "enter",
                "op": op,
                "group": "tp:0[0,1,2]",
                "seq": seq,
            }
        )
        return self

    def write(self, beat_ago: float = 1) -> Rank:
        self.records.append({"kind": "heartbeat", "t": NOW - int(beat_ago * S), "seq": 1, "phases": []})
        self.records.sort(key=lambda r: r["t"])
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.records))
        return self


def process_journal(run: Path, pid: int, label: str, role: str, *later: dict) -> None:
    """A non-rank process's journal (a launcher, a watcher): its opening records, then ``later``."""
    opening = [
        {"kind": "process", "t": NOW - 300 * S, "pid": pid, "host": "other", "resource": {}},
        {"kind": "identity", "t": NOW - 300 * S, "label": label, "role": role, "attrs": {}},
    ]
    (run / "journal" / f"other-{pid}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*opening, *later]))


def watch(run: Path) -> list[str]:
    out = io.StringIO()
    Watchdog(run, TH, out=out, py_spy=False).step(NOW)
    return out.getvalue().splitlines()


def stalled_in(run: Path, *phases: str) -> list[str]:
    """tp0 and tp1 wait in a barrier inside ``phases`` that tp2, in the same phases, never entered."""
    for world in range(3):
        rank = Rank(run, world).enter(*phases, ago=100)
        if world < 2:
            rank.waits("barrier", 1, 90)
        rank.write()
    return watch(run)


def hint_after_verdict(lines: list[str], pattern: str) -> str:
    """The one hint line, right after a verdict line, and the one it names."""
    said = [i for i, line in enumerate(lines) if "HINT" in line]
    assert len(said) == 1, lines
    i = said[0]
    assert i > 0 and not lines[i - 1].startswith("sglang-phasetrace: HINT"), "after a verdict line"
    assert lines[i].startswith("sglang-phasetrace: HINT (not a verdict) ")
    expected = next(p for p in hints.HINTS if p.name == pattern)
    assert lines[i].endswith(f"[source: {expected.source}]") and expected.hint in lines[i]
    return lines[i - 1]


def test_custom_all_reduce_setup_hang(tmp_path: Path) -> None:
    verdict = hint_after_verdict(stalled_in(tmp_path, "dist.init", "dist.custom_all_reduce"), "custom_all_reduce")
    assert verdict.startswith("sglang-phasetrace: STALL rank tp2") and "dist.custom_all_reduce" in verdict
    assert "--disable-custom-all-reduce" in next(h.hint for h in hints.HINTS if h.name == "custom_all_reduce")


def test_cuda_graph_capture_hang(tmp_path: Path) -> None:
    lines = stalled_in(tmp_path, "scheduler.init_cuda_graphs", "graph.init", "graph.capture", "graph.capture_shape")
    assert "STALL rank tp2" in hint_after_verdict(lines, "graph_capture")


def test_eagle_draft_graph_capture_wins_over_graph_capture_in_general(tmp_path: Path) -> None:
    lines = stalled_in(
        tmp_path, "eagle.draft_graphs", "eagle.draft_graph_runner", "graph.capture", "graph.capture_shape"
    )
    hint_after_verdict(lines, "eagle_draft_graph")
    assert "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1" in next(line for line in lines if "HINT" in line)


def test_rendezvous_stall_in_init_process_group(tmp_path: Path) -> None:
    for world in range(3):  # the peers got through init_process_group; tp2 never came out of it
        rank = Rank(tmp_path, world).enter("dist.init", "dist.init_process_group", ago=100)
        if world < 2:
            rank.leave(95).enter("dist.group_coordinator", ago=94)
        rank.write()
    assert "STALL rank tp2" in hint_after_verdict(watch(tmp_path), "rendezvous")


def test_straggler_in_weight_loading_names_the_post_load_barrier(tmp_path: Path) -> None:
    for world in range(3):
        rank = Rank(tmp_path, world).enter("model_runner.init", "model.load_weights", "model.loader", ago=200)
        if world < 2:
            rank.leave(150).leave(150).enter("kv_cache.alloc", ago=149)
        rank.write()
    line = next(line for line in watch(tmp_path) if "HINT" in line)
    assert "480 s" in line and "UNBALANCED_MODEL_LOADING_TIMEOUT_S" in line
    hint_after_verdict(watch(tmp_path), "slow_load_straggler")


def test_failed_at_the_post_load_barrier(tmp_path: Path) -> None:
    Rank(tmp_path, 1).enter("model_runner.init", "model.load_weights", ago=600).fail(100, BARRIER_FAILURE).write()
    verdict = hint_after_verdict(watch(tmp_path), "unbalanced_load_barrier")
    assert verdict.startswith("sglang-phasetrace: FAILED rank tp1") and "could finish the model loading" in verdict


def test_sigkill_in_weight_loading_hints_at_the_oom_killer_and_its_consequence_gets_none(tmp_path: Path) -> None:
    Rank(tmp_path, 0).enter("model_runner.init", "model.load_weights", "model.loader", ago=60).write(beat_ago=7)
    Rank(tmp_path, 1).enter("model_runner.init", "model.load_weights", ago=60).fail(5, BARRIER_FAILURE).write()
    process_journal(
        tmp_path,
        99,
        "launcher",
        "launcher",
        {
            "kind": "exit",
            "t": NOW - 6 * S,
            "pid": 100,
            "host": "other",
            "label": "tp0",
            "code": None,
            "signal": "SIGKILL",
        },
    )
    lines = watch(tmp_path)
    assert lines[0].startswith("sglang-phasetrace: DIED rank tp0") and "SIGKILL" in lines[0]
    assert lines[1].startswith("sglang-phasetrace: HINT (not a verdict) SIGKILL while loading weights")
    assert lines[2].startswith("sglang-phasetrace: FAILED rank tp1") and "a consequence of tp0" in lines[2]
    assert [line for line in lines if "HINT" in line] == [lines[1]], "no hint after a consequence"
    hint_after_verdict(lines, "oom_kill_in_load")


def test_a_rank_killed_in_sglangs_teardown_follows_the_failure_that_set_it_off(tmp_path: Path) -> None:
    """tp0 blocks in a collective (last heard 2 s ago), tp1 fails 1 s ago, SGLang's teardown SIGKILLs
    tp0: its launcher saw it running as the teardown began, so the failure is the root cause."""
    Rank(tmp_path, 0).enter("eagle.set_embed_and_head", ago=30).write(beat_ago=2)
    Rank(tmp_path, 1).enter("eagle.draft_attention_init", ago=1.2).fail(1, "EAGLE is not supported").write(beat_ago=3)
    teardown = {
        "kind": "begin",
        "t": NOW - int(0.9 * S),
        "span": "9" * 16,
        "parent": None,
        "trace": "a" * 32,
        "name": "launch.teardown",
        "attrs": {"sglang.phase": "launch.teardown", "phasetrace.alive_pids": [100, 101]},
    }
    killed = {"kind": "exit", "t": NOW - S // 2, "pid": 100, "host": "other", "label": "tp0", "signal": "SIGKILL"}
    process_journal(tmp_path, 99, "launcher", "launcher", teardown, killed)
    lines = [line for line in watch(tmp_path) if "HINT" not in line]
    assert lines[0].startswith("sglang-phasetrace: FAILED rank tp1"), lines
    assert lines[1].startswith("sglang-phasetrace: DIED rank tp0") and "a consequence of tp1's failure" in lines[1]
    # a watcher recorded tp0's death after 30 s in its phase: the death is still not older than the failure
    died = records.diagnosis(NOW - S // 3, "died", "tp0", 100, "eagle.set_embed_and_head", 30.0, "gone", {}, [])
    process_journal(tmp_path, 98, "phasetrace-run", "watchdog", died)
    assert [f.label for f in alarms(findings(RunView(tmp_path).refresh(), NOW))] == ["tp1", "tp0"]


def test_no_hint_for_unrelated_phases_or_notices(tmp_path: Path) -> None:
    assert not any("HINT" in line for line in stalled_in(tmp_path, "attention.init"))
    busy = Finding("busy", "tp2", 102, "graph.capture", 70.0, "rank tp2 is busy in 'graph.capture' for 70 s")
    slow = Finding("slow", "tp2", 102, "model.loader", 70.0, "rank tp2 is slow in 'model.loader'")
    assert hints.for_finding(busy) == [] and hints.for_finding(slow) == []


def test_a_hint_is_said_once_per_watch_not_once_per_rank(tmp_path: Path) -> None:
    Rank(tmp_path, 0).write()
    out = io.StringIO()
    dog = Watchdog(tmp_path, TH, out=out, py_spy=False)
    for label in ("tp1", "tp2"):
        dog.act(Finding("straggler", label, 0, "graph.capture_shape", 40.0, f"rank {label} stalled"))
    assert sum("HINT" in line for line in out.getvalue().splitlines()) == 1


@pytest.mark.parametrize("pattern", hints.HINTS, ids=lambda p: p.name)
def test_every_pattern_is_in_the_docs_with_its_source(pattern: hints.Pattern) -> None:
    docs = (ROOT / "docs" / "hints.md").read_text()
    row = next((line for line in docs.splitlines() if f"`{pattern.name}`" in line), None)
    assert row is not None, f"docs/hints.md has no row for {pattern.name}"
    for ref in pattern.source.replace("sgl-project/sglang", "").split(","):
        assert ref.strip() in row


def test_phases_around_reads_the_named_ranks_enclosing_phases(tmp_path: Path) -> None:
    Rank(tmp_path, 0).enter("eagle.draft_graphs", "graph.capture", ago=50).write()
    run = RunView(tmp_path).refresh(final=True)
    finding = Finding("straggler", "tp0", 100, "graph.capture", 50.0, "x")
    assert hints.phases_around(finding, run) == {"rank", "eagle.draft_graphs", "graph.capture"}
    assert hints.phases_around(finding, None) == {"graph.capture"}
