/**
 * Randomness for the randomisers (docs/wire.md §6.0): a stream of uniform bytes consumed in order.
 * The only source the SDK uses is the platform CSPRNG, `crypto.getRandomValues` (browsers, Node ≥ 20,
 * React Native with a getRandomValues polyfill); tests inject recorded streams to reproduce vectors.
 */

/** Returns `count` uniform random bytes. */
export type ByteSource = (count: number) => Uint8Array;

const MAX_CHUNK = 65536;

/** The platform CSPRNG; throws if `crypto.getRandomValues` is missing (never falls back). */
export const csprng: ByteSource = (count) => {
  const cryptoObject = (globalThis as { crypto?: Crypto }).crypto;
  if (cryptoObject === undefined || typeof cryptoObject.getRandomValues !== "function") {
    throw new Error("crypto.getRandomValues is not available: install a CSPRNG polyfill (React Native)");
  }
  const out = new Uint8Array(count);
  for (let pos = 0; pos < count; pos += MAX_CHUNK) {
    cryptoObject.getRandomValues(out.subarray(pos, Math.min(count, pos + MAX_CHUNK)));
  }
  return out;
};

/** `bitLength(n)`: the number of bits of a non-negative bigint (0 for 0). */
export function bitLength(n: bigint): number {
  return n === 0n ? 0 : n.toString(2).length;
}

function bigEndian(bytes: Uint8Array): bigint {
  let v = 0n;
  for (const b of bytes) v = (v << 8n) | BigInt(b);
  return v;
}

/** `randbits(n)`: ⌈n/8⌉ bytes big-endian, shifted right by (8 − n mod 8) mod 8. */
export function randbits(source: ByteSource, bits: number): bigint {
  if (bits === 0) return 0n;
  const bytes = source(Math.ceil(bits / 8));
  return bigEndian(bytes) >> BigInt((8 - (bits % 8)) % 8);
}

/** `randbelow(m)`: rejection sampling on bit_length(m) bits. */
export function randbelow(source: ByteSource, upper: bigint): bigint {
  if (upper <= 0n) throw new RangeError("randbelow needs a positive bound");
  const bits = bitLength(upper);
  for (;;) {
    const candidate = randbits(source, bits);
    if (candidate < upper) return candidate;
  }
}

/** `u64le()`: 8 bytes as a little-endian integer. */
export function u64le(source: ByteSource): bigint {
  const bytes = source(8);
  let v = 0n;
  for (let i = 7; i >= 0; i--) v = (v << 8n) | BigInt(bytes[i]!);
  return v;
}
