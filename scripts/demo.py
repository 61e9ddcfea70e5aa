"""The main job: a real traced SGLang start on CPU, tp=2, with a tiny model made here.

Makes a 2-layer Llama (random weights) under ./phasetrace-demo/, starts ``sglang.Engine`` with
tp=2 on CPU through ``phasetrace run`` (tracing comes only from PYTHONPATH, SGLang is unchanged),
generates once, then prints where the trace went and a per-rank timeline. With an OTLP endpoint
in the environment (OTEL_EXPORTER_OTLP_ENDPOINT) the spans also go to Jaeger; by default they go
to the local journal only.

    python scripts/demo.py [--tp 2] [--eagle]     # --eagle: add a draft (SGLang stops on CPU)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--eagle", action="store_true", help="start with an EAGLE draft model too")
    parser.add_argument("--dir", type=Path, default=Path("phasetrace-demo"), help="models and runs go here")
    args = parser.parse_args()
    target, draft = args.dir / "tiny-llama", args.dir / "tiny-llama-eagle"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"), str(target), "--draft", str(draft)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    runs = (args.dir / "runs").resolve()
    command = [sys.executable, str(ROOT / "scripts" / "start_engine.py"), str(target), "--tp", str(args.tp)]
    if args.eagle:
        command += ["--draft", str(draft)]

    from sglang_phasetrace.tracing.cli import main as phasetrace
    from sglang_phasetrace.tracing.cli.command import newest_run

    code = phasetrace(["run", "--dir", str(runs), "--", *command])
    run_dir = newest_run(runs)
    if run_dir is None:
        print(f"demo: no run directory in {runs}", file=sys.stderr)
        return code or 1
    print(f"\ntrace: journal {run_dir / 'journal'}/ (one JSON-lines file per process)", flush=True)
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    print(f"       OTLP: {endpoint or 'off (set OTEL_EXPORTER_OTLP_ENDPOINT to send to Jaeger)'}")
    print(f"       compare ranks:  phasetrace compare {run_dir}\n", flush=True)
    phasetrace(["timeline", str(run_dir)])
    return code


if __name__ == "__main__":
    raise SystemExit(main())
