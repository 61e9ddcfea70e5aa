"""This machine's part of a bug-report bundle (``phasetrace bundle``): versions (Python, SGLang,
torch and its CUDA, NCCL, the driver), the allowlisted environment variables, ``nvidia-smi -q`` and
the kernel log's OOM/Xid lines, each redacted; what cannot be read is said, never fatal."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ..journal.tail import read_regular
from ..redact import REDACTED, is_secret_key, redact_text
from .bundle_archive import Bundle

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
