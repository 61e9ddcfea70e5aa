"""Import-only stand-in for ``sgl_kernel`` on CPU-only machines (test/demo environment only).

PyPI has no CPU build of ``sgl_kernel``. SGLang's CPU engine imports a few of its names at import
time but, on CPUs without Intel AMX, computes with torch-native code. Every attribute here is a
callable that raises ``NotImplementedError`` when called, except ``copy_all_layer_kv_cache_cpu``,
which SGLang's CPU engine calls during init. Submodules (``sgl_kernel.flash_attn`` …) are served
by the same stand-in through ``_sglang_cpu_shims``.
"""

from __future__ import annotations

import ctypes
from typing import Any

__version__ = "0.0.0+cpu-stand-in"


def copy_all_layer_kv_cache_cpu(data_ptrs: Any, strides: Any, tgt_loc: Any, src_loc: Any) -> None:
    """Reference implementation: in every layer buffer, copy row ``src`` onto row ``tgt``."""
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        for tgt, src in zip(tgt_loc.tolist(), src_loc.tolist(), strict=True):
            ctypes.memmove(ptr + tgt * stride, ptr + src * stride, stride)


class _Missing:
    """A kernel that does not exist on this machine: importable, fails only when called."""

    def __init__(self, name: str) -> None:
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"sgl_kernel.{self.__name__} has no CPU implementation (stand-in)")

    def __getattr__(self, name: str) -> _Missing:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self.__name__}.{name}")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Missing(name)
