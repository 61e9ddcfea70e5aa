"""Well-formed JSON of the wrong shape (``attrs`` a string, ``seq`` null, ``phases`` a string, a dict
where a string belongs, …) or out of bounds (numbers at the edges of float and int, nesting 900 deep,
a line of megabytes): every reader reports each such record once as ``file:line`` and skips it, and
uses everything else, through every CLI verb, the live watchdog path and every renderer."""

from __future__ import annotations

import copy
import io
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from cli_fixtures import HOST, build_run
from rich.console import Console
from sglang_phasetrace.tracing.cli import main
from sglang_phasetrace.tracing.journal import bulk_decode, records, schema, writer
from sglang_phasetrace.tracing.journal import tail as journal
from sglang_phasetrace.tracing.reader.load import load_run
from sglang_phasetrace.tracing.reader.view import ProcessRec, RunView
from sglang_phasetrace.tracing.render.compare_table import ranks_table, runs_table
from sglang_phasetrace.tracing.render.html_report import render_report
from sglang_phasetrace.tracing.render.jaeger import to_jaeger
from sglang_phasetrace.tracing.render.jsonout import dumps
from sglang_phasetrace.tracing.render.lanes import layout
from sglang_phasetrace.tracing.render.otlp_json import to_otlp_json
from sglang_phasetrace.tracing.render.otlp_spans import to_sdk_spans
from sglang_phasetrace.tracing.render.perfetto import to_perfetto
from sglang_phasetrace.tracing.render.phase_stats import between_runs, within_run
from sglang_phasetrace.tracing.render.run_text import status_line, summary
from sglang_phasetrace.tracing.render.status_table import status_rows, status_table, verdict_lines
from sglang_phasetrace.tracing.render.timeline_text import render_timeline
from sglang_phasetrace.tracing.verdicts import postmortem
from sglang_phasetrace.tracing.verdicts.findings import by_process, findings

T = 1_000  # a time inside the run is not needed: a bad record is never used
SPAN = "ab" * 8
DEEP = 900  # levels: within orjson's limit (1024), beyond what a recursive walk of a record survives
NESTED = "\x00nested"  # stands for a list nested DEEP deep: written as text, never built by recursion
LONG = "\x00long"  # stands for a string of 2 MiB: its line is over the line cap (``journal.tail.LINE_MAX``)
HUGE = 2**64 * 10**380  # 400 digits: orjson refuses the line; msgspec decodes it

