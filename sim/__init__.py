"""Simulation: drive simulated devices through the real services (demo, benchmarks, load test).

Usable from Python without the CLI, e.g. from a notebook; ``deniable demo|bench|loadtest`` are thin
shells over the functions here.
"""
