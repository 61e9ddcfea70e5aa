"""sglang-phasetrace: put this folder on PYTHONPATH to trace SGLang startup in every process."""
import _phasetrace_boot

try:
    _phasetrace_boot.install()
except Exception as exc:  # never raise into the host process
    _phasetrace_boot.warn(f"tracing disabled: {exc!r}")
_phasetrace_boot.chain_sitecustomize()
