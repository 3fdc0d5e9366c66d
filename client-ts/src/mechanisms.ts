/**
 * The single-message local randomisers of docs/wire.md §6, with the same exact integer thresholds
 * as the Python SDK (core/mechanisms): every decision is a comparison of CSPRNG integers with
 * thresholds derived from ε0 by exact rational arithmetic, and both candidates are computed and one
 * selected arithmetically. Multi-message and shuffle-only protocols (enums 8–13) are refused.
 */
import { field, primePower } from "./gf.js";
import { type ByteSource, bitLength, randbelow, randbits, u64le } from "./random.js";

const SCALE = 1n << 64n;
const OTHER_WEIGHT = 1n << 40n;

/** The mechanisms this SDK implements, by proto enum number. */
export const MECHANISMS: Readonly<Record<number, string>> = {
  1: "binary_rr", 2: "grr", 3: "sue", 4: "oue", 5: "olh", 6: "hadamard_response", 7: "subset_selection",
};

/** Names of the proto enum values this SDK does not implement (multi-message, shuffle-only). */
export const UNSUPPORTED_MECHANISMS: Readonly<Record<number, string>> = {
  8: "cheu_binary_sum", 9: "balcer_cheu_histogram", 10: "multi_message_sum", 11: "sample_and_threshold",
  12: "multi_message_sum_binomial", 13: "multi_message_histogram",
};

/** A campaign this SDK cannot serve (unknown or multi-message mechanism, bad parameters). */
export class UnsupportedCampaign extends Error {
  override name = "UnsupportedCampaign";
}

function gcd(a: bigint, b: bigint): bigint {
  while (b !== 0n) [a, b] = [b, a % b];
  return a < 0n ? -a : a;
}

/** The exact value of a finite double as numerator / 2^shift (shift ≥ 0). */
function doubleAsFraction(x: number): [bigint, bigint] {
  if (!Number.isFinite(x)) throw new RangeError("epsilon0 must be finite");
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, x);
  const bits = view.getBigUint64(0);
  const exponent = Number((bits >> 52n) & 0x7ffn);
  let mantissa = bits & ((1n << 52n) - 1n);
  if (exponent !== 0) mantissa |= 1n << 52n;
  const power = (exponent === 0 ? 1 : exponent) - 1075;
  let num = bits >> 63n ? -mantissa : mantissa;
  let den = 1n;
  if (power >= 0) num <<= BigInt(power);
  else den = 1n << BigInt(-power);
  const g = gcd(num, den) || 1n;
  return [num / g, den / g];
}

/**
 * N with b = N / 2^64 = exp_lower_bound(ε0) ≤ e^ε0 (docs/wire.md §6.0): Taylor terms of the exact
 * binary value x, until k > x and the next term is below 2^−96 · total; then ⌊total · 2^64⌋.
 */
export function expLowerBound(epsilon0: number): bigint {
  const [xn, xd] = doubleAsFraction(epsilon0);
  if (xn < 0n) throw new RangeError("epsilon0 must be non-negative");
  let totalN = 0n, totalD = 1n, termN = 1n, termD = 1n;
  for (let k = 1n; ; k++) {
    totalN = totalN * termD + termN * totalD;
    totalD = totalD * termD;
    let g = gcd(totalN, totalD);
    totalN /= g; totalD /= g;
    termN *= xn;
    termD *= xd * k;
    g = gcd(termN, termD) || 1n;
    termN /= g; termD /= g;
    // k > x  and  term < total / 2^96
    if (k * xd > xn && (termN << 96n) * totalD < totalN * termD) return (totalN * SCALE) / totalD;
  }
}

/** Thresholds and sizes of one campaign's randomiser: computed once, used for every report. */
export interface Randomiser {
  readonly name: string;
  readonly domainSize: number;
  readonly payloadLength: number;
  /** The integer thresholds, named as in tests/vectors/mechanisms.json. */
  readonly thresholds: Readonly<Record<string, bigint>>;
  /** One randomised payload for `value` in [0, domainSize). */
  randomise(value: number, source: ByteSource): Uint8Array;
}

function toBytes(value: bigint, length: number): Uint8Array {
  const out = new Uint8Array(length);
  for (let i = length - 1; i >= 0; i--) {
    out[i] = Number(value & 0xffn);
    value >>= 8n;
  }
  return out;
}

function b(flag: boolean): bigint {
  return flag ? 1n : 0n;
}

/** Bytes for values below `size`: max(1, ⌈bit_length(size − 1)/8⌉). */
export function widthFor(size: bigint): number {
  return Math.max(1, Math.ceil(bitLength(size > 1n ? size - 1n : 0n) / 8));
}

/** §6.2: keep the value with weight W_k, each other with 2^40; selected arithmetically. */
function krr(r: bigint, keepWeight: bigint, value: bigint): bigint {
  const keep = b(r < keepWeight);
  const diff = r - keepWeight;
  const index = (diff > 0n ? diff : 0n) / OTHER_WEIGHT;
  const other = index + b(index >= value);
  return keep * value + (1n - keep) * other;
}

