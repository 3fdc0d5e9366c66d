"""Operator actions on a running deployment, usable from Python without the CLI.

Each function is async, takes the service's address and a ``ClientTls`` (None: plaintext, for a
service run with --insecure) and returns the service's answer; the ``deniable`` command prints it.
"""
