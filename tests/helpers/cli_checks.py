"""Assertions shared by the CLI tests (imported as ``from cli_checks import ...``)."""


def assert_one_line_error(result, *fragments):
    """A click result that is exit 2 with one 'error:' line, last (progress notes may precede
    it), no traceback, and each of ``fragments`` in that line."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.output
    assert "Traceback" not in result.output and result.exc_info[0] is SystemExit
    for f in fragments:
        assert f in errors[0], (f, errors[0])