function binaryRr(n: bigint): Randomiser {
  const keep = (SCALE * n) / (SCALE + n);
  return {
    name: "binary_rr", domainSize: 2, payloadLength: 1, thresholds: { keep_threshold: keep },
    randomise: (value, source) => Uint8Array.of(value ^ Number(b(randbits(source, 64) >= keep))),
  };
}

function grr(n: bigint, d: number): Randomiser {
  const keepWeight = n >> 24n;
  const total = keepWeight + BigInt(d - 1) * OTHER_WEIGHT;
  const length = widthFor(BigInt(d));
  return {
    name: "grr", domainSize: d, payloadLength: length,
    thresholds: { keep_weight: keepWeight, total_weight: total },
    randomise: (value, source) => toBytes(krr(randbelow(source, total), keepWeight, BigInt(value)), length),
  };
}

/** §6.3 bitmap: category j is bit 7 − j mod 8 of byte ⌊j/8⌋; spare bits zero. */
function bitmap(d: number, bits: readonly bigint[]): Uint8Array {
  const out = new Uint8Array(Math.ceil(d / 8));
  bits.forEach((bit, j) => {
    out[j >> 3]! |= Number(bit) << (7 - (j % 8));
  });
  return out;
}

function sueOwn(n: bigint): bigint {
  const g = gcd(n, SCALE);
  const [num, den] = [n / g, SCALE / g];
  const ok = (a: bigint) => a * a * den <= num * (SCALE - a) ** 2n;
  let low = SCALE / 2n, high = SCALE - 1n;
  if (ok(high)) return high;
  while (high - low > 1n) {
    const mid = (low + high) / 2n;
    if (ok(mid)) low = mid;
    else high = mid;
  }
  return low;
}

function unary(name: "sue" | "oue", n: bigint, d: number): Randomiser {
  const own = name === "sue" ? sueOwn(n) : SCALE / 2n;
  const other = name === "sue" ? SCALE - own : (SCALE * SCALE + SCALE + n - 1n) / (SCALE + n);
  return {
    name, domainSize: d, payloadLength: Math.ceil(d / 8),
    thresholds: { own_threshold: own, other_threshold: other },
    randomise: (value, source) => {
      const bits: bigint[] = [];
      for (let j = 0; j < d; j++) bits.push(b(u64le(source) < other + b(j === value) * (own - other)));
      return bitmap(d, bits);
    },
  };
}

function roundHalfEven(x: number): number {
  const floor = Math.floor(x);
  const diff = x - floor;
  if (diff > 0.5) return floor + 1;
  if (diff < 0.5) return floor;
  return floor % 2 === 0 ? floor : floor + 1;
}

function subsetSelection(n: bigint, d: number, epsilon0: number, params: Record<string, number>): Randomiser {
  const given = params["subset_size"];
  const omega = given !== undefined ? given : Math.max(1, roundHalfEven(d / (Math.exp(epsilon0) + 1)));
  if (!Number.isInteger(omega) || omega < 1 || omega > d - 1) {
    throw new UnsupportedCampaign(`subset_size ${omega} is not in [1, ${d - 1}]`);
  }
  const w = BigInt(omega);
  const threshold = (SCALE * n * w) / (n * w + BigInt(d - omega) * SCALE);
  return {
    name: "subset_selection", domainSize: d, payloadLength: Math.ceil(d / 8),
    thresholds: { include_threshold: threshold, subset_size: w },
    randomise: (value, source) => {
      const include = b(randbits(source, 64) < threshold);
      const moved = new Map<number, number>();
      const chosen: bigint[] = [];
      for (let j = 0; j < omega; j++) {
        const r = j + Number(randbelow(source, BigInt(d - 1 - j)));
        const pick = moved.get(r) ?? r;
        moved.set(r, moved.get(j) ?? j);
        chosen.push(BigInt(pick) + b(pick >= value));
      }
      chosen[omega - 1] = include * BigInt(value) + (1n - include) * chosen[omega - 1]!;
      const bits = new Array<bigint>(d).fill(0n);
      for (const c of chosen) bits[Number(c)] = 1n;
      return bitmap(d, bits);
    },
  };
}

function parity(x: bigint): bigint {
  let p = 0n;
  while (x > 0n) {
    p ^= x & 1n;
    x >>= 1n;
  }
  return p;
}

function hadamardResponse(n: bigint, d: number): Randomiser {
  const order = 1n << BigInt(bitLength(BigInt(d)));
  const h = bitLength(order) - 2;
  const threshold = (SCALE * n) / (SCALE + n);
  const width = Math.ceil((bitLength(order) - 1) / 8);
  return {
    name: "hadamard_response", domainSize: d, payloadLength: width,
    thresholds: { inside_threshold: threshold, order },
    randomise: (value, source) => {
      const inside = b(randbits(source, 64) < threshold);
      const pos = randbits(source, h);
      const w = BigInt(value) + 1n;
      const m = w & -w;
      const low = m - 1n;
      const base = ((pos - (pos & low)) << 1n) | (pos & low);
      const inner = base | (parity(base & w) * m);
      return toBytes(inside * inner + (1n - inside) * (inner ^ m), width);
    },
  };
}

