"""The one CSPRNG: ranges, exact uniformity, fork safety, reproducible keyed streams, errors.

Every statistical assertion here states its false-failure rate: the probability that a
correct implementation fails it. All of them use the real ChaCha20 stream (unkeyed, from
``os.urandom``) unless the test is about reproducibility.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from scipy import stats

from deniable.core.rng import Csprng, default_rng

FALSE_FAILURE = 1e-6


def chi_square_uniform_ok(counts: Sequence[int] | np.ndarray, alpha: float = FALSE_FAILURE) -> bool:
    """Pearson chi-square test of equal cell probabilities at level ``alpha``."""
    observed = np.asarray(counts, dtype=np.float64)
    expected = observed.sum() / observed.size
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return statistic <= float(stats.chi2.isf(alpha, observed.size - 1))


def binomial_bounds(trials: int, probability: float, alpha: float = FALSE_FAILURE) -> tuple[int, int]:
    """Exact two-sided binomial acceptance region: P(X outside [lo, hi]) <= alpha."""
    lo = int(stats.binom.ppf(alpha / 2, trials, probability))
    hi = int(stats.binom.isf(alpha / 2, trials, probability))
    return lo, hi


# --------------------------------------------------------------------------- ranges


@pytest.mark.parametrize("bits", [*range(1, 20), 31, 32, 33, 63, 64, 65, 127, 128, 129, 200])
def test_randbits_range(bits: int) -> None:
    rng = default_rng()
    for _ in range(200):
        value = rng.randbits(bits)
        assert isinstance(value, int)
        assert 0 <= value < 1 << bits


def test_randbits_zero_bits_is_zero() -> None:
    assert default_rng().randbits(0) == 0


def test_randbits_reaches_the_top_bit() -> None:
    """The result uses the *top* ``bits`` bits of whole bytes: the highest bit must be set
    sometimes. False-failure rate 2**-400 per width (400 draws each with P(top bit) = 1/2)."""
    rng = default_rng()
    for bits in (1, 3, 7, 9, 13, 63):
        assert any(rng.randbits(bits) >> (bits - 1) for _ in range(400))


def test_randbits_three_bits_uniform() -> None:
    """Chi-square over the 8 values of randbits(3), 80,000 draws; false-failure rate 1e-6."""
    rng = default_rng()
    counts = np.bincount([rng.randbits(3) for _ in range(80_000)], minlength=8)
    assert counts.size == 8
    assert chi_square_uniform_ok(counts)


def test_randbelow_range() -> None:
    rng = default_rng()
    for upper in (1, 2, 3, 7, 255, 256, 257, 2**32 - 1, 2**64 + 3, 3 * 2**100):
        for _ in range(100):
            value = rng.randbelow(upper)
            assert isinstance(value, int)
            assert 0 <= value < upper
    assert all(rng.randbelow(1) == 0 for _ in range(10))


def test_randbelow_seven_uniform() -> None:
    """Chi-square over randbelow(7), 70,000 draws (df 6); false-failure rate 1e-6.

    7 is not a power of two, so a modulo-reduction or a wrong rejection bound would skew it.
    """
    rng = default_rng()
    counts = np.bincount([rng.randbelow(7) for _ in range(70_000)], minlength=7)
    assert counts.size == 7
    assert chi_square_uniform_ok(counts)


def test_randbelow_large_upper_uniform_in_its_top_part() -> None:
    """randbelow(3 * 2**100) // 2**100 is uniform on {0, 1, 2}; 30,000 draws; false-failure 1e-6."""
    rng = default_rng()
    counts = np.bincount([rng.randbelow(3 * 2**100) >> 100 for _ in range(30_000)], minlength=3)
    assert counts.size == 3
    assert chi_square_uniform_ok(counts)


def test_randbelow_array_range_and_dtype() -> None:
    rng = default_rng()
    for upper in (1, 2, 7, 1000, 2**31 + 11, 2**62):
        values = rng.randbelow_array(upper, 5000)
        assert values.dtype == np.int64
        assert values.shape == (5000,)
        assert int(values.min()) >= 0
        assert int(values.max()) < upper
    assert rng.randbelow_array(7, 0).shape == (0,)
    assert not rng.randbelow_array(1, 100).any()


