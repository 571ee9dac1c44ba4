"""What stops inside a simulated rank (docs/debugging-ranks.md, "What stops inside a rank").

``python -m pdb`` traces only the thread it runs the script in (``sys.settrace`` is per thread),
and the ranks are threads started later: a breakpoint set with ``b file:line`` on a line a rank
runs never stops, one on a line the main thread runs does.  The page says so; this pins it."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""\
    from refconv import simulated


    def body(comm):
        doubled = 2 * comm.rank          # line 5: runs on the rank threads
        return doubled


    def serial(k):
        tripled = 3 * k                  # line 10: runs on the main thread
        return tripled


    print("results", simulated.run(body, 2, stepped=True), serial(1))
    """)


def test_python_m_pdb_stops_outside_the_ranks_but_not_inside(tmp_path):
    (tmp_path / "ranks_pdb.py").write_text(SCRIPT)
    keys = "b ranks_pdb.py:5\nb ranks_pdb.py:10\nc\nc\nq\n"
    done = subprocess.run([sys.executable, "-m", "pdb", "ranks_pdb.py"], input=keys, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    out = done.stdout
    assert "Breakpoint 1 at" in out and "Breakpoint 2 at" in out, out
    assert "ranks_pdb.py(10)serial()" in out, out            # the main thread's breakpoint stops
    assert "ranks_pdb.py(5)body()" not in out, out            # the rank's never does
    assert "results [0, 2] 3" in out, out                     # and the run went through it
