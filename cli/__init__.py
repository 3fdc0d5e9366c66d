"""The ``deniable`` command line: one thin module per command, over the services, ``deniable.admin``
and ``deniable.sim``."""