def test_randbelow_array_seven_uniform() -> None:
    """Chi-square over randbelow_array(7, 70,000) (df 6); false-failure rate 1e-6."""
    counts = np.bincount(default_rng().randbelow_array(7, 70_000), minlength=7)
    assert counts.size == 7
    assert counts.sum() == 70_000
    assert chi_square_uniform_ok(counts)


def test_randbelow_array_large_upper_uniform_in_its_top_part() -> None:
    """randbelow_array(3 * 2**60) >> 60 is uniform on {0, 1, 2}; 60,000 draws; false-failure 1e-6."""
    values = default_rng().randbelow_array(3 << 60, 60_000)
    assert int(values.max()) < 3 << 60
    counts = np.bincount(values >> 60, minlength=3)
    assert counts.size == 3
    assert chi_square_uniform_ok(counts)


# --------------------------------------------------------------------------- bernoulli


@pytest.mark.parametrize("probability", [Fraction(1, 3), Fraction(2**64 - 1, 2**65), Fraction(999, 1000)])
def test_bernoulli_frequency(probability: Fraction) -> None:
    """300,000 draws fall inside the exact binomial acceptance region; false-failure rate 1e-6."""
    rng = default_rng()
    trials = 300_000
    hits = sum(rng.bernoulli(probability) for _ in range(trials))
    lo, hi = binomial_bounds(trials, float(probability))
    assert lo <= hits <= hi


def test_bernoulli_extremes_are_exact() -> None:
    rng = default_rng()
    assert not any(rng.bernoulli(Fraction(0)) for _ in range(2000))
    assert all(rng.bernoulli(Fraction(1)) for _ in range(2000))


# --------------------------------------------------------------------------- permutation


@pytest.mark.parametrize("count", [0, 1, 2, 3, 10, 1000, 100_003])
def test_permutation_is_a_permutation(count: int) -> None:
    order = default_rng().permutation(count)
    assert order.dtype == np.int64
    assert order.shape == (count,)
    assert np.array_equal(np.sort(order), np.arange(count))


def test_permutation_uniform_over_the_24_orders_of_four() -> None:
    """48,000 permutations of 4 items: chi-square over the 24 orders (df 23); false-failure 1e-6."""
    rng = default_rng()
    index = {order: i for i, order in enumerate(itertools.permutations(range(4)))}
    counts = np.zeros(24, dtype=np.int64)
    for _ in range(48_000):
        counts[index[tuple(int(x) for x in rng.permutation(4))]] += 1
    assert chi_square_uniform_ok(counts)


def test_permutation_large_is_not_identity_and_varies() -> None:
    """Two permutations of 10,000 items equal to each other or to the identity: probability
    (1/10000!) — never, for a working shuffle."""
    rng = default_rng()
    first, second = rng.permutation(10_000), rng.permutation(10_000)
    assert not np.array_equal(first, np.arange(10_000))
    assert not np.array_equal(first, second)


# --------------------------------------------------------------------------- keyed streams


def test_keyed_stream_is_reproducible() -> None:
    key = bytes(range(32))
    first, second = Csprng(key=key), Csprng(key=key)
    assert first.bytes(1000) == second.bytes(1000)
    assert first.randbelow(10**30) == second.randbelow(10**30)
    assert np.array_equal(first.permutation(500), second.permutation(500))
    assert np.array_equal(first.randbelow_array(1000, 300), second.randbelow_array(1000, 300))
    assert Csprng(key=bytes(32)).bytes(64) != Csprng(key=key).bytes(64)


