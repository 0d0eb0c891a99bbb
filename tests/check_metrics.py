"""``check-metrics``, run as a script from a checkout: ``uv run python tests/check_metrics.py ...``.

The code lives in ``posttrain.testing.check_metrics`` (installed as the ``check-metrics`` command); this file
keeps the path that functional scripts, CI and NeMo-RL-style recipes call.
"""

import sys

from posttrain.testing.check_metrics import main

if __name__ == "__main__":
    sys.exit(main())
