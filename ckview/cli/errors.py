"""Errors that the CLI reports as one line and exit code 2."""


class CLIError(Exception):
    """Bad input from the user: the message says what is wrong and what to do."""


EXIT_USAGE = 2
