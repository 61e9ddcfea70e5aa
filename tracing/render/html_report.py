"""One self-contained HTML report of a run: verdict, stall diagnosis with stacks, per-rank
timeline, compare table. No network: styles and script are inline, the data is embedded JSON.

Its first line is the verdict, in the watchdog's words (``STALL rank tp1 (pid …) is blocked in
'x' for 34 s (…): tp0 waits in barrier #3 …``); the diagnosis under it shows each named rank's
stack dump, open, and a failed phase without a recorded traceback shows the rank's dump instead.

The verdict, diagnosis, errors and table are plain HTML (readable with scripts off); the timeline
lanes are drawn by a small inline script from the embedded data, so a 1000-rank run stays a
few MB instead of one element per span in the file.

The journals are untrusted input: stack files are embedded only from ``RUN_DIR/stacks/`` (regular
files, no links, size-capped), every embedded text is redacted, and the embedded JSON cannot end
its ``<script>`` element (``<`` is written ``\\u003c``).
"""

from __future__ import annotations

import html
import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from string import Template
from typing import Any

from ..journal.layout import STACKS_DIR
from ..reader.ended import Ended
from ..reader.forked_helper import job
from ..redact import redact_text
from ..verdicts import evidence
from ..verdicts.diagnose import Finding
from .jsonout import dumps
from .lane_jobs import lanes_map
from .lanes import Bar, Lane, Layout, unreadable_text
from .phase_stats import PhaseStat, within_run
from .units import duration
from .verdict import headline, state, word

MAX_VALUE = 240  # characters of an attribute value shown on hover
MAX_STACK = 256 * 1024  # bytes of one stack file embedded (its latest dumps: the end of the file)
TABLE_ROWS = 40
OPEN, ERROR, INCOMPLETE, SLOWEST = 1, 2, 4, 8


