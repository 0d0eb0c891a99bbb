"""Started by every Python process a mutmut test starts (tests/mutation/subprocess_stats.py puts this
folder on PYTHONPATH): during mutmut's stats run, writes which mutated functions this process called.

mutmut records a call of a mutated function (a "trampoline hit") in a set of the process that makes
it, so the calls made in a test's subprocesses (``runpytest_subprocess``, xdist workers, ``--testmon``
runs, ``ray start`` nodes) were lost and their functions had "no tests". Each name is appended to
``$MUTMUT_SUBPROCESS_HITS/<pid>.txt`` the first time this process calls it, not at exit: xdist workers
and Ray nodes may end by a signal or ``os._exit``, which skip exit handlers.
"""

import os

if os.environ.get("MUTANT_UNDER_TEST") == "stats" and os.environ.get("MUTMUT_SUBPROCESS_HITS"):
    import mutmut.mutation.trampoline as _trampoline

    _hits_file = os.path.join(os.environ["MUTMUT_SUBPROCESS_HITS"], f"{os.getpid()}.txt")
    _seen: set[str] = set()

    def _record_hit(name: str, caller: str | None = None) -> None:
        if name not in _seen:
            _seen.add(name)
            with open(_hits_file, "a", encoding="utf-8") as hits:
                hits.write(name + "\n")

    _trampoline.record_trampoline_hit = _record_hit
