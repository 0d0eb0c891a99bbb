"""Ray: cluster start-up, placement groups, worker groups.

Under ``uv run``, Ray would rebuild every worker's environment through uv (slow, and it
needs the network) unless this is off; it is read when ``ray`` is imported, so it is set
here, before any module of this package imports ray.
"""

import os

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
