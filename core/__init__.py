"""Shared core: mechanisms, accounting, wire codec, HPKE envelope and the one CSPRNG.

Imported by the client, the shuffler and the aggregator; imports none of them.
"""
