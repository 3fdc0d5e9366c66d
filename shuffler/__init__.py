"""The shuffler: checks envelopes, spools them durably, forwards CSPRNG-permuted batches; never decrypts."""

from deniable.shuffler.server import RunningShuffler, ShufflerConfig, serve_shuffler, start_shuffler

__all__ = ["RunningShuffler", "ShufflerConfig", "serve_shuffler", "start_shuffler"]