def _short(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_VALUE:
        return value[:MAX_VALUE] + f"… ({len(value)} chars)"
    if isinstance(value, (list, tuple, dict)):
        return _short(json.dumps(value, default=str))
    return value


class _Table:
    """Interns repeated values (phase keys, names, attribute sets) into index tables."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.index: dict[Any, int] = {}

    def add(self, key: Any, make: Callable[[], Any] | None = None) -> int:
        """The index of ``key``; a new entry is ``make()`` (default: the key itself)."""
        i = self.index.get(key)
        if i is None:
            i = self.index[key] = len(self.items)
            self.items.append(key if make is None else make())
        return i


def _attrs_key(attrs: dict[str, Any]) -> Any:
    try:
        key = tuple(attrs.items())
        hash(key)
        return key
    except TypeError:
        return json.dumps(attrs, sort_keys=True, default=str)


def timeline_data(lay: Layout, stats: dict[str, PhaseStat], verdicts: dict[int, Finding]) -> bytes:
    """The timeline's data as JSON: phase keys, names and attribute sets interned into tables in
    order of first appearance, and each lane's bars as index rows. Made in two passes over each
    lane's bars where they are (``lanes_map``): their distinct values, then their rows."""
    keys, names, attrs = _Table(), _Table(), _Table()
    for lane_keys, lane_names, lane_attrs in lanes_map(lay, lane_values):
        for key in lane_keys:
            keys.add(key)
        for name in lane_names:
            names.add(name)
        for attrs_key, shown in lane_attrs:
            attrs.add(attrs_key, lambda shown=shown: shown)
    slowest = {k: s.slowest for k, s in stats.items() if len(s.per_rank) > 1 and s.skew > 0}
    rows = lanes_map(lay, lane_rows, (lay.start, slowest, keys.index, names.index, attrs.index))
    lanes = []
    for lane, bars in zip(lay.lanes, rows, strict=True):
        finding = verdicts.get(lane.proc.pid)
        where = lane.where
        head = {
            "label": lane.label,
            "pid": lane.proc.pid,
            "host": lane.proc.host,
            "state": state(finding) if finding else lane.state,
            "where": where.key if where else None,
            "where_ms": round(lay.rel(where.span.start) * 1e3, 3) if where else None,
            "verdict": f"{finding.kind}: {finding.message}"
            if finding
            else unreadable_text(lane.proc)
            if lane.proc.unreadable is not None
            else None,
        }
        lanes.append(dumps(head)[:-1] + b',"bars":' + bars + b"}")  # ``dumps`` of it with its bars last
    return b"".join(
        (
            b'{"total_ms":' + dumps(round(lay.seconds * 1e3, 3)),
            b',"keys":' + dumps(keys.items),
            b',"names":' + dumps(names.items),
            b',"attrs":' + dumps(attrs.items),
            b',"lanes":[' + b",".join(lanes) + b"]}",
        )
    )


def _shown(bar: Bar) -> dict[str, Any]:
    """The attributes a bar's tooltip shows: its span's, and its error's type and message."""
    s = bar.span
    if not s.error:
        return s.attrs
    return {**s.attrs, "error": f"{s.error.get('type') or ''} {s.error.get('message') or ''}".strip()}


@job
def lane_values(lane: Lane, _: Any = None) -> tuple[list[str], list[str], list[tuple[Any, dict[str, Any]]]]:
    """The distinct phase keys, names and (attribute set, as shown) of ``lane``'s bars, in order of
    first appearance (``lanes_map``: in the process holding them)."""
    keys: dict[str, None] = {}
    names: dict[str, None] = {}
    attrs: dict[Any, dict[str, Any]] = {}
    seen: set[int] = set()  # ``Bar.attrs_id``s done
    for bar in lane.bars:
        keys.setdefault(bar.key)
        names.setdefault(bar.span.name)
        if bar.attrs_id >= 0 and not bar.span.error:
            if bar.attrs_id in seen:
                continue
            seen.add(bar.attrs_id)
        key, short = _tooltip(bar)
        attrs.setdefault(key, short)
    return list(keys), list(names), list(attrs.items())


def _tooltip(bar: Bar) -> tuple[Any, dict[str, Any]]:
    """(``_attrs_key``, values shortened) of what a bar's tooltip shows (``_shown``): made once per
    ``Bar.attrs_id`` (ranks share them) where no error adds to it."""
    cached = bar.attrs_id >= 0 and not bar.span.error
    hit = _TOOLTIPS.get(bar.attrs_id) if cached else None
    if hit is None:
        shown = _shown(bar)
        hit = (_attrs_key(shown), {k: _short(v) for k, v in shown.items()})
        if cached:
            if len(_TOOLTIPS) > 100_000:
                _TOOLTIPS.clear()
            _TOOLTIPS[bar.attrs_id] = hit
    return hit


_TOOLTIPS: dict[int, tuple[Any, dict[str, Any]]] = {}  # ``Bar.attrs_id`` (never reused) -> ``_tooltip``


@job
def lane_rows(lane: Lane, arg: tuple) -> bytes:
    """``lane``'s bars as JSON rows ``[start µs, duration µs, depth, key, name, attrs, flags]``, indexed
    into the run's tables (``lanes_map``: in the process holding them)."""
    start, slowest, key_index, name_index, attr_index = arg
    label = lane.label
    status_flags = {"error": ERROR, "incomplete": INCOMPLETE}
    by_id: dict[int, int] = {}  # ``Bar.attrs_id`` -> index in the attrs table
    rows = []
    for bar in lane.bars:
        s = bar.span
        flags = status_flags.get(s.status, 0)
        if s.end is None:
            flags |= OPEN
        if slowest.get(bar.key) == label:
            flags |= SLOWEST
        a = by_id.get(bar.attrs_id) if not s.error else None  # equal attrs: one id (``Bar.attrs_id``)
        if a is None:
            a = attr_index[_tooltip(bar)[0]]
            if not s.error and bar.attrs_id >= 0:
                by_id[bar.attrs_id] = a
        rows.append(
            [
                (s.start - start) // 1000,
                (bar.end - s.start) // 1000,
                bar.depth,
                key_index[bar.key],
                name_index[s.name],
                a,
                flags,
            ]
        )
    return dumps(rows)


_STACK_NAME = re.compile(r"^(?P<host>.+)-(?P<pid>[0-9]+)(?:-py-spy-[0-9]+)?$")  # <host>-<pid>[-py-spy-<time>]


def stack_files(lay: Layout, found: list[Finding]) -> list[tuple[str, Path]]:
    """(rank label, path) of stack dumps: those findings name, then RUN_DIR/stacks/* by host and pid
    (``<host>-<pid>.txt``, ``<host>-<pid>-py-spy-<time>.txt``), newest first per rank.

    A finding's name is looked up by its file name in RUN_DIR/stacks/ only (``/etc/passwd`` and
    ``../../token`` are never read; a run directory moved elsewhere still finds its own dumps). With
    several run directories (one per node), in the one that holds it, and every one's dumps are listed.
    Files are named by lane label (``tp9@node-1`` in a multi-node launch)."""
    by_id = {(lane.proc.host, lane.proc.pid): lane.label for lane in lay.lanes}
    by_pid = {lane.proc.pid: lane.label for lane in lay.lanes}
    out: dict[Path, str] = {}
    dirs = [run_path / STACKS_DIR for run_path in lay.run.paths]
    for f in found:
        for name in f.stacks if isinstance(f.stacks, (list, tuple)) else ():
            base = os.path.basename(str(name))
            if base not in ("", ".", ".."):
                held = [d / base for d in dirs[1:] if (d / base).is_file()]
                out.setdefault(held[0] if held else dirs[0] / base, lane_label(lay, f.label))
    for stacks in dirs:
        listed = sorted(stacks.glob("*.txt")) if stacks.is_dir() and not stacks.is_symlink() else []
        for path in sorted(listed, key=_mtime, reverse=True):
            m = _STACK_NAME.match(path.stem)
            label = (by_id.get((m["host"], int(m["pid"]))) or by_pid.get(int(m["pid"])) if m else None) or path.stem
            out.setdefault(path, label)
    return [(label, path) for path, label in out.items()]


def lane_label(lay: Layout, label: str) -> str:
    """A process label (as findings name it: ``tp9``) as its lane shows it (``tp9@node-1``)."""
    return next((lane.label for lane in lay.lanes if lane.proc.label == label), label)


def _read(lay: Layout, path: Path) -> str | None:
    """``read_stack`` in the run directory whose stacks/ holds ``path`` (None outside all of them)."""
    for run_path in lay.run.paths:
        if path.parent == run_path / STACKS_DIR:
            return read_stack(run_path, path)
    return None


def _mtime(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:
        return 0.0


def rank_stack(lay: Layout, files: list[tuple[str, Path]], label: str) -> tuple[Path, str] | None:
    """The first non-empty stack dump of ``label`` (the one its finding names, else the newest)."""
    for name, path in files:
        if name == label:
            text = _read(lay, path)
            if text and text.strip():
                return path, text
    return None


def read_stack(run_path: Path, path: Path) -> str | None:
    """The end of a stack file inside RUN_DIR/stacks/, redacted; None for anything else (a link, a
    device, a directory, a path that resolves outside)."""
    stacks = run_path / STACKS_DIR
    try:
        if stacks.is_symlink() or os.path.realpath(path.parent) != os.path.realpath(stacks):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        skipped = max(0, info.st_size - MAX_STACK)
        if skipped:
            os.lseek(fd, skipped, os.SEEK_SET)
        chunks, left = [], MAX_STACK
        while left > 0 and (chunk := os.read(fd, min(left, 65536))):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    text = b"".join(chunks).decode("utf-8", errors="replace")
    if skipped:
        text = f"[truncated: the first {skipped} bytes are not shown]\n" + text
    return redact_text(text, limit=None)  # the whole (capped) stack file: MAX_STACK bounds it


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _stack_html(label: str, path: Path, text: str, opened: bool) -> str:
    return (
        f'<details class="stack"{" open" if opened else ""} data-rank="{_esc(label)}"><summary>'
        f"stacks of {_esc(label)} <code>{_esc(path)}</code></summary><pre>{_esc(text)}</pre></details>"
    )


def _diagnosis_html(lay: Layout, found: list[Finding], files: list[tuple[str, Path]], shown: set[Path]) -> str:
    """Each verdict (root cause first) with the waiting peers and the named rank's stack, open."""
    parts = []
    for f in found:
        waiting = "".join(f"<tr><td>{_esc(k)}</td><td>{_esc(v)}</td></tr>" for k, v in f.waiting.items())
        stack = rank_stack(lay, files, lane_label(lay, f.label)) if f.label and f.kind != "failed" else None
        if stack is not None:
            shown.add(stack[0])
        where = f"in <code>{_esc(f.phase)}</code> " if f.phase else ""
        table = f'<table class="waiting"><tr><th>peer</th><th>waits in</th></tr>{waiting}</table>' if waiting else ""
        table += _evidence_html(f)
        parts.append(f"""<div class="finding" data-rank="{_esc(f.label)}" data-kind="{_esc(f.kind)}">
<h3>{_esc(word(f))}: {_esc(f.label)} {where}for {_esc(duration(f.since_s))}</h3>
<p>{_esc(redact_text(f.message))}</p>{table}{_stack_html(f.label, *stack, True) if stack else ""}</div>""")
    return "\n".join(parts)


def _evidence_html(f: Finding) -> str:
    """What each rank the verdict names waits on, as the OS showed it: one row per rank, its parts
    (``evidence.attributes``) under the phrase."""
    rows = []
    for label, value in f.evidence.items():
        ev = evidence.from_builtins(value)
        if ev is None or not ev.text:
            continue
        parts = {k.removeprefix(evidence.ATTR + "."): v for k, v in evidence.attributes(ev).items()}
        parts.pop(evidence.ATTR, None)
        details = "; ".join(f"{_esc(k)}: <code>{_esc(redact_text(str(v)))}</code>" for k, v in parts.items())
        rows.append(f"<tr><td>{_esc(label)}</td><td>{_esc(redact_text(ev.text))}<br><small>{details}</small></td></tr>")
    if not rows:
        return ""
    return f'<table class="evidence"><tr><th>rank</th><th>waits on</th></tr>{"".join(rows)}</table>'


def _stacks_html(lay: Layout, found: list[Finding], files: list[tuple[str, Path]], shown: set[Path]) -> str:
    """The other non-empty stack dumps (the diagnosis shows the named ranks'); open when there is a
    stall to explain."""
    parts = []
    for label, path in files:
        if path in shown:
            continue
        text = _read(lay, path)
        if text is None or not text.strip():
            continue
        parts.append(_stack_html(label, path, text, bool(found)))
    return "\n".join(parts)


def _errors_html(lay: Layout, files: list[tuple[str, Path]]) -> str:
    rows: list[str] = []
    for lane in sorted(lay.lanes, key=lambda lane: lane.proc.role != "rank"):  # ranks first: the cause
        where = lane.where
        if where is None or where.open or not where.span.error:
            continue
        e = where.span.error
        opened = " open" if not rows else ""
        stack = e.get("stack")
        if not stack:  # no traceback (ended by a signal, an exit): the rank's stack dump, where one was taken
            dump = rank_stack(lay, files, lane.label)
            stack = f"(no traceback recorded; stack dump {dump[0]})\n{dump[1]}" if dump else "(no stack recorded)"
        rows.append(f"""<details class="error"{opened} data-rank="{_esc(lane.label)}"><summary><b>{_esc(lane.label)}</b>
{_esc(lane.state)} in <code>{_esc(where.key)}</code>: {_esc(e.get("type") or "")} {_esc(e.get("message") or "")}
</summary><pre>{_esc(stack)}</pre></details>""")
    return "\n".join(rows)


def _compare_html(stats: list[PhaseStat]) -> str:
    def row(s: PhaseStat) -> str:
        several = len(s.per_rank) > 1
        opened = " (open)" if s.open else ""
        cells = (
            s.key + (f" x{s.count}" if s.count > 1 else ""),
            len(s.per_rank),
            duration(s.min),
            duration(s.median),
            duration(s.max) + opened,
            duration(s.skew) if several else "",
            s.slowest if several else "",
            s.fastest if several else "",
        )
        return "<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in cells) + "</tr>"

    head = "".join(f"<th>{h}</th>" for h in ("phase", "ranks", "min", "median", "max", "skew", "slowest", "fastest"))
    shown = "".join(row(s) for s in stats[:TABLE_ROWS])
    rest = "".join(row(s) for s in stats[TABLE_ROWS:])
    more = (
        (
            f'<tbody class="more"><tr><td colspan="8"><details><summary>{len(stats) - TABLE_ROWS} more phases'
            f"</summary><table>{rest}</table></details></td></tr></tbody>"
        )
        if rest
        else ""
    )
    return f'<table class="compare"><thead><tr>{head}</tr></thead><tbody>{shown}</tbody>{more}</table>'


def _problems_html(lay: Layout) -> str:
    items = [f"<li><code>{_esc(p)}</code></li>" for p in lay.run.problems]
    items += [f"<li>{_esc(lane.label)}: {_esc(redact_text(w))}</li>" for lane in lay.lanes for w in lane.proc.warnings]
    return f"<ul>{''.join(items)}</ul>" if items else "<p>none</p>"


def render_report(
    lay: Layout, found: list[Finding], verdicts: dict[int, Finding], ended: Ended | None = None, history: str = ""
) -> str:
    """The page; ``ended``: the launch served and has ended since (``reader.ended.of_run``); ``history``:
    its "Against its history" section (``history_html.section``), if any."""
    stats = within_run(lay)
    verdict_class, verdict = headline(lay, found, ended)
    data = timeline_data(lay, {s.key: s for s in stats}, verdicts)
    version = next(
        (p.resource.get("sglang.version") for p in lay.run.processes if p.resource.get("sglang.version")), ""
    )
    files = stack_files(lay, found)
    shown: set[Path] = set()
    diagnosis = _diagnosis_html(lay, found, files, shown)
    stacks = _stacks_html(lay, found, files, shown)
    errors = _errors_html(lay, files)
    named = [f for f in found if f.alarm]
    first = f"{word(named[0])} {named[0].label}".strip() if named else verdict.split(" ", 1)[0]
    return PAGE.substitute(
        title=_esc(f"{first} — phasetrace {lay.run.run_id}"),
        run=_esc(lay.run.run_id),
        path=_esc(", ".join(map(str, lay.run.paths))),
        version=_esc(version or "?"),
        processes=len(lay.lanes),
        total=_esc(duration(lay.seconds)),
        verdict_class=verdict_class,
        verdict=_esc(verdict),
        diagnosis=f'<section id="diagnosis"><h2>Diagnosis</h2>{diagnosis}</section>' if diagnosis else "",
        errors=f'<section id="errors"><h2>Errors</h2>{errors}</section>' if errors else "",
        stacks=f'<section id="stacks"><h2>Stack dumps</h2>{stacks}</section>' if stacks else "",
        compare=_compare_html(stats),
        history=history,
        problems=_problems_html(lay),
        data=script_json(data),
    )


def script_json(data: Any) -> str:
    """JSON to embed in a ``<script>`` element: ``<`` (``</script``, ``<!--``) written as ``\\u003c``,
    which only occurs inside JSON strings, where it means the same character. ``data``: a value, or
    its JSON text."""
    text = data if isinstance(data, bytes) else dumps(data)
    return text.decode("utf-8").replace("<", "\\u003c")


PAGE = Template("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>$title</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:13px/1.4 system-ui,-apple-system,Segoe UI,sans-serif;margin:16px;color:#1d232a;min-width:900px}
h1{font-size:18px;margin:0 0 4px}h2{font-size:15px;margin:22px 0 8px;border-bottom:1px solid #ddd}
code,pre{font:12px ui-monospace,Menlo,Consolas,monospace}
pre{background:#f6f8fa;padding:8px;overflow:auto;max-height:420px}
.meta{color:#57606a}.verdict{padding:10px 12px;border-radius:6px;font-weight:600;margin:0 0 10px;font-size:15px}
.verdict.ready{background:#dafbe1}.verdict.running{background:#fff8c5}.verdict.ended{background:#eaeef2}
.verdict.stalled,.verdict.failed{background:#ffebe9;color:#82071e;border:1px solid #cf222e}
.finding{border-left:4px solid #cf222e;padding:2px 10px;margin:8px 0}.finding h3{font-size:14px;margin:4px 0}
table{border-collapse:collapse}td,th{padding:2px 10px;text-align:right;white-space:nowrap}
td:first-child,th:first-child{text-align:left}tr:nth-child(even) td{background:#f6f8fa}
#axis{position:relative;height:18px;margin-left:190px;border-bottom:1px solid #999}
#axis span{position:absolute;font-size:11px;color:#57606a;border-left:1px solid #999;padding-left:2px}
.lane{display:flex;border-bottom:1px solid #eee;min-height:18px}
.lane .label{width:182px;flex:none;padding:2px 8px 2px 0;font-weight:600;overflow:hidden;text-overflow:ellipsis}
.lane .label small{display:block;font-weight:400;color:#57606a}
.lane .track{position:relative;flex:1}
.lane.stalled,.lane.failed,.lane.incomplete,.lane.gone,.lane.died{background:#ffebe9}
.lane.stalled .label,.lane.failed .label,.lane.died .label{color:#cf222e}
.finding[data-kind=busy],.finding[data-kind=slow]{border-left-color:#bf8700}
.bar{position:absolute;height:12px;min-width:1px;border-radius:2px;font-size:10px;line-height:12px;color:#111;
 overflow:hidden;white-space:nowrap;box-sizing:border-box;cursor:default}
.bar:hover{outline:2px solid #0969da;z-index:2}
.bar.open{background-image:repeating-linear-gradient(45deg,rgba(255,255,255,.55) 0 4px,transparent 4px 8px)!important;
 border-right:3px dashed #cf222e}
.bar.err{border:2px solid #cf222e}.bar.slowest{box-shadow:inset 0 -3px 0 rgba(0,0,0,.55)}
.stop{position:absolute;top:0;color:#cf222e;font-weight:700;font-size:11px;white-space:nowrap;z-index:3}
.lane.running .stop{color:#7d4e00;font-weight:600}
tr.flagged td{color:#cf222e;font-weight:600}
#legend span{display:inline-block;margin:2px 10px 2px 0}
#legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
</style></head><body>
<div id="verdict" class="verdict $verdict_class">$verdict</div>
<h1>SGLang startup — $run</h1>
<div class="meta"><code>$path</code> · SGLang $version · $processes processes · $total</div>
$diagnosis
$errors
$stacks
<section id="timeline-section"><h2>Timeline</h2>
<div class="meta">Each lane is a process; nested phases sit below their parent. Hatched with a dashed red end:
never ended. Red outline: failed. Dark underline: the slowest rank of that phase. Hover a bar for its attributes.</div>
<div id="axis"></div><div id="timeline"></div><div id="legend"></div></section>
$history
<section id="compare"><h2>Phases across ranks (largest skew first)</h2>$compare</section>
<section id="problems"><h2>Problems and warnings</h2>$problems</section>
<script type="application/json" id="data">$data</script>
<script>
(function(){
const D=JSON.parse(document.getElementById('data').textContent), ROW=14, EAGER=40000;
const T=D.total_ms||1, pct=v=>(100*v/T).toFixed(4)+'%';
const color=k=>'hsl('+((k*47)%360)+',62%,'+(k%2?'70%':'62%')+')';
const fmt=ms=>ms>=10000?(ms/1000).toFixed(1)+' s':ms>=1000?(ms/1000).toFixed(2)+' s':
 ms>=1?ms.toPrecision(3)+' ms':(ms*1000).toPrecision(3)+' µs';
const axis=document.getElementById('axis');
for(let i=0;i<=8;i++){const s=document.createElement('span');s.style.left=(i*12.5)+'%';s.textContent=i?fmt(T*i/8):'0';
 if(i<8)axis.appendChild(s);}
function title(b){const a=D.attrs[b[5]];let t=D.names[b[4]]+'\\n'+D.keys[b[3]]+' — '+fmt(b[1]/1e3)+
 (b[6]&1?' (did not end)':b[6]&2?' (error)':b[6]&4?' (incomplete)':'');
 for(const k in a)t+='\\n'+k+' = '+a[k];return t;}
function draw(lane,track){
 const f=document.createDocumentFragment(), done=lane.state==='ready'||lane.state==='serving',
  stop=!done&&lane.where!==null;
 for(const b of lane.bars){const e=document.createElement('div');
  e.className='bar'+(b[6]&1?' open':'')+(b[6]&6?' err':'')+(b[6]&8?' slowest':'');
  e.style.cssText='left:'+pct(b[0]/1e3)+';width:'+pct(b[1]/1e3)+';top:'+(2+b[2]*ROW)+'px;background:'+color(b[3]);
  e.title=title(b);e.dataset.phase=D.keys[b[3]];if(b[1]/1e3>T/40&&!(stop&&b[2]===0))e.textContent=D.keys[b[3]];
  f.appendChild(e);}
 if(stop){const s=document.createElement('div');s.className='stop';
  if(lane.where_ms>0.6*T)s.style.right=(100-100*lane.where_ms/T).toFixed(4)+'%';else s.style.left=pct(lane.where_ms);
  s.textContent='\\u26a0 '+lane.state+' in '+lane.where;f.appendChild(s);}
 track.appendChild(f);track.dataset.drawn='1';}
const root=document.getElementById('timeline');let budget=EAGER;
const io='IntersectionObserver' in window?new IntersectionObserver(es=>{for(const e of es)if(e.isIntersecting){
 io.unobserve(e.target);draw(D.lanes[+e.target.dataset.i],e.target);}},{rootMargin:'800px'}):null;
D.lanes.forEach((lane,i)=>{const l=document.createElement('div');l.className='lane '+lane.state;
 l.dataset.rank=lane.label;l.dataset.state=lane.state;
 const depth=lane.bars.reduce((m,b)=>Math.max(m,b[2]),0);
 l.innerHTML='<div class="label"></div><div class="track"></div>';
 l.firstChild.textContent=lane.label;const sm=document.createElement('small');
 const over=lane.state==='ready'||lane.state==='serving';
 sm.textContent=lane.state+(lane.where&&!over?' · '+lane.where:'')+' · pid '+lane.pid;
 if(lane.verdict)l.title=lane.verdict;l.firstChild.appendChild(sm);
 const track=l.lastChild;track.style.height=(4+(depth+1)*ROW)+'px';track.dataset.i=i;root.appendChild(l);
 if(budget>0||!io){budget-=lane.bars.length;draw(lane,track);}else io.observe(track);});
const lg=document.getElementById('legend');D.keys.slice(0,60).forEach((k,i)=>{const s=document.createElement('span');
 s.innerHTML='<i></i>';s.firstChild.style.background=color(i);s.appendChild(document.createTextNode(k));lg.appendChild(s);});
})();
</script></body></html>
""")
