"""A bug-report bundle's archive: its members as they are collected (``Bundle``), ``SUMMARY.md``
(verdict first, to paste into the issue), and the gzipped tar they are written into."""

from __future__ import annotations

import io
import os
import platform
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..redact import redact_text
from ..render.term import clean
from ..render.units import size
from .command import write_file

TOP = "phasetrace-bundle"


@dataclass
class Bundle:
    members: dict[str, bytes] = field(default_factory=dict)  # archive name -> redacted bytes
    missing: list[str] = field(default_factory=list)  # what could not be collected, and why
    runs: list[str] = field(default_factory=list)  # SUMMARY.md sections, one per run

    def add(self, name: str, data: bytes | str) -> None:
        self.members[f"{TOP}/{name}"] = data.encode("utf-8", "replace") if isinstance(data, str) else data


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
