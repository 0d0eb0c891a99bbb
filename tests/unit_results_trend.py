"""``unit-results-trend``, run as a script from a checkout: ``uv run python tests/unit_results_trend.py ...``.

The code lives in ``posttrain.testing.results_trend`` (installed as the ``unit-results-trend`` command); this file
keeps the path that functional scripts, CI and NeMo-RL-style recipes call.
"""

import sys

from posttrain.testing.results_trend import main

if __name__ == "__main__":
    sys.exit(main())
