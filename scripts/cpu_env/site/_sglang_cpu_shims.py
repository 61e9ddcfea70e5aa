"""Process-start shims that let real SGLang import on a CPU-only machine (test/demo environment).

Loaded from ``sglang_cpu_shims.pth`` in every interpreter of the virtual environment, so spawned
SGLang ranks get them too. Costs one ``sys.meta_path`` entry; nothing is imported up front.

* ``sgl_kernel.<sub>``: served by the import-only stand-in (see ``sgl_kernel/__init__.py``).
* ``torchvision``: PyPI's build is for CUDA; its import registers fake kernels for ops its missing
  C extension would define. Defining the two op schemas first lets it import (ops stay unusable).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        import sgl_kernel

        module = types.ModuleType(spec.name)
        module.__getattr__ = sgl_kernel.__getattr__  # type: ignore[attr-defined]
        module.__path__ = []  # a package, so deeper submodules resolve too
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _ShimFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, _StandInLoader(), is_package=True)
        if fullname == "torchvision":
            _define_torchvision_ops()
        return None


_defined = False


def _define_torchvision_ops() -> None:
    global _defined
    if _defined:
        return
    _defined = True
    import torch

    lib = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        try:
            lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        except RuntimeError:  # already defined (a real extension loaded)
            pass
    sys.modules[__name__]._torchvision_lib = lib  # keep the registration alive


sys.meta_path.insert(0, _ShimFinder())