const MAX_BUCKETS = 65536;

/** core/mechanisms/olh.py's default g (the aggregator always sends `g`; the vectors rely on this). */
function defaultBuckets(epsilon0: number, d: number): number {
  const target = epsilon0 < 50 ? Math.exp(epsilon0) + 1 : Infinity;
  let atLeast = Math.max(2, d);
  while (primePower(atLeast) === undefined) atLeast++;
  const goal = Math.min(target, Math.min(atLeast, MAX_BUCKETS));
  let below = Math.max(2, Math.floor(goal));
  while (below > 2 && primePower(below) === undefined) below--;
  let above = Math.max(2, Math.ceil(goal));
  while (primePower(above) === undefined) above++;
  return goal - below <= above - goal ? below : above;
}

function olh(n: bigint, d: number, epsilon0: number, params: Record<string, number>): Randomiser {
  const g = params["g"] ?? defaultBuckets(epsilon0, d);
  if (g === undefined || primePower(g) === undefined || g > MAX_BUCKETS) {
    throw new UnsupportedCampaign(`olh needs params.g, a prime power (got ${g})`);
  }
  const gf = field(g);
  const powers = [1];
  while (powers[powers.length - 1]! < d) powers.push(powers[powers.length - 1]! * g);
  const r = powers.length - 1;
  const offsets = powers.map((power) => (power - 1) / (g - 1));
  const seeds = offsets[r]!;
  const keepWeight = n >> 24n;
  const total = keepWeight + BigInt(g - 1) * OTHER_WEIGHT;
  const seedBytes = widthFor(BigInt(seeds));
  const bucketBytes = widthFor(BigInt(g));
  return {
    name: "olh", domainSize: d, payloadLength: seedBytes + bucketBytes,
    thresholds: { keep_weight: keepWeight, total_weight: total, seeds: BigInt(seeds), g: BigInt(g) },
    randomise: (value, source) => {
      const s = Number(randbelow(source, BigInt(seeds)));
      const r2 = randbelow(source, total);
      let lead = 0;
      for (let i = 1; i < r; i++) lead += offsets[i]! <= s ? 1 : 0;
      const low = s - offsets[lead]!;
      let y = Math.floor(value / powers[lead]!) % g;
      for (let i = 0; i < r; i++) {
        y = gf.add(y, gf.mul(Math.floor(low / powers[i]!) % g, Math.floor(value / powers[i]!) % g));
      }
      const out = new Uint8Array(seedBytes + bucketBytes);
      out.set(toBytes(BigInt(s), seedBytes), 0);
      out.set(toBytes(krr(r2, keepWeight, BigInt(y)), bucketBytes), seedBytes);
      return out;
    },
  };
}

/** What a randomiser is built from: the Campaign fields of docs/wire.md §6. */
export interface MechanismSpec {
  mechanism: number;
  epsilon0: number;
  domainSize: number;
  params: Record<string, number>;
}

/** The randomiser of a campaign, or UnsupportedCampaign saying why this SDK cannot serve it. */
export function randomiserFor(spec: MechanismSpec): Randomiser {
  const { mechanism, epsilon0, domainSize: d, params } = spec;
  const unsupported = UNSUPPORTED_MECHANISMS[mechanism];
  if (unsupported !== undefined) {
    throw new UnsupportedCampaign(
      `${unsupported} is a multi-message (shuffle-only) protocol; this SDK implements only the` +
        ` single-message local randomisers (${Object.values(MECHANISMS).join(", ")})`,
    );
  }
  if (MECHANISMS[mechanism] === undefined) throw new UnsupportedCampaign(`unknown mechanism ${mechanism}`);
  if (!(Number.isFinite(epsilon0) && epsilon0 > 0)) {
    throw new UnsupportedCampaign(`epsilon0 ${epsilon0} is not a positive finite number`);
  }
  if (!Number.isInteger(d) || d < 2 || d > 1 << 20) throw new UnsupportedCampaign(`domain size ${d} out of range`);
  if (mechanism === 1 && d !== 2) throw new UnsupportedCampaign("binary_rr needs exactly 2 labels");
  const n = expLowerBound(epsilon0);
  switch (mechanism) {
    case 1: return binaryRr(n);
    case 2: return grr(n, d);
    case 3: return unary("sue", n, d);
    case 4: return unary("oue", n, d);
    case 5: return olh(n, d, epsilon0, params);
    case 6: return hadamardResponse(n, d);
    default: return subsetSelection(n, d, epsilon0, params);
  }
}

/** Raise RangeError unless `value` is an integer category in [0, d). */
export function checkValue(randomiser: Randomiser, value: number): void {
  if (!Number.isInteger(value) || value < 0 || value >= randomiser.domainSize) {
    throw new RangeError(`value ${value} is not in [0, ${randomiser.domainSize})`);
  }
}