# Per kind: a valid record, and ways to break it (field -> wrong value; None = the field removed).
VALID: dict[str, dict[str, Any]] = {
    "process": records.process(T, 4242, 1, HOST, "r", None, {"service.name": "sglang"}),
    "identity": records.identity(T, "tp9", "rank", {"sglang.tp_rank": 9}),
    "begin": records.begin(T, SPAN, None, "f" * 32, "x", {"sglang.phase": "x"}, "MainThread"),
    "event": records.event(T, SPAN, "shard_loaded", {"done": 1, "total": 2}),
    "end": records.end(T, SPAN, "ok", {}),
    "heartbeat": records.heartbeat(
        T, 1, 4242, "tp9", False, 5.0, [{"span": SPAN, "name": "x", "phase": "x", "since_s": 1.0}], 0.1, 1, 1
    ),
    "collective": records.collective(T, "enter", "barrier", "tp:0[0,1]", 3, span=SPAN),
    "diagnosis": records.diagnosis(T, "straggler", "tp9", 4242, "x", 1.0, "m", {"tp0": "barrier"}, []),
    "warning": records.warning(T, "w"),
    "exit": records.exit(T, 4242, HOST, "tp9", None, "SIGKILL"),
    "launch": records.launch(
        T, "f" * 32, local_trace="e" * 32, launch_id=None, source="rendezvous", node_rank=1, nnodes=2, rendezvous="h:1"
    ),
}
# Numbers at the edges of float and int (the line of one with ``HUGE``, ``inf`` or ``nan`` is not JSON
# to orjson; the others parse), for a field of every bound (the schema's msgspec constraints).
EDGES = [("t", 2**63), ("t", -1), ("t", HUGE)]
BAD: dict[str, list[tuple[str, Any]]] = {
    "process": [
        ("pid", None),
        ("pid", "4242"),
        ("resource", "x"),
        ("resource", {"a": {"b": 1}}),
        ("host", {}),
        ("boot_t", "0"),
        ("t", 1.5),
        *EDGES,
        ("pid", -1),
        ("pid", 2**31),
        ("ppid", 2**64),
        ("boot_t", -(2**63) - 1),
        ("start_ticks", HUGE),
        ("resource", {"n": 2**63}),
        ("resource", {"n": NESTED}),
    ],
    "identity": [
        ("attrs", "x"),
        ("label", {}),
        ("role", ["rank"]),
        ("attrs", {"sglang.tp_rank": {}}),
        ("attrs", {"\x1b]52;c;AAAA\x07": {}}),  # a key that would write the reader's clipboard
        ("attrs", {"sglang.tp_rank": 2**63}),
        ("attrs", {"deep": NESTED}),
        ("t", float("nan")),
    ],
    "begin": [
        ("attrs", "sglang.phase=x"),
        ("span", None),
        ("span", SPAN + "\n"),  # a regex's "$" takes a newline before the end
        ("name", {}),
        ("parent", 5),
        ("thread", []),
        ("attrs", {"sglang.phase": {"a": 1}}),
        ("attrs", {"sglang.group_name": ["tp"]}),
        ("t", None),
        *EDGES,
        ("attrs", {"n": 2**63}),
        ("attrs", {"n": [1, -(2**64)]}),  # orjson: a float past -2^63
        ("attrs", {"n": HUGE}),
        ("attrs", {"n": float("inf")}),
        ("attrs", {"deep": NESTED}),
    ],
    "event": [("attrs", []), ("span", 3), ("name", {"a": 1}), *EDGES, ("attrs", {"done": 2**64}), ("attrs", NESTED)],
    "end": [
        ("status", {}),
        ("status", "weird"),
        ("attrs", "s"),
        ("error", "boom"),
        ("error", {"message": {}}),
        ("span", None),
        *EDGES,
        ("attrs", {"n": -(2**64)}),
        ("error", {"message": "m", "cause": NESTED}),  # a key the schema does not type: depth bounded
    ],
    "heartbeat": [
        ("seq", None),
        ("phases", "x"),
        ("phases", [1]),
        ("phases", [{"progress": "x"}]),
        ("phases", [{"since_s": "1"}]),
        ("collective", "barrier"),
        ("collective", {"seq": "4"}),
        ("gpu", {"util": "high"}),
        ("rss", "2GB"),
        ("ready", "yes"),
        ("cpu_s", []),
        *EDGES,
        ("seq", -1),
        ("seq", 2**63),
        ("phases", [{"since_s": 1e308}]),
        ("phases", [{"progress": {"done": 1, "total": 2**64}}]),
        ("collective", {"since_s": -1e308}),
        ("collectives", {"tp": -1}),
        ("interval_s", float("inf")),
        ("cpu_s", float("nan")),
        ("dt_s", 1e10),
        ("rss", HUGE),
        ("gpu", {"util": 2**64}),
        ("main", {"cpu_s": -1e308}),
        ("runtime_calls", {"x": NESTED}),
        ("journal_unwritten", {"since": 2**63}),
    ],
    "collective": [
        ("seq", None),
        ("edge", "sideways"),
        ("group", {}),
        ("op", 5),
        ("dur_s", "1"),
        *EDGES,
        ("seq", -1),
        ("seq", 2**64),
        ("seq", HUGE),
        ("dur_s", 1e308),
        ("dur_s", -1e308),
    ],
    "diagnosis": [
        ("message", None),
        ("stacks", "x.txt"),
        ("stacks", [{}]),
        ("waiting", ["tp0"]),
        ("pid", "1"),
        ("since_s", "85"),
        ("phase", 3),
        *EDGES,
        ("since_s", 1e308),  # stopped status, report, the exports and bundle (OverflowError)
        ("since_s", -1e308),
        ("since_s", float("inf")),
        ("pid", 2**63),
        ("pid", HUGE),
    ],
    "warning": [("message", {}), ("message", None), *EDGES],
    "exit": [("pid", None), ("signal", 9), ("code", "1"), *EDGES, ("pid", -(2**63) - 1), ("code", 2**63)],
    "launch": [
        ("trace", None),
        ("trace", "xyz"),
        ("local_trace", 5),
        ("node_rank", "1"),
        ("rendezvous", {}),
        *EDGES,
        ("node_rank", -1),
        ("nnodes", 2**64),
    ],
}


