"""A per-rank Gantt chart for the terminal: ranks as rows, phases as bars on one time axis.

Each phase key gets a letter; a cell shows the phase that covers most of its time slice, so the
chart stays legible without colour (pipes, CI logs). The slowest rank of a phase draws it in
capitals; a phase that never ended finishes with ``>`` and its row says where it is open.
Names and labels come from the journals: each goes through ``term.clean`` before it is shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rich.text import Text

from ..reader.forked_helper import job
from .lane_jobs import lanes_map
from .lanes import DONE, Bar, Lane, Layout, unreadable_text
from .phase_stats import phase_stats
from .term import clean
from .units import duration

GLYPHS = "abcdefghijklmnopqrstuvwxyz0123456789"
COLORS = (
    "cyan",
    "magenta",
    "green",
    "yellow",
    "blue",
    "red",
    "bright_cyan",
    "bright_magenta",
    "bright_green",
    "bright_yellow",
    "bright_blue",
    "bright_red",
)
LABEL_W, LABEL_MAX_W, TAIL_W = 10, 24, 28  # labels get at least 10 columns, at most 24 (``tp9@node-1``)
MIN_WIDTH = LABEL_MAX_W + TAIL_W + 3 + 20  # the widest label, the tail and a chart of 20 columns
CUT = "…"  # ends a label cut to fit


@dataclass
class Legend:
    key: str
    glyph: str
    color: str
    slowest: str | None  # lane label, when more than one lane ran the phase
    spread: str  # "min-max s"
    open_in: list[str]


def legends(lay: Layout, depths: range) -> dict[str, Legend]:
    """A glyph and colour per phase key drawn, in order of first start (``phase_stats``' order)."""
    shown: dict[str, Legend] = {}
    for n, (key, stat) in enumerate(phase_stats(lay, depths).items()):
        shown[key] = Legend(
            key,
            GLYPHS[n] if n < len(GLYPHS) else "+",
            COLORS[n % len(COLORS)],
            stat.slowest if len(stat.per_rank) > 1 else None,
            f"{duration(stat.min)}-{duration(stat.max)}" if len(stat.per_rank) > 1 else duration(stat.max),
            stat.open,
        )
    return shown


@job
def lane_rows(lane: Lane, arg: tuple) -> list[list[tuple[str, str]]]:
    """``lane``'s rows (one per depth in ``arg``), each as (text, style) runs of ``width`` cells
    (``lanes_map``: in the process holding its bars)."""
    start, end, width, looks, levels = arg
    label = lane.label
    return [_cells([b for b in lane.bars if b.depth == level], start, end, width, looks, label) for level in levels]


def _cells(
    bars: list[Bar], start: int, end: int, width: int, looks: dict[str, tuple[str, str, str | None]], label: str
) -> list[tuple[str, str]]:
    """One row of ``width`` cells; each cell shows the phase covering most of its time slice
    (``looks``: key -> glyph, colour, slowest lane)."""
    span = max(end - start, 1)
    cover: list[dict[str, int]] = [{} for _ in range(width)]
    ends: dict[int, Bar] = {}
    same: dict[tuple[str, int, int], int] = {}  # bars of one phase over the same time count once, weighted
    for bar in bars:
        k = (bar.key, bar.span.start, bar.end)
        same[k] = same.get(k, 0) + 1
        if bar.open:
            b = (bar.end - start) * width / span
            ends[min(width - 1, max(0, math.ceil(b) - 1))] = bar
    for (key, first_t, end_t), n in same.items():
        a = (first_t - start) * width / span
        b = (end_t - start) * width / span
        first, last = max(0, int(a)), min(width, int(b) + 1)
        for cell in (first, last - 1) if last - first > 1 else range(first, last):  # partly covered
            overlap = min(b, cell + 1) - max(a, cell)
            if overlap > 0:
                cover[cell][key] = cover[cell].get(key, 0) + n * int(overlap * 1e6)
        for cell in range(first + 1, last - 1):  # covered whole: overlap 1
            c = cover[cell]
            c[key] = c.get(key, 0) + n * 1_000_000
    cells: list[tuple[str, str]] = []  # (glyph, style) per cell
    for cell, keys in enumerate(cover):
        if cell in ends:
            cells.append((">", f"bold {looks[ends[cell].key][1]}"))
        elif keys:
            glyph, color, slowest = looks[max(keys, key=keys.__getitem__)]
            cells.append((glyph.upper() if slowest == label else glyph, color))
        else:
            cells.append((" ", ""))
    runs: list[tuple[str, str]] = []
    run_start = 0
    for cell in range(1, width + 1):  # one styled segment per run of equal cells
        if cell == width or cells[cell] != cells[run_start]:
            glyph, style = cells[run_start]
            runs.append((glyph * (cell - run_start), style))
            run_start = cell
    return runs


def _axis(lay: Layout, width: int) -> Text:
    cells = [" "] * width
    step = max(1, width // 6)
    for cell in range(0, width, step):
        mark = f"|{duration(lay.seconds * cell / width)}" if cell else "|0 s"
        if cell + len(mark) <= width and cells[cell - 1 if cell else 0] == " ":  # whole marks, one space apart
            cells[cell : cell + len(mark)] = mark
    return Text("".join(cells), style="dim")


def _tail(lane: Lane) -> str:
    root = lane.root
    total = duration(root.seconds) if root else ""
    where = lane.where
    if lane.state == "running" and where is not None:
        return f"{total} open in {clean(where.key)}"
    if lane.state == "initialised" and where is not None:
        return f"{total} initialised, open in {clean(where.key)}"
    if lane.state in ("failed", "incomplete") and where is not None:
        return f"{total} {lane.state} in {clean(where.key)}"
    if lane.state == "unreadable":
        return unreadable_text(lane.proc)
    return f"{total} {lane.state}"


def render_timeline(lay: Layout, width: int = 100, depth: int = 1) -> list[Text]:
    """Rows for every lane (one per depth level shown), then the legend."""
    depths = range(1 if depth > 0 else 0, depth + 1)
    legend = legends(lay, depths)
    labels = [clean(lane.label) for lane in lay.lanes]
    label_w = max([LABEL_W] + [min(LABEL_MAX_W, len(label)) for label in labels])
    chart_w = max(20, width - label_w - TAIL_W - 3)
    lines = [Text(f"{'':<{label_w}} ") + _axis(lay, chart_w) + Text(f"  total {duration(lay.seconds)}")]
    looks = {key: (item.glyph, item.color, item.slowest) for key, item in legend.items()}
    rows = lanes_map(lay, lane_rows, (lay.start, lay.end, chart_w, looks, list(depths)))
    for lane, shown, cells in zip(lay.lanes, labels, rows, strict=True):
        for n, runs in enumerate(cells):
            label = shown if n == 0 else ""
            if len(label) > label_w:
                label = label[: label_w - 1] + CUT
            row = Text(f"{label:<{label_w}} ", style="bold" if n == 0 else "")
            for text, style in runs:
                row.append(text, style=style)
            if n == 0:
                row += Text(f"  {_tail(lane)}", style="red" if lane.state not in DONE else "")
            lines.append(row)
    lines.append(Text(""))
    lines.append(Text("legend (capitals: the slowest rank of that phase; '>': still open)", style="dim"))
    for item in legend.values():
        line = Text(f"  {item.glyph}  ", style=f"bold {item.color}")
        line += Text(f"{clean(item.key):<40} {item.spread:>16}")
        if item.slowest:
            line += Text(f"  slowest {clean(item.slowest)}")
        if item.open_in:
            shown = ", ".join(clean(label) for label in item.open_in[:4])
            line += Text(f"  open in {shown}{' …' if len(item.open_in) > 4 else ''}", style="red")
        lines.append(line)
    return lines


def timeline_json(lay: Layout, depth: int) -> dict[str, Any]:
    """``timeline --json``: the chart's data, seconds from the run's first span: per process, its
    phases down to ``depth`` (start, end: null while open, status)."""
    return {
        "run": str(lay.run.path),
        "start_ns": lay.start,
        "seconds": round(lay.seconds, 6),
        "lanes": [
            {
                "label": lane.label,
                "role": lane.proc.role,
                "pid": lane.proc.pid,
                "host": lane.proc.host,
                "state": lane.state,
                "phases": [
                    {
                        "phase": b.key,
                        "depth": b.depth,
                        "start_s": round(lay.rel(b.span.start), 6),
                        "end_s": None if b.open else round(lay.rel(b.end), 6),
                        "status": b.span.status,
                    }
                    for b in lane.bars
                    if b.depth <= depth
                ],
            }
            for lane in lay.lanes
        ],
    }
