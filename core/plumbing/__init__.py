"""Service plumbing shared by the services and the SDK: TLS, roles, gRPC server, metrics, logs, health.

Kept apart from the privacy kernel (mechanisms, accounting, wire, crypto, rng): nothing here decides
what a device reports or what guarantee holds.
"""
