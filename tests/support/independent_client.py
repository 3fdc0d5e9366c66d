"""A second, independent client written from docs/wire.md alone: no deniable import.

Only the standard library, ``struct`` for the layout and ``cryptography`` for HPKE. Two uses:

    python tests/support/independent_client.py check tests/vectors
        recompute every local randomiser's thresholds and payloads (binary_rr, grr, sue, oue,
        subset_selection, hadamard_response, olh at g = 4), every shuffle-only protocol's
        messages (cheu_binary_sum, sample_and_threshold, balcer_cheu_histogram,
        multi_message_sum(_binomial), multi_message_histogram, flooded_histogram: wire.md §6.8
        and §6.9, from the campaign params alone), the plaintexts and the HPKE info of the golden
        vectors, and open their ciphertexts; exit 1 on the first mismatch
    python tests/support/independent_client.py seal PUBLIC_KEY_HEX CAMPAIGN_ID KEY_ID PLAINTEXT_LENGTH \
        MECHANISM EPSILON0 DOMAIN_SIZE VALUE INCARNATION_HEX
        print the hex ciphertext (enc || ct) of one fresh report
    python tests/support/independent_client.py seal-messages PUBLIC_KEY_HEX CAMPAIGN_ID KEY_ID \
        PLAINTEXT_LENGTH MECHANISM DOMAIN_SIZE VALUE INCARNATION_HEX PARAMS_JSON
        one fresh answer of a shuffle-only protocol (wire.md §6.8, §6.9): each message sealed
        apart with its own report id, one hex ciphertext per line
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

SCALE = 1 << 64
OTHER_WEIGHT = 1 << 40
SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
Draw = Callable[[int], bytes]


def exp_lower_bound(x: float) -> Fraction:
    """wire.md §6.0: Taylor terms summed until k > x and term < 2**-96 * total, floored to 2**-64."""
    exact, total, term, k = Fraction(x), Fraction(0), Fraction(1), 0
    while True:
        total += term
        k += 1
        term = term * exact / k
        if k > exact and term < Fraction(1, 1 << 96) * total:
            return Fraction(math.floor(total * SCALE), SCALE)


def randbits(draw: Draw, bits: int) -> int:
    """wire.md §6.0: ceil(bits/8) bytes, big-endian, shifted right to ``bits`` bits."""
    return int.from_bytes(draw((bits + 7) // 8), "big") >> ((8 - bits % 8) % 8)


def randbelow(draw: Draw, upper: int) -> int:
    """wire.md §6.0: rejection on bit_length(upper) bits."""
    while (candidate := randbits(draw, upper.bit_length())) >= upper:
        pass
    return candidate


def payload_length(domain_size: int) -> int:
    return max(1, (max(domain_size - 1, 1).bit_length() + 7) // 8)


def randomise(
    mechanism: str, epsilon0: float, d: int, value: int, draw: Draw
) -> tuple[bytes, dict[str, int]]:
    """wire.md §6.1 and §6.2: binary_rr and grr; the payload and the thresholds used."""
    bound = exp_lower_bound(epsilon0)
    if mechanism == "binary_rr":
        keep = math.floor(SCALE * bound / (1 + bound))
        flip = int(randbits(draw, 64) >= keep)
        return bytes([value ^ flip]), {"keep_threshold": keep}
    if mechanism == "grr":
        keep_weight = math.floor(bound * OTHER_WEIGHT)
        total = keep_weight + (d - 1) * OTHER_WEIGHT
        r = randbelow(draw, total)
        other_index = max(r - keep_weight, 0) // OTHER_WEIGHT
        other = other_index + int(other_index >= value)
        keep = int(r < keep_weight)
        chosen = keep * value + (1 - keep) * other  # selected arithmetically, no branch on the value
        return chosen.to_bytes(payload_length(d), "big"), {"keep_weight": keep_weight, "total_weight": total}
    if mechanism in ("sue", "oue"):
        return unary(mechanism, bound, d, value, draw)
    if mechanism == "subset_selection":
        return subset(epsilon0, bound, d, value, draw)
    if mechanism == "hadamard_response":
        return hadamard(bound, d, value, draw)
    if mechanism == "olh":
        return olh(bound, d, value, draw)
    raise SystemExit(f"this client does not implement {mechanism}")


def bitmap(d: int, members: list[int]) -> bytes:
    """wire.md §6.3: category j is bit 7 - j % 8 of byte j // 8; spare bits zero."""
    out = bytearray((d + 7) // 8)
    for j in members:
        out[j // 8] |= 0x80 >> (j % 8)
    return bytes(out)


def unary(mechanism: str, bound: Fraction, d: int, value: int, draw: Draw) -> tuple[bytes, dict[str, int]]:
    """wire.md §6.3: thresholds A, Z; d little-endian 64-bit words; bit j = w_j < Z + [j = v](A - Z)."""
    if mechanism == "sue":
        n, m = bound.numerator, bound.denominator
        low, high = SCALE // 2, SCALE - 1
        if high * high * m <= n * (SCALE - high) ** 2:
            low = high
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if mid * mid * m <= n * (SCALE - mid) ** 2 else (low, mid)
        own, other = low, SCALE - low
    else:
        own, other = SCALE // 2, math.ceil(SCALE / (1 + bound))
    words = [struct.unpack("<Q", draw(8))[0] for _ in range(d)]
    members = [j for j in range(d) if words[j] < other + int(j == value) * (own - other)]
    return bitmap(d, members), {"own_threshold": own, "other_threshold": other}


def subset(epsilon0: float, bound: Fraction, d: int, value: int, draw: Draw) -> tuple[bytes, dict[str, int]]:
    """wire.md §6.4 with the default subset size."""
    omega = max(1, round(d / (math.exp(epsilon0) + 1)))
    threshold = math.floor(SCALE * bound * omega / (bound * omega + d - omega))
    include = int(randbits(draw, 64) < threshold)
    moved: dict[int, int] = {}
    picks = []
    for j in range(omega):
        r = j + randbelow(draw, d - 1 - j)
        picks.append(moved.get(r, r))
        moved[r] = moved.get(j, j)
    chosen = [p + int(p >= value) for p in picks]
    chosen[-1] = include * value + (1 - include) * chosen[-1]
    return bitmap(d, chosen), {"include_threshold": threshold, "subset_size": omega}


def hadamard(bound: Fraction, d: int, value: int, draw: Draw) -> tuple[bytes, dict[str, int]]:
    """wire.md §6.5."""
    order = 1 << d.bit_length()
    threshold = math.floor(SCALE * bound / (1 + bound))
    inside = int(randbits(draw, 64) < threshold)
    pos = randbits(draw, order.bit_length() - 2)
    w = value + 1
    m = w & -w
    low = m - 1
    base = ((pos - (pos & low)) << 1) | (pos & low)
    inner = base | ((bin(base & w).count("1") & 1) * m)
    index = inside * inner + (1 - inside) * (inner ^ m)
    width = (order.bit_length() - 1 + 7) // 8
    return index.to_bytes(width, "big"), {"inside_threshold": threshold, "order": order}


def gf_tables(p: int, k: int) -> tuple[Callable[[int, int], int], Callable[[int, int], int]]:
    """wire.md §6.6: GF(p^k) add and multiply, modulo the first primitive x^k + sum c_i x^i."""
    q = p**k

    def poly_mul(a: int, b: int, coeffs: list[int]) -> int:
        da = [(a // p**i) % p for i in range(k)]
        db = [(b // p**i) % p for i in range(k)]
        prod = [0] * (2 * k - 1)
        for i, x in enumerate(da):
            for j, y in enumerate(db):
                prod[i + j] = (prod[i + j] + x * y) % p
        for top in range(2 * k - 2, k - 1, -1):  # x^k = -sum c_i x^i
            c, prod[top] = prod[top], 0
            for i in range(k):
                prod[top - k + i] = (prod[top - k + i] - c * coeffs[i]) % p
        return sum(prod[i] * p**i for i in range(k))

    for low in range(1, q):
        coeffs = [(low // p**i) % p for i in range(k)]
        if coeffs[0] == 0:
            continue
        x, power, order = p if k > 1 else 1, 1, 0
        while True:
            power, order = poly_mul(power, x, coeffs), order + 1
            if power == 1:
                break
        if order == q - 1:
            break

    def add(a: int, b: int) -> int:
        return sum((((a // p**i) + (b // p**i)) % p) * p**i for i in range(k))

    return add, lambda a, b: poly_mul(a, b, coeffs)


def olh(bound: Fraction, d: int, value: int, draw: Draw) -> tuple[bytes, dict[str, int]]:
    """wire.md §6.6 with g = 4 (the vectors' g at epsilon0 = 1): p = 2, k = 2."""
    g, p, k = 4, 2, 2
    add, mul = gf_tables(p, k)
    powers = [1]
    while powers[-1] < d:
        powers.append(powers[-1] * g)
    r = len(powers) - 1
    offsets = [(pw - 1) // (g - 1) for pw in powers]
    seeds = offsets[r]
    s = randbelow(draw, seeds)
    keep_weight = math.floor(bound * OTHER_WEIGHT)
    total = keep_weight + (g - 1) * OTHER_WEIGHT
    r2 = randbelow(draw, total)
    lead = sum(1 for i in range(1, r) if offsets[i] <= s)
    low = s - offsets[lead]
    y = (value // powers[lead]) % g
    for i in range(r):
        y = add(y, mul((low // powers[i]) % g, (value // powers[i]) % g))
    keep = int(r2 < keep_weight)
    other_index = max(r2 - keep_weight, 0) // OTHER_WEIGHT
    chosen = keep * y + (1 - keep) * (other_index + int(other_index >= y))
    seed_bytes = max(1, ((seeds - 1).bit_length() + 7) // 8)
    bucket_bytes = max(1, ((g - 1).bit_length() + 7) // 8)
    payload = s.to_bytes(seed_bytes, "big") + chosen.to_bytes(bucket_bytes, "big")
    return payload, {"keep_weight": keep_weight, "total_weight": total, "seeds": seeds, "g": g}


# --------------------------------------------------------------------------- wire.md §6.8: multi-message

GRID_BITS = 52


def u64le(draw: Draw) -> int:
    """wire.md §6.0: 8 bytes as a little-endian integer."""
    return int(struct.unpack("<Q", draw(8))[0])


def width_for(largest: int) -> int:
    """wire.md §6.8: bytes of a big-endian message holding 0..largest."""
    return max(1, (max(largest, 1).bit_length() + 7) // 8)


def grid_fraction(value: float) -> Fraction:
    """wire.md §6.8: the exact double rounded up to a multiple of 2**-52, in lowest terms."""
    return Fraction(math.ceil(Fraction(value) * (1 << GRID_BITS)), 1 << GRID_BITS)


def randbelow_batch(draw: Draw, upper: int, count: int) -> list[int]:
    """wire.md §6.0 batch rejection: rounds of need + need // 4 + 16 words, top bits, first accepted."""
    bits = upper.bit_length()
    out: list[int] = []
    while len(out) < count:
        need = count - len(out)
        words = [u64le(draw) >> (64 - bits) for _ in range(need + need // 4 + 16)]
        out += [w for w in words if w < upper][:need]
    return out


def bernoulli_batch(draw: Draw, probability: Fraction, count: int) -> list[int]:
    """wire.md §6.0: randbelow_batch(denominator) < numerator, the fraction in lowest terms."""
    return [int(u < probability.numerator) for u in randbelow_batch(draw, probability.denominator, count)]


def polya_positive(draw: Draw, p: Fraction, shares: int, alpha: Fraction) -> int:
    """wire.md §6.8.1: inversion of U (64 bits at a time) against F_k, exactly."""
    scale, shape = (1 - p) / p, Fraction(1, shares)
    word, bits = randbits(draw, 64), 64
    while True:
        low, high = Fraction(word, 1 << bits), Fraction(word + 1, 1 << bits)
        k, coefficient, power, cumulative = 1, shape, alpha, Fraction(0)
        while True:
            cumulative += coefficient * power
            boundary = scale * cumulative
            if high <= boundary:
                return k
            if low < boundary:
                break  # U's interval holds F_k: read 64 more bits
            coefficient *= (shape + k) / (k + 1)
            power *= alpha
            k += 1
        word, bits = (word << 64) | randbits(draw, 64), bits + 64


def polya_batch(draw: Draw, p: Fraction, shares: int, count: int) -> list[int]:
    """wire.md §6.8.1: count Bernoulli(p) draws first, then a positive value for each hit in order."""
    hits = bernoulli_batch(draw, p, count)
    alpha = 1 - (1 - p) ** shares
    return [polya_positive(draw, p, shares, alpha) if hit else 0 for hit in hits]


def multi_sum(
    mechanism: str, params: dict[str, float], value: int, draw: Draw
) -> tuple[list[bytes], dict[str, int]]:
    """wire.md §6.8.4: (value + y - y') mod q in m shares (tag 1), then the presence message (tag 0)."""
    n, m, q = int(params["expected_n"]), int(params["messages"]), int(params["modulus"])
    p = grid_fraction(params["noise_probability"])
    polya = mechanism == "multi_message_sum"
    y = polya_batch(draw, p, n, 2) if polya else bernoulli_batch(draw, p, 2)
    free = randbelow_batch(draw, q, m - 1)
    shares = [*free, (value + y[0] - y[1] - sum(free)) % q]
    width = width_for(q - 1)
    messages = [b"\x01" + s.to_bytes(width, "big") for s in shares] + [bytes(1 + width)]
    return messages, {"noise_numerator": p.numerator, "noise_denominator": p.denominator}


def multi_histogram(
    params: dict[str, float], d: int, value: int, draw: Draw
) -> tuple[list[bytes], dict[str, int]]:
    """wire.md §6.8.5: per bucket j, ([x = j] + y_j - y'_j) mod q in m shares tagged j; presence tag d."""
    n, m, q = int(params["expected_n"]), int(params["messages"]), int(params["modulus"])
    p = grid_fraction(params["noise_probability"])
    noise = polya_batch(draw, p, n, 2 * d)
    free = randbelow_batch(draw, q, d * (m - 1))
    tag_width, share_width = width_for(d), width_for(q - 1)
    messages = []
    for j in range(d):
        own = free[j * (m - 1) : (j + 1) * (m - 1)]
        shares = [*own, (int(j == value) + noise[j] - noise[d + j] - sum(own)) % q]
        messages += [j.to_bytes(tag_width, "big") + s.to_bytes(share_width, "big") for s in shares]
    messages.append(d.to_bytes(tag_width, "big") + bytes(share_width))
    return messages, {"noise_numerator": p.numerator, "noise_denominator": p.denominator}


def repeated(counts: list[int], width: int) -> list[bytes]:
    """Message value v repeated counts[v] times, ascending v."""
    return [v.to_bytes(width, "big") for v, c in enumerate(counts) for _ in range(c)]


def balcer_cheu(
    params: dict[str, float], d: int, value: int, draw: Draw
) -> tuple[list[bytes], dict[str, int]]:
    """wire.md §6.8.3: own bucket, bucket j again iff its 52-bit word >= the skip threshold, presence d."""
    skip = math.ceil(Fraction(params["skip_probability"]) * (1 << GRID_BITS))
    words = [u64le(draw) >> (64 - GRID_BITS) for _ in range(d)]
    counts = [int(words[j] >= skip) + int(j == value) for j in range(d)] + [1]
    return repeated(counts, width_for(d)), {"skip_threshold": skip}


def flooded(params: dict[str, float], d: int, value: int, draw: Draw) -> tuple[list[bytes], dict[str, int]]:
    """wire.md §6.9: +1 at j (v = j), -1 at j (v = d + j), presence 2d; Polya noise, then the flood:
    NB(1/S, b) Polya draws when S > 0, else one Bernoulli(q) pair per bucket by a 52-bit compare."""
    n = int(params["expected_n"])
    p = grid_fraction(params["noise_probability"])
    shares = int(params["flood_shares"])
    q = grid_fraction(params["flood_probability"])
    noise = polya_batch(draw, p, n, 2 * d)
    if shares > 0:
        pairs = polya_batch(draw, q, shares, d)
    else:
        threshold = q * (1 << GRID_BITS)
        pairs = [int((u64le(draw) >> (64 - GRID_BITS)) < threshold) for _ in range(d)]
    counts = [int(j == value) + noise[j] + pairs[j] for j in range(d)]
    counts += [noise[d + j] + pairs[j] for j in range(d)] + [1]
    thresholds = {
        "flood_threshold": int(q * (1 << GRID_BITS)),
        "noise_numerator": p.numerator,
        "noise_denominator": p.denominator,
    }
    return repeated(counts, width_for(2 * d)), thresholds


def shuffle_only(
    mechanism: str, params: dict[str, float], d: int, value: int, draw: Draw
) -> tuple[list[bytes], dict[str, int]]:
    """wire.md §6.8: the messages of one answer of a shuffle-only protocol, and the integers used."""
    if mechanism == "cheu_binary_sum":
        flip_threshold = math.ceil(Fraction(params["flip_probability"]) * (1 << GRID_BITS))
        flip = int(randbits(draw, GRID_BITS + 1) < flip_threshold)
        return [bytes([value ^ flip])], {"flip_threshold": flip_threshold}
    if mechanism == "sample_and_threshold":
        rate = Fraction(params["sample_rate"])
        sampled = int(randbelow(draw, rate.denominator) < rate.numerator)
        message = sampled * value + (1 - sampled) * d
        return [message.to_bytes(width_for(d), "big")], {
            "sample_numerator": rate.numerator,
            "sample_denominator": rate.denominator,
        }
    if mechanism == "balcer_cheu_histogram":
        return balcer_cheu(params, d, value, draw)
    if mechanism in ("multi_message_sum", "multi_message_sum_binomial"):
        return multi_sum(mechanism, params, value, draw)
    if mechanism == "multi_message_histogram":
        return multi_histogram(params, d, value, draw)
    if mechanism == "flooded_histogram":
        return flooded(params, d, value, draw)
    raise SystemExit(f"this client does not implement {mechanism}")


def plaintext(report_id: bytes, campaign_id: str, key_id: int, payload: bytes, length: int) -> bytes:
    """wire.md §3: version 1, report id, key id, campaign id (length + 64 bytes), payload, zeros."""
    campaign = campaign_id.encode()
    head = struct.pack(">B16sIB64sH", 1, report_id, key_id, len(campaign), campaign, len(payload))
    body = head + payload
    return body + bytes(length - len(body))


def info(campaign_id: str, key_id: int, incarnation: bytes = b"") -> bytes:
    """wire.md §4: b"deniable/v1/report" || u16 length || campaign id || u32 key id
    [|| u8 length || incarnation, when the campaign has one]."""
    campaign = campaign_id.encode()
    head = b"deniable/v1/report" + struct.pack(">H", len(campaign)) + campaign + struct.pack(">I", key_id)
    return head + (struct.pack(">B", len(incarnation)) + incarnation if incarnation else b"")


def seal(
    public_key: bytes, campaign_id: str, key_id: int, length: int, payload: bytes, incarnation: bytes
) -> bytes:
    """A fresh report id, the padded plaintext, HPKE base mode to the aggregator key."""
    data = plaintext(os.urandom(16), campaign_id, key_id, payload, length)
    context = info(campaign_id, key_id, incarnation)
    return SUITE.encrypt(data, X25519PublicKey.from_public_bytes(public_key), info=context)


def _stream(data: bytes) -> Draw:
    position = 0

    def draw(count: int) -> bytes:
        nonlocal position
        out, position = data[position : position + count], position + count
        if len(out) != count:
            raise SystemExit("the vector's randomness ran out")
        return out

    return draw


def check(folder: Path) -> None:
    """Reproduce the vectors this client implements; raise SystemExit on any mismatch."""
    checked = 0
    for vector in json.loads((folder / "mechanisms.json").read_text()):
        for case in vector["cases"]:
            payload, thresholds = randomise(
                vector["mechanism"],
                vector["epsilon0"],
                vector["domain_size"],
                case["value"],
                _stream(bytes.fromhex(case["randomness"])),
            )
            if payload.hex() != case["payload"] or thresholds != vector["thresholds"]:
                raise SystemExit(
                    f"mechanism vector mismatch: {vector['mechanism']} {case}: {payload.hex()} {thresholds}"
                    f" != {vector['thresholds']}"
                )
            checked += 1
    for group in json.loads((folder / "plaintext.json").read_text()):
        for case in group["valid"]:
            made = plaintext(
                bytes.fromhex(case["report_id"]),
                case["campaign_id"],
                case["key_id"],
                bytes.fromhex(case["payload"]),
                case["plaintext_length"],
            )
            if made.hex() != case["plaintext"]:
                raise SystemExit(f"plaintext vector mismatch: {case['campaign_id']}")
            checked += 1
    envelope = json.loads((folder / "envelope.json").read_text())
    private = X25519PrivateKey.from_private_bytes(bytes.fromhex(envelope["recipient_private_key"]))
    for case in envelope["sealed"]:
        context = info(case["campaign_id"], case["key_id"], bytes.fromhex(case["incarnation"]))
        opened = SUITE.decrypt(bytes.fromhex(case["ciphertext"]), private, info=context)
        if context.hex() != case["info"] or opened.hex() != case["plaintext"]:
            raise SystemExit(f"envelope vector mismatch: {case['campaign_id']}")
        checked += 1
    checked += check_shuffle_only(json.loads((folder / "multi_message.json").read_text()), private)
    print(f"{checked} vectors reproduced")


def valid_message(mechanism: str, params: dict[str, float], d: int, message: bytes) -> bool:
    """wire.md §6.8, §6.9: whether the aggregator counts this message (else PAYLOAD_OUT_OF_DOMAIN)."""
    value = int.from_bytes(message, "big")
    if mechanism == "cheu_binary_sum":
        return len(message) == 1 and value <= 1
    if mechanism in ("sample_and_threshold", "balcer_cheu_histogram"):
        return len(message) == width_for(d) and value <= d
    if mechanism == "flooded_histogram":
        return len(message) == width_for(2 * d) and value <= 2 * d
    q = int(params["modulus"])
    tag_width = width_for(d) if mechanism == "multi_message_histogram" else 1
    tag, share = int.from_bytes(message[:tag_width], "big"), int.from_bytes(message[tag_width:], "big")
    presence, last_share_tag = (d, d - 1) if mechanism == "multi_message_histogram" else (0, 1)
    in_range = len(message) == tag_width + width_for(q - 1)
    is_share = tag <= last_share_tag and tag != presence and share < q
    return in_range and (is_share or (tag == presence and share == 0))


def check_shuffle_only(vectors: dict, private: X25519PrivateKey) -> int:  # type: ignore[type-arg]
    """multi_message.json: every protocol's messages and derived integers, then the sealed report."""
    checked = 0
    for vector in vectors["protocols"]:
        args = (vector["mechanism"], vector["params"], vector["domain_size"])
        for case in vector["cases"]:
            messages, derived = shuffle_only(
                vector["mechanism"],
                vector["params"],
                vector["domain_size"],
                case["value"],
                _stream(bytes.fromhex(case["randomness"])),
            )
            wanted = {k: v for k, v in vector["derived"].items() if k not in ("messages", "modulus")}
            if [m.hex() for m in messages] != case["messages"] or derived != wanted:
                raise SystemExit(f"shuffle-only vector mismatch: {vector['mechanism']} {case['value']}")
            if not all(valid_message(*args, m) for m in messages):
                raise SystemExit(f"a valid message refused: {vector['mechanism']} {case['value']}")
            checked += 1
        if any(valid_message(*args, bytes.fromhex(bad["message"])) for bad in vector["invalid"]):
            raise SystemExit(f"an invalid message accepted: {vector['mechanism']}")
    report = vectors["report"]
    context = info(report["campaign_id"], report["key_id"], bytes.fromhex(report["incarnation"]))
    for case in report["messages"]:
        opened = SUITE.decrypt(bytes.fromhex(case["ciphertext"]), private, info=context)
        payload = bytes.fromhex(case["payload"])
        made = plaintext(
            bytes.fromhex(case["report_id"]), report["campaign_id"], report["key_id"], payload, len(opened)
        )
        if context.hex() != report["info"] or opened.hex() != case["plaintext"] or made != opened:
            raise SystemExit("multi-message report vector mismatch")
        checked += 1
    return checked


def main(argv: list[str]) -> None:
    if argv[:1] == ["check"]:
        check(Path(argv[1]))
        return
    if argv[:1] == ["seal"] and len(argv) == 10:
        key, campaign, key_id, length, mechanism, epsilon0, d, value, incarnation = argv[1:]
        payload, _ = randomise(mechanism, float(epsilon0), int(d), int(value), os.urandom)
        sealed = seal(
            bytes.fromhex(key), campaign, int(key_id), int(length), payload, bytes.fromhex(incarnation)
        )
        print(sealed.hex())
        return
    if argv[:1] == ["seal-messages"] and len(argv) == 10:
        key, campaign, key_id, length, mechanism, d, value, incarnation, params = argv[1:]
        messages, _ = shuffle_only(mechanism, json.loads(params), int(d), int(value), os.urandom)
        for message in messages:
            sealed = seal(
                bytes.fromhex(key), campaign, int(key_id), int(length), message, bytes.fromhex(incarnation)
            )
            print(sealed.hex())
        return
    raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
