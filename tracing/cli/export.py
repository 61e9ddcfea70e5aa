"""``phasetrace export``: a run as a Jaeger upload, OTLP JSON or Perfetto file, or sent over OTLP."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlparse

from ..redact import printable
from ..render.jaeger import jaeger_chunks
from ..render.lane_jobs import Held
from ..render.lanes import Layout, layout
from ..render.otlp_json import otlp_chunks
from ..render.perfetto import perfetto_chunks
from ..verdicts.diagnose import Finding
from ..verdicts.findings import findings
from .command import RUN_DIRS_HELP, CommandError, complete, keep, open_run, write_chunks
from .usage import seconds

# format -> its document a piece at a time, each lane's made where its spans are (a split run's child)
FORMATS: dict[str, Callable[[Layout, list[Finding]], Iterator[bytes | Held]]] = {
    "jaeger": jaeger_chunks,
    "otlp-json": otlp_chunks,
    "perfetto": perfetto_chunks,
}
BATCH = 512  # spans per OTLP request: well under a collector's default 4 MiB message limit


def export_file(lay: Layout, fmt: str, output: str | None, found: list[Finding] | None = None) -> None:
    """The verdict's culprit phase is flagged; ``found`` defaults to the verdicts at the run's last
    record (like the report: an old run is not judged by today's clock)."""
    found = findings(lay.run, lay.end) if found is None else found
    write_chunks(FORMATS[fmt](lay, found), output)


def send(lay: Layout, endpoint: str, protocol: str, headers: dict[str, str], timeout: float) -> int:
    """Send every span with the SDK's OTLP exporter; return how many went."""
    from ..render.otlp_spans import to_sdk_spans

    url = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(
            endpoint=url.netloc, insecure=url.scheme != "https", headers=headers, timeout=timeout
        )
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        path = url.path if url.path not in ("", "/") else "/v1/traces"
        exporter = OTLPSpanExporter(endpoint=url._replace(path=path).geturl(), headers=headers, timeout=timeout)
    from opentelemetry.sdk.trace.export import SpanExportResult

    spans = to_sdk_spans(lay, findings(lay.run, lay.end))
    try:
        for i in range(0, len(spans), BATCH):
            if exporter.export(spans[i : i + BATCH]) is not SpanExportResult.SUCCESS:
                raise CommandError(f"{endpoint} refused or did not answer ({protocol}); {i} of {len(spans)} spans sent")
    finally:
        exporter.shutdown()
    return len(spans)


class Export:
    name = "export"
    bulk = True
    help = "write a Jaeger, OTLP JSON or Perfetto file, or send the run to an OTLP collector"
    description = """\
Files:
  jaeger     Jaeger UI upload (Search → "JSON File"): one Jaeger process per rank
  otlp-json  OTLP/JSON, as POST /v1/traces accepts it (any OpenTelemetry collector)
  perfetto   Chrome trace-event JSON for ui.perfetto.dev or chrome://tracing: one track per rank
Phases that never ended are marked (open / "did not end") rather than dropped. The verdict's
culprit (the phase a stalled, dead or failed rank is in; that rank only) is flagged: Jaeger
error=true + phasetrace.verdict, OTLP status ERROR, Perfetto "⚠ STALL <phase>"; peers that wait
for it carry phasetrace.waiting_for.

  phasetrace export RUN_DIR --format perfetto -o startup.json
  phasetrace export RUN_DIR --endpoint http://localhost:4318            # OTLP/HTTP to a collector
  phasetrace export RUN_DIR --endpoint localhost:4317 --protocol grpc
  phasetrace export node0/RUN_DIR node1/RUN_DIR -o launch.json   # multi-node: one trace"""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help=RUN_DIRS_HELP)
        parser.add_argument(
            "--format", "-f", choices=sorted(FORMATS), default="jaeger", help="file format (default jaeger)"
        )
        parser.add_argument(
            "-o",
            "--output",
            metavar="FILE",
            help="output file, '-' for stdout (default: export-<format>.json in the first RUN_DIR)",
        )
        parser.add_argument("--endpoint", metavar="URL", help="send over OTLP to this collector instead of a file")
        parser.add_argument(
            "--protocol",
            choices=("http/protobuf", "grpc"),
            default="http/protobuf",
            help="OTLP protocol for --endpoint (default http/protobuf)",
        )
        parser.add_argument(
            "--header", action="append", default=[], metavar="KEY=VALUE", help="extra OTLP request header (repeatable)"
        )
        parser.add_argument(
            "--timeout", type=seconds, default=10.0, metavar="S", help="OTLP request timeout (default 10.0)"
        )

    def run(self, args: argparse.Namespace) -> int:
        split = not args.endpoint  # each lane's spans made where they were read
        lay = keep(layout(open_run(*args.run_dirs, split=split)))
        if args.endpoint:
            headers = dict(h.split("=", 1) for h in args.header if "=" in h)
            n = send(lay, args.endpoint, args.protocol, headers, args.timeout)
            print(printable(f"sent {n} spans from {len(lay.lanes)} processes to {args.endpoint} ({args.protocol})"))
            return complete(lay.run)
        output = args.output or str(Path(args.run_dirs[0]) / f"export-{args.format}.json")
        export_file(lay, args.format, output)
        if output != "-":
            print(f"wrote {output}")
        return complete(lay.run)
