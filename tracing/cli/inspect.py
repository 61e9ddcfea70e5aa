"""``phasetrace inspect [PID ...]``: an SGLang launch started without the hook, read from outside.

For the server that is stuck now: which rank stopped, where (the phase, through the patch tables)
and on what (a collective, a lock and its holder, a child, a socket, a native call), read with
``/proc`` and py-spy over a few seconds. It sends no signal, writes into no process, attaches nothing
but py-spy's reads. The judgement is ``verdicts.inspect``; this module finds the launches, prints,
writes ``--json`` and ``--bundle``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

from ..redact import printable, redact, redact_text
from ..render.units import size
from ..verdicts.inspect.judge import Report, duration, inspect
from ..verdicts.inspect.launch import NotInspectable, find
from ..verdicts.inspect.sample import py_spy_exe
from .command import EXIT_FAILED, EXIT_STALLED, CommandError
from .doctor import phase_targets


def _exe(given: str | None) -> str | None:
    if given is None:
        return py_spy_exe()
    return given if os.path.isfile(given) and os.access(given, os.X_OK) else None


def _short(frame: str) -> str:
    """``f (/long/path/sglang/srt/x.py:12)`` as ``f (srt/x.py:12)``."""
    name, _, where = frame.strip().rpartition(" (")
    return f"{name} ({'/'.join(where.split('/')[-2:])}" if name else frame.strip()


def render(report: Report) -> str:
    """The verdict first, its hints, then each process (role, state, CPU, RSS, age, where), then notes."""
    out = [report.line, *report.hints]
    launch = report.launch
    out.append(
        printable(
            f"launch pid {launch.launcher.pid} ({launch.launcher.cmd[:100]}): {len(launch.members)} processes, "
            f"read over {report.window_s:g} s"
        )
    )
    out.append(f"  {'process':<18} {'pid':>7}  {'state':<11} {'CPU':>5}  {'RSS':>8}  {'age':>10}  where")
    for s in report.seen:
        cpu = "?" if s.cpu_pct is None else f"{s.cpu_pct:.0f}%"
        rss = size(s.rss) if s.rss else "?"
        age = duration(s.age_s) if s.age_s is not None else "?"
        where = f"'{s.phase.name}' ({s.phase.where})" if s.phase else s.top or "(no stack)"
        gpu = f"  GPU{s.gpu['index']} {s.gpu['util']}% {size(s.gpu['mem_used'] or 0)}" if s.gpu else ""
        row = f"  {s.member.label:<18} {s.member.pid:>7}  {s.state:<11} {cpu:>5}  {rss:>8}  {age:>10}  {where}"
        out.append(printable(row + gpu))
        if s.collective is not None and s.state != "serving":
            out.append(printable(f"      waits in {s.collective.words}"))
        if s.evidence is not None and s.evidence.cause not in ("none",):
            out.append(printable(f"      {s.evidence.text}"))
        frames = [_short(line) for line in s.stack.split("\n=== with native")[0].splitlines()[1:6]]
        if frames and s.state != "serving":
            out.append(printable(f"      stack: {' <- '.join(frames)}"))
    extra = []
    if report.log:
        extra.append(f"log {report.log.path}: last written {duration(report.log.silent_s)} ago")
    if report.health_url:
        extra.append(f"{report.health_url}: {report.health}")
    out += [printable(f"  {e}") for e in extra]
    out += [printable(f"sglang-phasetrace: {n}") for n in report.notes]
    return "\n".join(out)


def write_bundle(reports: list[Report], text: str, output: Path) -> int:
    """``--bundle``: what ``phasetrace bundle`` packs of this machine, the report, every stack; redacted."""
    from .bundle_archive import Bundle, summary, write_archive
    from .bundle_system import collect_system

    bundle = Bundle()
    bundle.add("inspect.txt", redact_text(text, limit=None) + "\n")
    bundle.add("inspect.json", json.dumps(redact([r.to_json() for r in reports]), indent=1))
    for r in reports:
        for s in r.seen:
            bundle.add(f"stacks/launch-{r.launch.launcher.pid}/{s.member.label}-{s.member.pid}.txt", s.stack + "\n")
    found_versions = collect_system(bundle)
    runs = [
        {
            "name": f"launch-{r.launch.launcher.pid} (untraced, read by phasetrace inspect)",
            "headline": r.line,
            "diagnosis": [r.line, *r.hints],
            "ranks": len(r.launch.ranks),
            "processes": len(r.launch.members),
            "hosts": [platform.node()],
            "problems": 0,
            "table": "```\n" + redact_text(render(r), limit=None) + "\n```\n",
            "sglang": [],
        }
        for r in reports
    ]
    bundle.members = {"phasetrace-bundle/SUMMARY.md": b"", **bundle.members}
    bundle.add("SUMMARY.md", summary(runs, found_versions, bundle))
    write_archive(bundle.members, output)
    return len(bundle.members)


class Inspect:
    name = "inspect"
    help = "read an SGLang launch started without tracing: which rank stopped, where, on what"
    description = f"""\
