"""``phasetrace bundle RUN_DIR [RUN_DIR…] -o FILE.tar.gz``: one redacted archive for a bug report.

What an engineer asked to "attach the logs" needs, in one file: per run the journals, status files
and stack dumps (redacted), the timeline as text, the HTML report, the diagnosis (verdicts, hints,
root cause, what the watchdog recorded) and the server arguments; once, the versions, an allowlist
of environment variables, ``nvidia-smi -q`` and the kernel log's tail (OOM kills, GPU Xid errors);
and ``SUMMARY.md`` to paste into the issue. Every byte that goes in passes through ``tracing.redact``
(journal records through ``redact``, text through ``redact_text``). Files are read only as regular
files inside the run directory (never through a link), each within a cap (journals as every reader
reads them: ``journal.tail.JournalTail``); the archive is created 0600. What could not be collected is
said in ``SUMMARY.md``, never fatal.

The verb puts together ``bundle_run`` (each run's members), ``bundle_system`` (this machine's) and
``bundle_archive`` (``SUMMARY.md`` and the archive).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..render.units import size
from .bundle_archive import TOP, Bundle, summary, write_archive
from .bundle_run import SAFE_NAME, collect_run
from .bundle_system import collect_system
from .command import PREFIX, CommandError

GITHUB_ATTACHMENT = 25 << 20  # GitHub's limit for a file attached to an issue


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
            print(f"{PREFIX} bundle: {len(bundle.missing)} item(s) not collected (see SUMMARY.md)", file=sys.stderr)
        return 0
