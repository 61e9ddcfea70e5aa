"""``python -m sglang_phasetrace.tracing.cli`` — the same as the ``phasetrace`` command."""

import sys

from . import main

sys.exit(main())
