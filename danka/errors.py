"""One exception type for bad user input: the CLI prints it and exits with code 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: config, data row, reward function, checkpoint.

    ``where`` names the file, key or line; ``fix`` says what to change. The CLI prints
    ``str(err)`` (no traceback unless ``--debug``) and exits with code 2.
    """

    exit_code = 2

    def __init__(self, what: str, where: str | None = None, fix: str | None = None):
        self.what, self.where, self.fix = what, where, fix
        text = f"{where}: {what}" if where else what
        if fix:
            text += f"\n  fix: {fix}"
        super().__init__(text)
