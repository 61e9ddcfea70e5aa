"""The HTML report's picture of a start against its launch's history (``phasetrace report``): per
phase, this start's time drawn over the earlier starts' spread (min to max, the median and p95
marked), and the trend of the last starts' total time, this one last. Inline SVG: the page stays
one self-contained file."""

from __future__ import annotations

import html
from dataclasses import dataclass

from ..history.baseline import BaselineRow
from ..history.store import Start
from .units import duration

WIDTH, ROW_H, LABEL_W = 420, 18, 0
TOP = 14  # phases drawn: the flagged first, then the largest change (``baseline.against``'s order)


@dataclass
class Against:
    summary: str  # the launch
    rows: list[BaselineRow]  # this start's phases against the earlier starts
    starts: list[Start]  # the launch's newest starts, the newest first (this one included when recorded)
    run_id: str
    total_s: float


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _strip(row: BaselineRow, scale: float) -> str:
    """One phase: the earlier starts' min to max as a band, p95 and median as ticks, this start a dot."""
    u = row.usual

    def x(seconds: float) -> str:
        return f"{4 + (WIDTH - 8) * min(seconds, scale) / scale:.1f}"

    parts = [f'<svg width="{WIDTH}" height="{ROW_H}" role="img">']
    if u is not None:
        band = max(1.0, float(x(u.max)) - float(x(u.min)))
        parts.append(f'<rect x="{x(u.min)}" y="6" width="{band:.1f}" height="6" fill="#d0d7de"/>')
        for at, color in ((u.p95, "#bf8700"), (u.median, "#57606a")):
            parts.append(f'<line x1="{x(at)}" x2="{x(at)}" y1="3" y2="15" stroke="{color}" stroke-width="2"/>')
    color = "#cf222e" if row.flagged else "#0969da"
    parts.append(f'<circle cx="{x(row.this)}" cy="9" r="5" fill="{color}"/></svg>')
    return "".join(parts)


def _row(r: BaselineRow, scale: float) -> str:
    u = r.usual
    cells = [r.phase, duration(r.this), duration(u.median) if u else "", duration(u.p95) if u else "", u.n if u else 0]
    flagged = ' class="flagged"' if r.flagged else ""
    return f"<tr{flagged}>" + "".join(f"<td>{_esc(c)}</td>" for c in cells) + f"<td>{_strip(r, scale)}</td></tr>"


def _trend(starts: list[Start], run_id: str) -> str:
    """The last starts' total time, oldest left, this start red."""
    shown = list(reversed(starts))
    if len(shown) < 2:
        return ""
    top = max(s.total_s for s in shown) or 1.0
    w, h, step = 420, 80, 420 / max(1, len(shown) - 1)
    pts = [(i * step, h - 6 - (h - 12) * s.total_s / top, s) for i, s in enumerate(shown)]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in pts)
    dots = "".join(
        f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{5 if s.run_id == run_id else 3}" '
        f'fill="{"#cf222e" if s.run_id == run_id else "#0969da"}"><title>{_esc(s.run_id)}: '
        f"{_esc(duration(s.total_s))} ({_esc(s.outcome)}, {_esc(s.host)})</title></circle>"
        for x, y, s in pts
    )
    return (
        f"<p>Total time of the last {len(shown)} starts, oldest left (up to {_esc(duration(top))}):</p>"
        f'<svg width="{w + 10}" height="{h}" role="img"><polyline points="{line}" fill="none" stroke="#57606a"/>'
        f"{dots}</svg>"
    )


def section(a: Against | None) -> str:
    """The report's "Against its history" section; a line saying why not, where there is none."""
    if a is None:
        return ""
    earlier = [r for r in a.rows if r.usual is not None]
    if not earlier:
        return (
            '<section id="history"><h2>Against its history</h2>'
            f"<p>No earlier start of this launch ({_esc(a.summary)}) ended these phases.</p></section>"
        )
    rows = a.rows[:TOP]
    scale = max(max(r.this, r.usual.max if r.usual else 0.0) for r in rows) or 1.0
    body = "".join(_row(r, scale) for r in rows)
    n = max(r.usual.n for r in earlier)
    return (
        '<section id="history"><h2>Against its history</h2>'
        f"<p>Launch {_esc(a.summary)}: this start's slowest process per phase (dot; red past the p95) over "
        f"the earlier starts (grey: min to max; dark tick: median; amber tick: p95), from {n} earlier start"
        f"{'s' if n > 1 else ''}.</p>"
        '<table class="history"><thead><tr><th>phase</th><th>this start</th><th>median</th><th>p95</th>'
        f"<th>starts</th><th>against the earlier starts</th></tr></thead><tbody>{body}</tbody></table>"
        f"{_trend(a.starts, a.run_id)}</section>"
    )
