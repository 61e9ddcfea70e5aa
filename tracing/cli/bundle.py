"""``phasetrace bundle RUN_DIR [RUN_DIR…] -o FILE.tar.gz``: one redacted archive for a bug report.

What an engineer asked to "attach the logs" needs, in one file: per run the journals, status files
and stack dumps (redacted), the timeline as text, the HTML report, the diagnosis (verdicts, hints,
root cause, what the watchdog recorded) and the server arguments; once, the versions, an allowlist
of environment variables, ``nvidia-smi -q`` and the kernel log's tail (OOM kills, GPU Xid errors);
and ``SUMMARY.md`` to paste into the issue. Every byte that goes in passes through ``tracing.redact``
(journal records through ``redact``, text through ``redact_text``). Files are read only as regular
files inside the run directory (never through a link), each within a cap (journals as every reader
reads them: ``journal.reader.JournalTail``); the archive is created 0600. What could not be collected is
said in ``SUMMARY.md``, never fatal.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..journal.layout import JOURNAL_DIR, STACKS_DIR, STATUS_DIR
from ..journal.reader import JournalTail, _loads, read_regular
from ..journal.writer import dumps
from ..reader.run import RunView
from ..redact import REDACTED, is_secret_key, redact, redact_text
from ..render.html_report import render_report
from ..render.lanes import Lane, Layout, layout
from ..render.term import clean
from ..render.timeline_text import render_timeline
from ..render.units import duration, size
from ..render.verdict import headline, line, rank_lanes, state
from ..verdicts import hints, postmortem
from ..verdicts.findings import by_process, findings, gone_ranks
from .command import CommandError, open_run, write_file

TOP = "phasetrace-bundle"
MAX_STACK = 1 << 20  # bytes of one stack file kept (its end: the latest dumps)
MAX_STATUS = 1 << 20
TABLE_RANKS = 32  # rows of the per-rank table in SUMMARY.md (all of them in RUN/phases.md)
TABLE_PHASES = 10
GITHUB_ATTACHMENT = 25 << 20  # GitHub's limit for a file attached to an issue
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,200}$")
ENV_PREFIXES = (
    "SGLANG_",
    "NCCL_",
    "TORCH_",
    "PYTORCH_",
    "CUDA_",
    "NVIDIA_",
    "GLOO_",
    "TRITON_",
    "FLASHINFER_",
    "NVSHMEM_",
    "UCX_",
    "MASTER_",
)
ENV_NAMES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "LD_LIBRARY_PATH",
    "OTEL_SERVICE_NAME",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "HF_HUB_OFFLINE",
    "HF_HUB_ENABLE_HF_TRANSFER",
)
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS|PWD|AUTH|CRED|COOKIE|HEADER|SIGNATURE|PRIVATE", re.IGNORECASE)
PACKAGES = (
    "sglang",
    "sgl-kernel",
    "torch",
    "flashinfer-python",
    "triton",
    "transformers",
    "nvidia-nccl-cu12",
    "nvidia-nccl-cu13",
    "sglang-phasetrace",
)
KERNEL_EVENTS = re.compile(
    r"out of memory|oom-kill|oom_reaper|killed process|\bxid\b|nvrm|segfault|hung_task|blocked for more than|"
    r"general protection|mce:|pcie bus error|nvlink",
    re.IGNORECASE,
)
KERNEL_TAIL, KERNEL_MATCHES = 200, 500
COMMAND_TIMEOUT_S = 20.0


@dataclass
class Bundle:
    members: dict[str, bytes] = field(default_factory=dict)  # archive name -> redacted bytes
    missing: list[str] = field(default_factory=list)  # what could not be collected, and why
    runs: list[str] = field(default_factory=list)  # SUMMARY.md sections, one per run

    def add(self, name: str, data: bytes | str) -> None:
        self.members[f"{TOP}/{name}"] = data.encode("utf-8", "replace") if isinstance(data, str) else data


# -- one run --------------------------------------------------------------------------------------
def _files(run: Path, sub: str, suffix: str, bundle: Bundle) -> list[Path]:
    """Regular files ``RUN/sub/*suffix`` of safe names; a linked folder, links and odd names are skipped (said)."""
    folder = run / sub
    try:
        if stat.S_ISLNK(os.lstat(folder).st_mode):
            bundle.missing.append(f"{clean(folder)}: a symbolic link, not followed")
            return []
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    except OSError as exc:
        bundle.missing.append(f"{clean(folder)}: {exc.strerror or exc}")
        return []
    out = []
    for entry in entries:
        if not entry.name.endswith(suffix):
            continue
        if not SAFE_NAME.match(entry.name) or not entry.is_file(follow_symlinks=False):
            bundle.missing.append(f"{clean(redact_text(entry.path))}: not a regular file of a plain name, skipped")
            continue
        out.append(Path(entry.path))
    return out


def _read(path: Path, bundle: Bundle, limit: int = -1, tail: bool = False) -> bytes | None:
    try:
        if tail and limit > 0:
            size_ = os.lstat(path).st_size
            data = read_regular(path, max(0, size_ - limit), limit)
            return (
                (f"[truncated: the first {size_ - limit} bytes are not kept]\n".encode() + data)
                if size_ > limit
                else data
            )
        return read_regular(path, 0, limit)
    except OSError as exc:
        bundle.missing.append(f"{clean(redact_text(str(path)))}: {exc.strerror or exc}")
        return None


def copy_journal(path: Path, bundle: Bundle) -> bytes:
    """The journal at ``path`` redacted, read a piece at a time as readers read it: a line over
    ``journal.reader.LINE_MAX`` and whatever lies past ``journal.reader.journal_max()`` are left out (said in
    SUMMARY.md), so a huge or sparse file costs neither memory nor the archive's size."""
    tail = JournalTail(path)
    data = b"".join(redact_journal(lines) for lines, _ in tail.pieces(final=True))
    bundle.missing += [clean(redact_text(problem)) for problem in tail.problems]
    return data


def redact_journal(lines: list[bytes]) -> bytes:
    """Each line re-written: a record through ``redact``, anything else (a torn line) through ``redact_text``."""
    out = []
    for raw in lines:
        if not raw.strip():
            continue
        try:
            record = _loads(raw)
        except ValueError:
            record = None
        if isinstance(record, dict):
            out.append(dumps(redact(record)))
        else:
            out.append(redact_text(raw.decode("utf-8", "replace")))
    return ("\n".join(out) + "\n").encode("utf-8", "replace") if out else b""


def _redact_json_file(data: bytes) -> bytes:
    try:  # orjson: a depth limit, no NaN (the stdlib's parser recurses, and takes them)
        return (json.dumps(redact(_loads(data)), indent=1, ensure_ascii=False) + "\n").encode()
    except ValueError:
        return redact_text(data.decode("utf-8", "replace"), limit=None).encode()


def server_args(run: RunView) -> list[dict[str, Any]]:
    """Each distinct ``sglang.server_args`` a process recorded (redacted), with the processes that did."""
    seen: dict[str, dict[str, Any]] = {}
    for proc in run.processes:
        for span in proc.spans.values():
            raw = span.attrs.get("sglang.server_args")
            if not isinstance(raw, str):
                continue
            try:
                value: Any = _loads(raw)
            except ValueError:
                value = raw
            value = redact(value)
            key = json.dumps(value, sort_keys=True, default=str)
            entry = seen.setdefault(key, {"processes": [], "server_args": value})
            if proc.label not in entry["processes"]:
                entry["processes"].append(proc.label)
    return list(seen.values())


def _top_phases(lane: Lane) -> dict[str, float]:
    out: dict[str, float] = {}
    for bar in lane.bars:
        if bar.depth == 1:
            out[bar.key] = out.get(bar.key, 0.0) + bar.seconds
    return out


def phase_table(lay: Layout, verdicts: dict[int, Any], limit: int | None) -> str:
    """Markdown: one row per rank (those a verdict names first), state, time, top-level phase durations."""
    lanes = rank_lanes(lay)
    per = {lane.index: _top_phases(lane) for lane in lanes}
    columns: list[str] = []
    for phases in per.values():
        columns += [key for key in phases if key not in columns]
    shown_cols = columns[:TABLE_PHASES]
    ordered = sorted(lanes, key=lambda lane: (lane.proc.pid not in verdicts, lane.index))
    rows = ordered if limit is None else ordered[:limit]

    def cell(value: Any) -> str:
        return clean(redact_text(str(value))).replace("|", "\\|")

    head = ["rank", "host", "pid", "state", "total", "stopped in", *shown_cols]
    out = ["| " + " | ".join(cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    for lane in rows:
        finding = verdicts.get(lane.proc.pid)
        where = lane.where if lane.state not in ("ready", "serving") else None
        values = [
            lane.label,
            lane.proc.host,
            lane.proc.pid,
            state(finding) if finding else lane.state,
            duration(lane.root.seconds) if lane.root else "",
            where.key if where else "",
            *(duration(per[lane.index].get(key)) for key in shown_cols),
        ]
        out.append("| " + " | ".join(cell(v) for v in values) + " |")
    if limit is not None and len(ordered) > limit:
        out.append(f"\n… {len(ordered) - limit} more ranks: every rank is in `phases.md`.")
    if len(columns) > len(shown_cols):
        out.append(f"\n({len(columns) - len(shown_cols)} more top-level phases in `timeline.txt`.)")
    return "\n".join(out) + "\n"


def diagnosis_text(lay: Layout, found: list[Any]) -> list[str]:
    """Verdicts (as of the run's last record) each with its hint, the root cause, then what the
    watchdog recorded during the run."""
    out = []
    for finding in found:
        out.append(line(finding))
        out += hints.for_finding(finding, lay.run)
    root = postmortem.root_cause_line(lay.run, gone_ranks(lay.run))
    if root:
        out.append(root)
    recorded = [(r["t"], proc.label, r) for proc in lay.run.processes for r in proc.diagnoses]
    if recorded:
        out += ["", "recorded during the run (diagnosis records):"]
        for t, teller, r in sorted(recorded, key=lambda x: x[0]):
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t / 1e9))
            out.append(f"  {when} UTC by {teller}: {r.get('finding')}: {r.get('message')}")
    return [clean(redact_text(text)) for text in out] or ["no verdict: no rank stalled, died or failed"]


def collect_run(path: Path, name: str, bundle: Bundle) -> dict[str, Any]:
    """Add one run's members under ``name/``; return what SUMMARY.md says about it."""
    run = open_run(path)
    lay = layout(run, run_end(run))
    found = findings(run, lay.end, gone=gone_ranks(run))
    verdicts = by_process(run, found)
    for file in _files(path, JOURNAL_DIR, ".jsonl", bundle):
        bundle.add(f"{name}/{JOURNAL_DIR}/{file.name}", copy_journal(file, bundle))
    for file in _files(path, STATUS_DIR, ".json", bundle):
        data = _read(file, bundle, MAX_STATUS)
        if data is not None:
            bundle.add(f"{name}/{STATUS_DIR}/{file.name}", _redact_json_file(data))
    for file in _files(path, STACKS_DIR, ".txt", bundle):
        data = _read(file, bundle, MAX_STACK, tail=True)
        if data is not None:
            bundle.add(f"{name}/{STACKS_DIR}/{file.name}", redact_text(data.decode("utf-8", "replace"), limit=None))
    timeline = "\n".join(clean(t.plain).rstrip() for t in render_timeline(lay, width=160, depth=2))
    bundle.add(f"{name}/timeline.txt", redact_text(timeline, limit=None) + "\n")
    bundle.add(f"{name}/report.html", redact_text(render_report(lay, found, verdicts), limit=None))
    diagnosis = diagnosis_text(lay, found)
    bundle.add(f"{name}/diagnosis.txt", "\n".join(diagnosis) + "\n")
    args = server_args(run)
    if args:
        bundle.add(f"{name}/server-args.json", redact_text(json.dumps(args, indent=1, default=str), limit=None) + "\n")
    bundle.add(f"{name}/phases.md", phase_table(lay, verdicts, None))
    if run.problems:
        bundle.add(f"{name}/journal-problems.txt", "\n".join(redact_text(clean(p)) for p in run.problems) + "\n")
    versions = sorted(
        {str(p.resource.get("sglang.version")) for p in run.processes if p.resource.get("sglang.version")}
    )
    return {
        "name": name,
        "headline": clean(redact_text(headline(lay, found)[1])),
        "diagnosis": diagnosis,
        "table": phase_table(lay, verdicts, TABLE_RANKS),
        "sglang": versions,
        "hosts": sorted({p.host for p in run.processes}),
        "processes": len(run.processes),
        "ranks": len(rank_lanes(lay)),
        "problems": len(run.problems),
    }


def run_end(run: RunView) -> int:
    """The run's horizon: its last record (an old run is judged as it ended, not as of today)."""
    return max((p.last_t for p in run.processes), default=time.time_ns())


# -- this machine -----------------------------------------------------------------------------------
def _package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _torch_builds() -> dict[str, str]:
    """torch's CUDA (and HIP) version from ``torch/version.py``, read as text: importing torch takes seconds."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return {}
    if spec is None or not spec.submodule_search_locations:
        return {}
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except OSError:
        return {}
    out = {}
    for key in ("cuda", "hip"):
        m = re.search(rf"^{key}\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
        if m:
            out[f"torch {key.upper()}"] = m[1]
    return out


def versions(bundle: Bundle) -> dict[str, str]:
    out = {"python": sys.version.split()[0] + f" ({sys.executable})", "platform": platform.platform()}
    for name in PACKAGES:
        version = _package_version(name)
        if version:
            out[name] = version
    out.update(_torch_builds())
    try:
        out["nvidia driver"] = read_regular(Path("/proc/driver/nvidia/version"), 0, 4096).decode().splitlines()[0]
    except (OSError, IndexError, UnicodeDecodeError):
        bundle.missing.append(
            "NVIDIA driver version: /proc/driver/nvidia/version not readable (no NVIDIA driver here?)"
        )
    return {k: redact_text(v) for k, v in out.items()}


def environment() -> dict[str, str]:
    """The allowlisted variables of this process; values redacted, names that look secret hide the value."""
    out = {}
    for name in sorted(os.environ):
        if not (name.startswith(ENV_PREFIXES) or name in ENV_NAMES):
            continue
        value = os.environ[name]
        out[name] = REDACTED if (is_secret_key(name) or _SECRET_NAME.search(name)) and value else redact_text(value)
    return out


def _command(argv: list[str]) -> tuple[str | None, str]:
    """(stdout, "") or (None, why not)."""
    exe = shutil.which(argv[0])
    if exe is None:
        return None, f"{argv[0]}: not on PATH"
    try:
        done = subprocess.run(
            [exe, *argv[1:]],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=COMMAND_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return None, f"{' '.join(argv)}: no answer in {COMMAND_TIMEOUT_S:.0f} s"
    except OSError as exc:
        return None, f"{' '.join(argv)}: {exc.strerror or exc}"
    if done.returncode != 0 or not done.stdout.strip():
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return None, f"{' '.join(argv)}: {why}"
    return done.stdout, ""


def kernel_log(bundle: Bundle) -> None:
    """The kernel log's OOM kills, GPU Xid and similar lines, then its last lines: ``dmesg``, else ``journalctl -k``."""
    whys = []
    for argv in (["dmesg", "--time-format", "iso"], ["dmesg"], ["journalctl", "-k", "-b", "--no-pager", "-n", "5000"]):
        text, why = _command(argv)
        if text is None:
            whys.append(why)
            continue
        lines = text.splitlines()
        events = [x for x in lines if KERNEL_EVENTS.search(x)][-KERNEL_MATCHES:]
        body = [f"# `{' '.join(argv)}` on {platform.node()}: lines about OOM kills, GPU (Xid/NVRM) and hangs"]
        body += events or ["(none)"]
        body += ["", f"# its last {min(KERNEL_TAIL, len(lines))} lines", *lines[-KERNEL_TAIL:]]
        bundle.add("system/kernel-log.txt", redact_text("\n".join(body), limit=None) + "\n")
        return
    bundle.missing.append("kernel log: " + "; ".join(whys))


def collect_system(bundle: Bundle) -> dict[str, str]:
    found = versions(bundle)
    bundle.add("system/versions.json", json.dumps(found, indent=1) + "\n")
    env = environment()
    note = "# the environment of the `phasetrace bundle` process (allowlisted), not necessarily of the launch\n"
    bundle.add("system/environment.txt", note + "".join(f"{k}={v}\n" for k, v in env.items()))
    smi, why = _command(["nvidia-smi", "-q"])
    if smi is None:
        bundle.missing.append(f"nvidia-smi -q: {why}")
    else:
        bundle.add("system/nvidia-smi.txt", redact_text(smi, limit=None))
    kernel_log(bundle)
    return found


# -- SUMMARY.md and the archive -------------------------------------------------------------------------
def summary(runs: list[dict[str, Any]], found_versions: dict[str, str], bundle: Bundle) -> str:
    out = ["# sglang-phasetrace bug-report bundle", ""]
    for r in runs:
        out += [f"## Run `{r['name']}`", "", f"**Verdict:** {r['headline']}", "", "```"]
        out += r["diagnosis"][:12] + (["… (all of it in diagnosis.txt)"] if len(r["diagnosis"]) > 12 else [])
        out += [
            "```",
            "",
            f"{r['ranks']} ranks, {r['processes']} processes on {len(r['hosts'])} host(s)"
            + (f"; {r['problems']} journal line(s) skipped (journal-problems.txt)" if r["problems"] else ""),
            "",
        ]
        out += [r["table"]]
    out += ["## Versions", "", "| | |", "|---|---|"]
    run_sglang = sorted({v for r in runs for v in r["sglang"]})
    if run_sglang:
        out.append(f"| SGLang (as the run's journals recorded it) | {', '.join(run_sglang)} |")
    out += [f"| {k} | {clean(v).replace('|', '/')} |" for k, v in found_versions.items()]
    out += [
        "",
        "Versions other than the run's SGLang, the environment variables, `nvidia-smi` and the kernel log are "
        f"those of the machine and process that made this bundle ({clean(platform.node())}, "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}), which may not be where or when the run was.",
        "",
        "## In this archive",
        "",
    ]
    for name, data in sorted(bundle.members.items()):
        if name == f"{TOP}/SUMMARY.md":
            continue
        out.append(f"- `{clean(name[len(TOP) + 1 :])}` ({size(len(data))})")
    if bundle.missing:
        out += ["", "## Not collected", ""] + [f"- {clean(redact_text(m))}" for m in bundle.missing]
    out += [
        "",
        "Everything here passed through sglang-phasetrace's redaction (`[REDACTED]` marks what it hid: "
        "credentials in URLs, tokens, keys, passwords). Look it over before you post it.",
    ]
    return redact_text("\n".join(out), limit=None) + "\n"


def write_archive(members: dict[str, bytes], output: Path) -> None:
    """A gzipped tar of regular 0600 members, written as every output is (``command.write_file``)."""

    def write(fd: int) -> None:
        with os.fdopen(fd, "wb", closefd=False) as f, tarfile.open(fileobj=f, mode="w:gz") as tar:
            now = time.time()
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime, info.type = len(data), 0o600, now, tarfile.REGTYPE
                tar.addfile(info, io.BytesIO(data))

    write_file(output, write)


def make_bundle(run_dirs: list[str], output: Path) -> Bundle:
    bundle = Bundle()
    runs, names = [], set()
    for run_dir in run_dirs:
        path = Path(run_dir)
        name = path.resolve().name if SAFE_NAME.match(path.resolve().name) else "run"
        base, n = name, 1
        while name in names:
            n += 1
            name = f"{base}-{n}"
        names.add(name)
        runs.append(collect_run(path, name, bundle))
    found_versions = collect_system(bundle)
    bundle.members = {f"{TOP}/SUMMARY.md": b"", **bundle.members}  # first in the archive
    bundle.add("SUMMARY.md", summary(runs, found_versions, bundle))
    write_archive(bundle.members, output)
    return bundle


class BundleCommand:
    name = "bundle"
    bulk = True
    help = "one redacted .tar.gz of one or more runs for a bug report, with SUMMARY.md to paste"
    description = """\
Pack what a bug report about a server that would not start needs into one archive: per run the
journals, status files and stack dumps, the timeline as text, the HTML report, the diagnosis
(verdicts, hints from known fixes, root cause) and the server arguments; versions (Python, SGLang,
torch and its CUDA, NCCL, driver), allowlisted environment variables (NCCL_*, SGLANG_*, CUDA_*,
TORCH_*, …), `nvidia-smi -q` and the kernel log's OOM/Xid lines where readable; and SUMMARY.md,
verdict first, to paste into the issue. Everything is redacted; look it over before posting.

  phasetrace bundle phasetrace-runs/20250101-120000-ab12cd -o startup-hang.tar.gz
  phasetrace bundle RUN_NODE0 RUN_NODE1 -o both-nodes.tar.gz   # the run directories of two nodes"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (each holds journal/)")
        parser.add_argument(
            "-o", "--output", metavar="FILE", help="the archive (default: phasetrace-bundle-<run>.tar.gz here)"
        )

    def run(self, args: argparse.Namespace) -> int:
        output = Path(args.output or f"phasetrace-bundle-{Path(args.run_dirs[0]).resolve().name}.tar.gz")
        try:
            bundle = make_bundle(args.run_dirs, output)
        except OSError as exc:
            raise CommandError(f"cannot write {output}: {exc.strerror or exc}") from None
        written = output.stat().st_size
        print(f"wrote {output} ({size(written)}, {len(bundle.members)} files); paste {TOP}/SUMMARY.md into the issue")
        if written > GITHUB_ATTACHMENT:
            print(
                f"note: GitHub takes attachments up to {size(GITHUB_ATTACHMENT)}; share it another way", file=sys.stderr
            )
        if bundle.missing:
            print(f"phasetrace bundle: {len(bundle.missing)} item(s) not collected (see SUMMARY.md)", file=sys.stderr)
        return 0
