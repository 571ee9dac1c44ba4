"""What the install gives a user outside this repository: a one-line error when the python
running refconv lacks mpi4py, and the ``simulated`` marker registered by the pytest plugin
(the ``pytest11`` entry point), so a repository of one's own needs no pytest configuration."""

import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_a_python_without_mpi4py_gets_one_line_naming_the_venv():
    # sys.modules["mpi4py"] = None makes `import mpi4py` raise ModuleNotFoundError, as on the system python3
    done = subprocess.run([sys.executable, "-c", "import sys; sys.modules['mpi4py'] = None; import refconv"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "refconv needs mpi4py" in lines[0] and ".venv/bin/python" in lines[0], lines[0]
    assert "Traceback" not in done.stderr


def test_the_simulated_marker_needs_no_configuration_in_a_repository_of_ones_own(tmp_path):
    (tmp_path / "test_x.py").write_text(textwrap.dedent("""\
        from refconv.testing.ranks import on_ranks

        @on_ranks(1)
        def test_one_rank(comm):
            assert comm.size == 1
        """))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--strict-markers",
                           "-W", "error::pytest.PytestUnknownMarkWarning", "test_x.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout, done.stdout
    assert not (tmp_path / "pyproject.toml").exists() and not (tmp_path / "conftest.py").exists()


def test_the_plugin_is_what_registers_the_marker():
    """The repository's own pyproject no longer lists the marker: the plugin is its only source."""
    text = (ROOT / "pyproject.toml").read_text()
    assert '"simulated:' not in text
    assert 'refconv = "refconv.testing.plugin"' in text
