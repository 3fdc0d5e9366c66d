"""Errors shared by every service."""


class ConfigurationError(Exception):
    """A service cannot start as configured (port taken, unwritable directory, missing key).

    The message is one line that tells the operator what to change.
    """