For a server that is stuck now and was started without the hook: find every process of the launch
(launcher, each scheduler rank as SGLang names it, detokenizer, tokenizer workers, DP controller),
sample each over a short window with /proc and py-spy (non-blocking; one --native dump of a process
that did not move), map the frames to phases, and say which rank stopped, where and on what — in
the watchdog's words. Sends no signal and kills nothing. PID: any process of the launch; none:
every SGLang launch of this user. Exits 0 serving or progressing, {EXIT_STALLED} a rank is stalled,
{EXIT_FAILED} a rank died.

  phasetrace inspect                 # every launch of this user on this host
  phasetrace inspect 4242 --json     # the launch pid 4242 belongs to, machine-readable
  phasetrace inspect --bundle stuck.tar.gz   # and a redacted bug-report bundle with every stack"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("pids", nargs="*", type=int, metavar="PID", help="any process of the launch")
        parser.add_argument("--window", type=float, default=3.0, metavar="S", help="sampling window (default 3)")
        parser.add_argument("--json", action="store_true", help="the findings as one JSON document")
        parser.add_argument("--bundle", metavar="FILE", help="also write a redacted bug-report bundle (.tar.gz)")
        parser.add_argument("--py-spy", dest="py_spy", metavar="EXE", help="the py-spy to use (default: installed)")

    def run(self, args: argparse.Namespace) -> int:
        if args.window <= 0 or args.window > 600:
            raise CommandError(f"--window {args.window:g}: give a number of seconds above 0, at most 600", 2)
        try:
            launches = find(args.pids)
        except NotInspectable as exc:
            raise CommandError(str(exc), exc.exit_code) from None
        except OSError as exc:
            raise CommandError(f"cannot read /proc: {exc.strerror or exc}") from None
        if not launches:
            raise CommandError("no SGLang launch of this user on this host (no process named sglang::*)")
        targets, exe = phase_targets(), _exe(args.py_spy)
        reports = [inspect(launch, targets, exe, window_s=args.window) for launch in launches]
        text = "\n\n".join(render(r) for r in reports)
        judged = [r.exit_code for r in reports if r.word != "ended"] or [1]  # 1: every launch ended meanwhile
        code = max(judged, key=lambda c: {EXIT_FAILED: 2, EXIT_STALLED: 1}.get(c, 0))
        if args.json:
            print(json.dumps({"exit_code": code, "launches": [redact(r.to_json()) for r in reports]}, indent=1))
        else:
            print(text, flush=True)
        for r in reports:
            if r.traced is not None and not args.json:
                print(
                    printable(
                        "sglang-phasetrace: this launch is traced after all"
                        + (f" (run directory {r.traced}); what `phasetrace status` shows:" if r.traced else "")
                    ),
                    flush=True,
                )
                if r.traced and os.path.isdir(r.traced):
                    from . import main

                    main(["status", r.traced, "--once"])
        if args.bundle:
            try:
                n = write_bundle(reports, text, Path(args.bundle))
            except OSError as exc:
                raise CommandError(f"cannot write {args.bundle}: {exc.strerror or exc}") from None
            print(f"wrote {args.bundle} ({n} files); paste phasetrace-bundle/SUMMARY.md into the issue")
        return code
