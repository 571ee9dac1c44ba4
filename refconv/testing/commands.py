"""The ``refconv`` command line run inside a test's process (pytest's ``capsys`` captures it).

``status, out, err = run_command(capsys, "train", "--model", "bad.yaml")``; a refused command
prints exactly one line and no traceback: ``line = only_line(err)``.
"""

from refconv import cli


def run_command(capsys, *argv):
    """``refconv ARGV`` in this process: ``(status, stdout, stderr)``; a ``SystemExit`` is its status."""
    try:
        status = cli.main(list(argv))
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    return status, out, err


def only_line(err):
    """The one non-empty line of ``err``; asserts there is exactly one, and no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]
