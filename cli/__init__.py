"""The ``deniable`` command line: the composition root that wires client, shuffler and aggregator."""