def broken(kind: str) -> list[dict[str, Any]]:
    """``VALID[kind]`` broken each way of ``BAD[kind]`` (``NESTED`` as is: see ``built`` and ``line``)."""
    out = []
    for name, value in BAD[kind]:
        record = copy.deepcopy(VALID[kind])
        if value is None:
            record.pop(name, None)
        else:
            record[name] = value
        out.append(record)
    return out


def nested(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


def built(value: Any) -> Any:
    """``value`` (a record) with each ``NESTED`` made a list ``DEEP`` deep and each ``LONG`` its string."""
    if isinstance(value, dict):
        return {k: built(v) for k, v in value.items()}
    if isinstance(value, list):
        return [built(v) for v in value]
    return nested(DEEP) if value == NESTED else "x" * (2 << 20) if value == LONG else value


def line(record: dict[str, Any], dump: Any = json.dumps) -> str:
    """``record`` as one journal line, ``NESTED`` and ``LONG`` written out (json.dumps would recurse ``DEEP`` deep)."""
    text = dump(record).replace(json.dumps(NESTED), "[" * DEEP + "]" * DEEP)
    return text.replace(json.dumps(LONG), json.dumps("x" * (2 << 20))) if json.dumps(LONG) in text else text


def test_the_valid_records_are_valid_and_each_breakage_is_named() -> None:
    assert set(VALID) == set(BAD) == schema.KINDS
    for kind, record in VALID.items():
        assert schema.validate(record) is None, kind
        for bad, (name, _) in zip(map(built, broken(kind)), BAD[kind], strict=True):
            why = schema.validate(bad)
            assert why is not None and name in why, (kind, name, why)
            assert not schema.all_valid([VALID[k] for k in VALID] * 8 + [bad]), (kind, name)  # by columns
    assert schema.validate(VALID["begin"] | {"attrs": "x"}) == "'attrs' must be an object"
    assert schema.validate(VALID["heartbeat"] | {"seq": None}) == "'seq' must not be null"
    assert (
        schema.validate(VALID["heartbeat"] | {"phases": [{"since_s": "1"}]}) == "'phases[0].since_s' must be a number"
    )


WORDED = [  # (kind, a change to its valid record, the reason): each way a type or bound is refused
    ("exit", {"pid": None}, "'pid' must not be null"),
    ("heartbeat", {"phases": [{"since_s": []}]}, "'phases[0].since_s' must be a number"),
    (
        "heartbeat",
        {"phases": [{"progress": {"a": {}}}]},
        "'phases[0].progress[\"a\"]' must be a string, a number, true/false or a list",
    ),
    ("exit", {"pid": 2**31}, "'pid' must be an integer <= 2^31-1"),
    ("exit", {"code": -(2**63) - 1}, "'code' must be an integer >= -2^63"),
    ("collective", {"dur_s": 1e10}, "'dur_s' must be a number <= 1e9"),
    ("collective", {"dur_s": 10**10}, "'dur_s' must be an integer <= 1e9"),
    ("begin", {"attrs": {"x": float("inf")}}, "'attrs[\"x\"]' must be a number < 2^63"),
    ("begin", {"attrs": {"x": float("nan")}}, "'attrs[\"x\"]' must be a number, not NaN"),
    ("begin", {"parent": "xyz"}, "'parent' must be 16 hex digits"),
    ("launch", {"trace": "0" * 31}, "'trace' must be 32 hex digits"),
    ("end", {"status": "weird"}, "'status' must be one of error, incomplete, ok"),
    ("end", {"error": {"type": 1}}, "'error.type' must be a string"),
    ("diagnosis", {"evidence": {"tp1": {"pid": 1, "t": 1, "cause": "lock"}}}, "'evidence[\"tp1\"].text' is missing"),
    (
        "diagnosis",
        {"evidence": {"tp1": {"pid": 1, "t": 1, "cause": "lock", "text": None}}},
        "'evidence[\"tp1\"].text' must be a string",
    ),
    (
        "diagnosis",
        {"evidence": {"tp1": {"pid": 1, "t": 1, "cause": "why", "text": "x"}}},
        "'evidence[\"tp1\"].cause' must be one of child, gone, lock, native, none, socket",
    ),
    (
        "diagnosis",
        {"evidence": {"tp1": {"pid": 1, "t": 1, "cause": "lock", "text": "x" * 1025}}},
        "'evidence[\"tp1\"].text' must be a string of at most 1024 characters",
    ),
    (
        "diagnosis",
        {"evidence": {str(i): {} for i in range(17)}},
        "'evidence' must be an object of at most 16 entries",
    ),
]


@pytest.mark.parametrize("kind,change,reason", WORDED)
def test_a_refusal_is_worded_from_the_schema_whatever_msgspec_says(
    kind: str, change: dict[str, Any], reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reason is read off the schema's types, never off msgspec's message (unpinned: a release
    may reword it): with every message of msgspec's replaced, the words are the same."""
    record = VALID[kind] | change
    assert schema.validate(record) == reason
    convert = msgspec.convert

    def reworded(*args: Any, **kwargs: Any) -> Any:
        try:
            return convert(*args, **kwargs)
        except msgspec.ValidationError:
            raise msgspec.ValidationError("a new release's wording") from None

    monkeypatch.setattr(msgspec, "convert", reworded)
    assert schema.validate(record) == reason


def bulk_accepts(record: dict[str, Any]) -> bool | None:
    """Whether the readers' fast path (``bulk_decode.BULK``) takes ``record`` written as our writer
    writes it; None when its line does not start as a bulk kind's (it goes ``validate``'s way)."""
    text = line(record, writer.dumps).encode()
    entry = bulk_decode.BULK.get(text[: bulk_decode.BULK_PREFIX])
    if entry is None:
        return None
    kind, decoder = entry
    try:
        return bulk_decode.bulk_valid(kind, bulk_decode.decode_lines(decoder, [text]))
    except (msgspec.DecodeError, ValueError, RecursionError):
        return False


@pytest.mark.parametrize("kind", ["begin", "end", "event", "collective"])
def test_the_fast_decoders_take_what_validate_takes_and_nothing_else(kind: str) -> None:
    assert bulk_accepts(VALID[kind]) is True
    for bad, (name, _) in zip(broken(kind), BAD[kind], strict=True):
        assert bulk_accepts(bad) in (False, None), (kind, name)
    assert bulk_accepts(VALID[kind] | {"kind": kind + "x"}) in (False, None)  # another kind, same first bytes
    if kind == "begin":  # a name only readers set is refused, however it is spelt
        for name, value in (("~end", 5), ("~status", "ok"), ("~error", {"type": "x"}), ("~events", [{}])):
            assert schema.validate(VALID[kind] | {name: value}) is None
            assert bulk_accepts(VALID[kind] | {name: value}) is False, name
        assert bulk_accepts(VALID[kind] | {"parent": None, "trace": None, "thread": None, "attrs": None}) is True


def test_the_fast_decoders_bound_numbers_where_the_schema_does() -> None:
    """At each bound of a bulk kind's numbers (the same msgspec constraints there
    as in ``validate``): the last values in, and the first out, taken and refused alike."""
    below, above = math.nextafter(-1e9, -math.inf), math.nextafter(1e9, math.inf)
    times = ([0, 2**63 - 1], [-1, 2**63])
    attrs = ([-(2**63), 2**63 - 1, -(2.0**63), math.nextafter(2.0**63, 0)], [-(2**63) - 1, 2**63, 2.0**63])
    cases: dict[tuple[str, str], tuple[list[Any], list[Any]]] = {
        **{(kind, "t"): times for kind in ("begin", "end", "event", "collective")},
        ("collective", "seq"): ([0, 2**63 - 1], [-1, 2**63]),
        ("collective", "dur_s"): ([-1e9, 1e9, -(10**9), 10**9], [below, above, -(10**9) - 1, 10**9 + 1]),
        **{(kind, "attrs"): attrs for kind in ("begin", "end", "event")},
    }
    for (kind, field), (ins, outs) in cases.items():
        for value, ok in [(v, True) for v in ins] + [(v, False) for v in outs]:
            record = copy.deepcopy(VALID[kind]) | {field: {"n": value} if field == "attrs" else value}
            assert (schema.validate(record) is None) == ok, (kind, field, value)
            assert bulk_accepts(record) == ok, (kind, field, value)


# -- every CLI verb on a run holding bad records ---------------------------------------------------------


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_run(
        tmp_path_factory.mktemp("clean") / "run", ranks=3, spans=30, stalled_rank=1, end_ns=time.time_ns() - 5 * 10**9
    ).path


def inject(run: Path, bad: list[dict[str, Any] | str], journal: str, at: int = 4) -> list[str]:
    """Insert ``bad`` (records, or lines as text) into ``journal`` after line ``at``; returns their ``file:line``."""
    path = run / "journal" / journal
    lines = path.read_text().splitlines()
    lines[at:at] = [r if isinstance(r, str) else line(r) for r in bad]
    path.write_text("\n".join(lines) + "\n")
    return [f"{path}:{n}" for n in range(at + 1, at + 1 + len(bad))]


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def verbs(run: Path, out: Path) -> dict[str, list[str]]:
    return {
        "status": ["status", str(run), "--json"],
        "status-once": ["status", str(run), "--once"],
        "timeline": ["timeline", str(run), "--width", "120", "--depth", "2"],
        "compare": ["compare", str(run), "--json"],
        "report": ["report", str(run), "-o", str(out / "r.html")],
        **{
            f"export-{f}": ["export", str(run), "--format", f, "-o", str(out / f"{f}.json")]
            for f in ("jaeger", "otlp-json", "perfetto")
        },
        "bundle": ["bundle", str(run), "-o", str(out / "b.tar.gz")],
        "watch": ["watch", str(run), "--timeout", "0.3", "--interval", "0.1", "--no-py-spy"],  # last: it writes
    }


def comparable(verb: str, text: str, run: Path) -> Any:
    """What must not change when bad records are skipped (times relative to now excluded)."""
    text = text.replace(str(run), "RUN").replace(run.name, "RUN")
    if verb == "status":
        return sorted(
            (r["label"], r["state"], r["phase"], re.sub(r"[0-9.]+ s\b", "N s", r["verdict"]))
            for r in json.loads(text)["ranks"]
        )
    if verb == "compare":
        return json.loads(text)["phases"]
    return text if verb == "timeline" else None


@pytest.mark.parametrize("kind", sorted(BAD))
def test_every_verb_skips_bad_records_once_and_uses_the_rest(
    kind: str, clean: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(clean, run)
    journal = f"{HOST}-1000.jsonl" if kind in ("diagnosis", "exit") else f"{HOST}-2000.jsonl"
    where = inject(run, broken(kind), journal)
    for (verb, argv), (_, clean_argv) in zip(verbs(run, tmp_path).items(), verbs(clean, tmp_path).items(), strict=True):
        code, out, err = cli(capsys, *argv)
        assert "Traceback" not in err and "internal error" not in err and "\x1b" not in err, (verb, err)
        for line in where:
            assert err.count(f"{line}:") == 1, (verb, line, err)
        if verb == "watch":
            assert code in (0, 3), err
            continue
        clean_code, clean_out, _ = cli(capsys, *clean_argv)
        assert code == clean_code and code in (0, 3, 4), (verb, err)
        assert comparable(verb, out, run) == comparable(verb, clean_out, clean), verb


def test_a_field_no_reader_uses_is_dropped_however_deep(
    clean: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every record of two journals carries a field the schema does not list, nested 1000 deep (a
    line of 6 KB; msgspec's decoders, which skip it recursively, stopped every verb with a
    RecursionError): the records are used as if it were not there (the bulk decoders skip it, the
    other kinds' records drop it: ``schema.trim``), and no verb, the bundle included, recurses into it."""
    run = tmp_path / "run"
    shutil.copytree(clean, run)
    for name in (f"{HOST}-1000.jsonl", f"{HOST}-2000.jsonl"):
        path = run / "journal" / name
        text = path.read_text().splitlines()
        deep = "[" * 1000 + "]" * 1000  # within orjson's limit (1024 levels)
        path.write_text("".join(f'{x[:-1]},"x":{{"y":{deep}}}}}\n' for x in text))
    assert run_problems(run) == []
    for (verb, argv), (_, clean_argv) in zip(verbs(run, tmp_path).items(), verbs(clean, tmp_path).items(), strict=True):
        code, out, err = cli(capsys, *argv)
        assert "Traceback" not in err and "internal error" not in err and "skipped" not in err, (verb, err)
        if verb == "watch":
            assert code in (0, 3), err
            continue
        clean_code, clean_out, _ = cli(capsys, *clean_argv)
        assert code == clean_code, (verb, err)
        assert comparable(verb, out, run) == comparable(verb, clean_out, clean), verb
    proc = next(p for p in load_run(run).processes if p.pid == 2000)
    assert all(set(r) <= schema.FIELDS["heartbeat"] for r in proc.heartbeats) and proc.heartbeats


def run_problems(run: Path) -> list[str]:
    return load_run(run).problems


SPARSE = """
import os, resource, sys
from sglang_phasetrace.tracing.cli import main
run, out, sparse = sys.argv[1:]
verbs = [
    ["status", run, "--json"],
    ["report", run, "-o", f"{out}/r.html"],
    *(["export", run, "--format", f, "-o", f"{out}/{f}.json"] for f in ("jaeger", "otlp-json", "perfetto")),
    ["bundle", run, "-o", f"{out}/b.tar.gz"],
]
who = (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)  # children: a split read's
codes = [main(argv) for argv in verbs]  # the high-water mark of reading the run without it
base = max(resource.getrusage(w).ru_maxrss for w in who)
with open(sparse, "wb") as f:
    f.truncate(400 << 20)  # a hole: no disk, no newline
codes += [main(argv) for argv in verbs]
print(codes, (max(resource.getrusage(w).ru_maxrss for w in who) - base) >> 10)
"""


def test_a_400_mb_sparse_journal_costs_every_verb_neither_memory_nor_its_exit(clean: Path, tmp_path: Path) -> None:
    """A 400 MB journal of zeros (sparse: 0 bytes on disk) pushed ``report`` to 1.26 GB; a 3 GB one
    was a MemoryError. Now every verb reads it a piece at a time: one line over the line cap, and
    the journal cap (made 64 MiB here: the default reads 256 MiB), each said once per verb."""
    run = tmp_path / "run"
    shutil.copytree(clean, run)
    out = tmp_path / "out"
    out.mkdir()
    sparse = run / "journal" / f"{HOST}-9999.jsonl"
    env = {**os.environ, journal.ENV_JOURNAL_MAX: "64"}
    done = subprocess.run(
        [sys.executable, "-c", SPARSE, str(run), str(out), str(sparse)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    codes, growth_mib = done.stdout.strip().splitlines()[-1].rsplit(" ", 1)  # after status's own output
    codes = json.loads(codes)
    assert codes[6:] == codes[:6] and set(codes) <= {0, 3}, (codes, done.stderr[-3000:])
    assert int(growth_mib) < 200, growth_mib  # the code before: 2000
    assert done.stderr.count(f"{sparse}:1: a line over 1 MiB (the cap on one journal line)") == 6, done.stderr
    assert done.stderr.count(f"{sparse}:1: the rest of this journal, past 64 MiB (the cap on what is read") == 6
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def test_bad_status_file_reported_once_and_the_journal_heartbeat_used(
    clean: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(clean, run)
    status = run / "status" / f"{HOST}-2000.json"
    beat = json.loads(status.read_text())
    status.write_text(json.dumps(beat | {"phases": "loading"}))
    (run / "status" / f"{HOST}-2001.json").write_text(json.dumps(VALID["warning"]))  # not a heartbeat
    (run / "status" / f"{HOST}-2002.json").write_text("{not json")
    code, out, err = cli(capsys, "status", str(run), "--json")
    clean_code, clean_out, _ = cli(capsys, "status", str(clean), "--json")
    assert code == clean_code == 3
    assert err.count(f"{status}:1: heartbeat: 'phases' must be a list") == 1, err
    assert err.count(f"{HOST}-2001.json:1: heartbeat: a warning record, not a heartbeat") == 1, err
    assert err.count(f"{HOST}-2002.json:1: not a JSON record") == 1, err
    rows = {r["label"]: r for r in json.loads(out)["ranks"]}
    assert rows["tp0"]["rss"] == 2_500_000_000  # from the journal's heartbeat
    assert comparable("status", out, run) == comparable("status", clean_out, clean)


# -- the live path: the watchdog's incremental refresh ------------------------------------------------------


def test_live_refresh_keeps_the_records_after_a_bad_one_in_the_same_chunk(tmp_path: Path) -> None:
    path = tmp_path / "run" / "journal" / "h-42.jsonl"
    path.parent.mkdir(parents=True)
    root = records.begin(1, "a" * 16, None, "f" * 32, "rank tp0", {"sglang.phase": "rank"}, "MainThread")
    path.write_text("".join(json.dumps(r) + "\n" for r in (records.process(1, 42, 1, "h", "run", 0, {}), root)))
    view = RunView(tmp_path / "run").refresh()
    assert [s.phase for s in view.processes[0].spans.values()] == ["rank"]

    chunk = [
        records.begin(2, "b" * 16, "a" * 16, "f" * 32, "kv_cache.alloc", "not an object", "MainThread"),  # line 3
        records.begin(3, "c" * 16, "a" * 16, "f" * 32, "attention.init", {"sglang.phase": "attention.init"}, "M"),
        records.heartbeat(4, None, 42, "tp0", False, 5.0, [], 0.1, 1, 1),  # line 5: seq null
        records.end(5, "c" * 16, "ok", {"sglang.backend": "torch_native"}),
    ]
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in chunk))
        f.write(json.dumps(records.end(6, "a" * 16, "ok", {}))[:20])  # a write in progress: left for later
    view.refresh()
    view.refresh()
    (proc,) = view.processes
    assert {s.phase: s.status for s in proc.spans.values()} == {"rank": "open", "attention.init": "ok"}
    assert proc.spans["c" * 16].attrs["sglang.backend"] == "torch_native"
    assert view.problems == [
        f"{path}:3: begin record: 'attrs' must be an object",
        f"{path}:5: heartbeat record: 'seq' must not be null",
    ]
    with open(path, "a") as f:
        f.write(json.dumps(records.end(6, "a" * 16, "ok", {}))[20:] + "\n")
    view.refresh(final=True)
    assert proc.ready and len(view.problems) == 2


def test_a_record_apply_cannot_use_is_named_and_the_chunk_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "run" / "journal" / "h-42.jsonl"
    path.parent.mkdir(parents=True)
    lines = [records.process(1, 42, 1, "h", "run", 0, {}), records.warning(2, "boom"), records.warning(3, "fine")]
    path.write_text("\n\n".join(json.dumps(r) for r in lines) + "\n")  # blank lines between: numbering holds
    apply = ProcessRec.apply

    def flaky(self: ProcessRec, r: dict[str, Any]) -> None:
        if r.get("message") == "boom":
            raise KeyError("a bug")
        apply(self, r)

    monkeypatch.setattr(ProcessRec, "apply", flaky)
    run = load_run(tmp_path / "run")
    assert run.processes[0].warnings == ["fine"]
    assert run.problems == [f"{path}:3: warning record not used (KeyError('a bug'))"]


def test_unreadable_journals_are_named_not_fatal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = build_run(tmp_path / "run", ranks=2, spans=10).path
    (run / "journal" / "dir.jsonl").mkdir()
    import os

    os.mkfifo(run / "journal" / "fifo.jsonl")  # would block a plain open()
    os.symlink("/etc/hostname", run / "journal" / "link.jsonl")
    code, out, err = cli(capsys, "compare", str(run), "--json")
    assert code == 0 and json.loads(out)["phases"]
    for name in ("dir", "fifo", "link"):
        assert err.count(f"{run / 'journal' / name}.jsonl: cannot read") == 1, err


# -- fuzz: random JSON in every field of valid records -------------------------------------------------------


def _value(rng: random.Random, depth: int = 0) -> Any:
    scalars = [
        None,
        True,
        False,
        0,
        -1,
        7,
        2**63 - 1,
        -(2**63),
        0.5,
        -0.0,
        1e300,
        1e308,  # the edges of float and int: bounded by the schema, or not JSON to orjson
        -1e308,
        float("inf"),
        float("nan"),
        2**63,
        2**64,
        -(2**63) - 1,
        HUGE,
        NESTED,  # 900 deep
        LONG,  # 2 MiB
        "",
        "x",
        "tp0",
        "rank",
        "\x1b]52;c;AAAA\x07",
        "ünï\n",
        "ok",
        "exit",
        "a" * 16,
    ]
    if depth >= 2 or rng.random() < 0.6:
        return rng.choice(scalars)
    if rng.random() < 0.5:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    keys = ["a", "done", "total", "progress", "sglang.phase", "message", "span", "name", "seq", "since_s"]
    return {rng.choice(keys): _value(rng, depth + 1) for _ in range(rng.randrange(3))}


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place inside a record a value could be replaced (dict keys, list items)."""
    out = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        out.append((*prefix, key))
        out += _paths(child, (*prefix, key))
    return out


def _mutate(record: dict[str, Any], rng: random.Random) -> None:
    path = rng.choice([p for p in _paths(record) if p != ("kind",)] or [("t",)])
    parent: Any = record
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and rng.random() < 0.15:
        parent.pop(path[-1], None)
    else:
        parent[path[-1]] = _value(rng)


def _render_everything(run_dir: Path) -> None:
    run = load_run(run_dir)
    lay = layout(run)
    found = findings(run, lay.end)
    verdicts = by_process(run, found)
    console = Console(file=io.StringIO(), width=120)
    for line in render_timeline(lay, width=120, depth=3):
        console.print(line)
    console.print(ranks_table(within_run(lay), "t"))
    console.print(runs_table(between_runs(lay, lay), "t"))
    rows = status_rows(lay, lay.end, verdicts, None)
    console.print(status_table(rows, "t"), *verdict_lines(rows))
    status_line(lay, verdicts)
    summary(lay, found, verdicts)
    render_report(lay, found, verdicts)
    for export in (to_jaeger, to_otlp_json, to_perfetto):
        dumps(export(lay))
    to_sdk_spans(lay)
    postmortem.findings(run, {})


def test_fuzz_random_json_in_every_field(tmp_path: Path) -> None:
    base = build_run(tmp_path / "base", ranks=2, spans=16, stalled_rank=1).path
    journals = {
        p.name: [json.loads(line) for line in p.read_text().splitlines() if line.strip().endswith("}")]
        for p in (base / "journal").iterdir()
    }
    journals[f"{HOST}-2000.jsonl"] += [
        VALID[k] | {"t": 10**18 + i} for i, k in enumerate(("collective", "warning", "event", "heartbeat"))
    ] + [
        records.collective(10**18 + 9, "exit", "barrier", "tp:0[0,1]", 3, dur_s=0.5),
        records.heartbeat(
            10**18 + 10,
            2,
            2000,
            "tp0",
            False,
            5.0,
            [
                {
                    "span": SPAN,
                    "name": "x",
                    "phase": "x",
                    "since_s": 1.0,
                    "progress": {"done": 1, "total": 4, "unit": "shards"},
                }
            ],
            0.1,
            1,
            1,
            collective={"op": "barrier", "group": "tp", "seq": 4, "since_s": 2.0},
            gpu={"util": 90, "mem_used": 10**9, "power_w": 300.5, "sm_clock_mhz": 1980},
        ),
    ]
    journals[f"{HOST}-1000.jsonl"].append(VALID["exit"] | {"pid": 2001})
    status = json.loads((base / "status" / f"{HOST}-2000.json").read_text())
    rng = random.Random(20261201)
    run = tmp_path / "run"
    shutil.copytree(base, run)
    rejected = 0
    for _ in range(150):
        mutated = copy.deepcopy(journals)
        flat = [r for rs in mutated.values() for r in rs]
        for _ in range(3):
            _mutate(rng.choice(flat), rng)
        beat = copy.deepcopy(status)
        _mutate(beat, rng)
        dump = writer.dumps if rejected % 2 else json.dumps  # as our writer writes lines, or spaced
        for name, recs in mutated.items():
            (run / "journal" / name).write_text("".join(line(r, dump) + "\n" for r in recs))
            # the fast paths never accept what validate refuses
            objects = list(map(built, recs))
            assert schema.all_valid(objects) == all(schema.validate(r) is None for r in objects)
            for r, obj in zip(recs, objects, strict=True):
                assert bulk_accepts(r) in (None, schema.validate(obj) is None), r
        (run / "status" / f"{HOST}-2000.json").write_text(line(beat))
        rejected += sum(schema.validate(built(r)) is not None for r in flat)
        _render_everything(run)
    assert rejected > 100  # the mutations did reach the validator
