"""The one error type a user sees: one line, names what is wrong and what is accepted."""


class UserError(Exception):
    """Bad input or a state the command cannot act on. The CLI prints it and exits 2."""

    exit_code = 2
