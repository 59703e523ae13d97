"""A member for tests/launch/test_ft_launch.py: the example's training, whose replacements fail.

    commlayer run --ft -n 4 tests/launch/ft_launch_ranks.py MARK_FILE [example arguments]

The first start of every member trains like examples/fault_tolerant_training.py; a replacement
(``$COMMLAYER_FT_SLOT_RESTART`` > 0) writes the time to MARK_FILE and exits 1 before joining,
as a member whose restart keeps failing would.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fault_tolerant_training.py"

if __name__ == "__main__":
    mark = Path(sys.argv.pop(1))
    if int(os.environ.get("COMMLAYER_FT_SLOT_RESTART") or 0) > 0:
        mark.write_text(str(time.time()))
        raise SystemExit("ft_launch_ranks: this replacement cannot start")
    runpy.run_path(str(EXAMPLE), run_name="__main__")
