"""Operator actions on a running deployment, usable from Python without the CLI (ADR 0025).

Each action is an async function that takes the service's address and a ``ClientTls`` (None:
plaintext, for a service run with --insecure) and returns the service's answer; the ``deniable``
command only prints it. Modules: ``campaigns``, ``keys``, ``queries``, ``shuffler`` (spool, flush),
``status``, ``health``, ``privacy`` (amplification and δ(ε) tables), ``windows``, ``rpc``.
"""
