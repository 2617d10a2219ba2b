"""One exception type for user-facing errors: the CLI prints its message on one line and exits 2."""


class UserError(Exception):
    """Bad input the user can fix (unknown task, malformed spec, missing data ...).

    The message must be one line and name the fix.
    """

    exit_code = 2
