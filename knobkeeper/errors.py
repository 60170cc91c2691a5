"""The one error type a user sees: one line, names what is wrong and what is accepted."""

import os


class UserError(Exception):
    """Bad input or a state the command cannot act on. The CLI prints it and exits 2."""

    exit_code = 2


def code_error(where: str, exc: BaseException, path: object) -> str:
    """One line for an exception that user code (an inventory, group data) raised while it ran:
    `inventory/new.py: line 3: SyntaxError: invalid syntax`, the line being the one in `path` (the
    file that was run) where it happened; without it when the file's own lines are not in it."""
    target = os.path.realpath(str(path))
    line = None
    text = str(exc)
    if isinstance(exc, SyntaxError) and exc.filename and os.path.realpath(exc.filename) == target:
        line, text = exc.lineno, exc.msg
    else:
        tb = exc.__traceback__
        while tb is not None:  # the innermost frame of the file itself: its own line, not a library's
            if os.path.realpath(tb.tb_frame.f_code.co_filename) == target:
                line = tb.tb_lineno
            tb = tb.tb_next
    return f"{where}: {'line ' + str(line) + ': ' if line else ''}{type(exc).__name__}: {text}"