def _chacha20_chunks(key: bytes, length: int) -> bytes:
    """The documented keystream from raw ChaCha20: chunk i is nonce i (96-bit little-endian),
    counters 1 to 1024 (the bytes PyNaCl's ChaCha20-Poly1305 gives too, ADR 0039)."""
    chunks = []
    for index in range(-(-length // 65_536)):
        nonce = (1).to_bytes(4, "little") + index.to_bytes(12, "little")
        chunks.append(Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor().update(bytes(65_536)))
    return b"".join(chunks)[:length]


def test_keyed_stream_is_the_chacha20_keystream_whatever_the_chunking() -> None:
    """Reads of odd sizes that cross the 64 KiB refill boundary give exactly the keystream."""
    key = b"\x5a" * 32
    reference = _chacha20_chunks(key, 300_000)
    rng = Csprng(key=key)
    out = bytearray()
    sizes = itertools.cycle([1, 7, 65_535, 3, 65_537, 0, 40_000])
    while len(out) < len(reference):
        out += rng.bytes(min(next(sizes), len(reference) - len(out)))
    assert bytes(out) == reference


def test_unkeyed_generators_differ() -> None:
    assert Csprng().bytes(32) != Csprng().bytes(32)
    assert default_rng() is default_rng()


# --------------------------------------------------------------------------- fork safety


def _in_child(draw: Callable[[], bytes], timeout: float = 20.0) -> bytes:
    """Fork; the child returns ``draw()`` through a pipe. Fails if the child hangs or dies."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        status = 1
        try:
            os.close(read_fd)
            os.write(write_fd, draw())
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read_fd)
            pytest.fail(f"forked child did not finish within {timeout} s (deadlock?)")
        time.sleep(0.01)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    assert os.waitstatus_to_exitcode(status) == 0
    return data


def test_forked_child_draws_a_different_stream_from_default_rng() -> None:
    """Without re-keying, the child's next bytes would equal the parent's next bytes exactly."""
    rng = default_rng()
    rng.bytes(5)  # some state in the parent before forking
    child = _in_child(lambda: default_rng().bytes(32))
    parent = rng.bytes(32)
    assert len(child) == 32
    assert child != parent
    assert _in_child(lambda: default_rng().bytes(32)) != child


def test_forked_child_of_a_private_unkeyed_instance_draws_a_different_stream() -> None:
    """The class promises re-keying after fork; an unkeyed instance other than the default must
    not replay its parent's stream in a child (e.g. a worker process forked by a service)."""
    rng = Csprng()
    rng.bytes(5)
    child = _in_child(lambda: rng.bytes(32))
    assert child != rng.bytes(32)


def test_fork_while_another_thread_draws_does_not_deadlock_the_child() -> None:
    """A service thread may be inside ``bytes()`` (holding the generator's lock) at the moment
    another thread forks. The child's at-fork re-keying must not wait on that lock forever."""
    rng = default_rng()
    stop = threading.Event()

    def keep_drawing() -> None:
        while not stop.is_set():
            rng.bytes(1 << 22)

    worker = threading.Thread(target=keep_drawing, daemon=True)
    worker.start()
    try:
        time.sleep(0.05)
        for _ in range(3):
            assert len(_in_child(lambda: default_rng().bytes(16), timeout=5.0)) == 16
    finally:
        stop.set()
        worker.join()


# --------------------------------------------------------------------------- errors


def test_bad_arguments_raise() -> None:
    rng = default_rng()
    with pytest.raises(ValueError):
        Csprng(key=bytes(31))
    with pytest.raises(ValueError):
        Csprng(key=bytes(33))
    with pytest.raises(ValueError):
        rng.bytes(-1)
    assert rng.bytes(0) == b""
    for upper in (0, -1, -(2**70)):
        with pytest.raises(ValueError):
            rng.randbelow(upper)
    for upper in (0, -3, 2**62 + 1, 2**64):
        with pytest.raises(ValueError):
            rng.randbelow_array(upper, 10)
    with pytest.raises(ValueError):
        rng.randbelow_array(7, -1)
    with pytest.raises(ValueError):
        rng.uint64_array(-1)
    with pytest.raises(ValueError):
        rng.permutation(-1)
    for probability in (Fraction(-1, 3), Fraction(4, 3)):
        with pytest.raises(ValueError):
            rng.bernoulli(probability)
