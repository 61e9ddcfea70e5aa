"""The PYTHONPATH entry without an installed package: it maps ``sglang_phasetrace`` onto the
repository it sits in, so a source checkout works with nothing but ``PYTHONPATH``."""

from __future__ import annotations

import subprocess
import sys
import sysconfig

from conftest import HOOKS, ROOT

# ``python -S``: site-packages on the path, but none of its .pth files (so no editable install)
PROBE = f"""
import sys
sys.path.append({sysconfig.get_paths()["purelib"]!r})
sys.path.insert(0, {str(HOOKS)!r})
import _phasetrace_boot
package = _phasetrace_boot._package()
import sglang_phasetrace.tracing.bootstrap as bootstrap, sglang_phasetrace.patches as patches
print(package.__path__[0], bootstrap.__file__, patches.__file__)
"""


def test_source_checkout_maps_the_package_onto_the_repository() -> None:
    out = subprocess.run([sys.executable, "-S", "-c", PROBE], capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(ROOT), str(ROOT / "tracing" / "bootstrap.py"), str(ROOT / "patches" / "__init__.py")]
