"""``tb-to-json``, run as a script from a checkout: ``uv run python tests/json_dump_tb_logs.py ...``.

The code lives in ``posttrain.testing.tb_to_json`` (installed as the ``tb-to-json`` command); this file
keeps the path that functional scripts, CI and NeMo-RL-style recipes call.
"""

import sys

from posttrain.testing.tb_to_json import main

if __name__ == "__main__":
    sys.exit(main())
