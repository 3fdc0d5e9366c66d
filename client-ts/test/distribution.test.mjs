// Exact-distribution and audit checks of every randomiser, with the CSPRNG (docs/testing.md's
// approach in JS): Pearson's chi-square against the exact law computed from the integer thresholds,
// and an audit lower bound on epsilon that must stay at or below ε0.
//
// False-failure rate: each chi-square check rejects a correct randomiser with probability ≤ 1e-6 and
// each audit exceeds ε0 with probability ≤ 1e-6 (Bonferroni inside); 7 mechanisms × 2 checks, so the
// whole file fails a correct SDK with probability ≤ 1.4e-5. The mutant checks at the end show that
// both statistics do fail a randomiser whose ε0 is off.
import assert from "node:assert/strict";
import { test } from "node:test";
import { csprng, randomiserFor } from "../dist/index.js";
import { auditLowerBound, chiSquare } from "./stats.mjs";

const DRAWS = 60000;
const ALPHA = 1e-6;
const SCALE = 2 ** 64;

function sample(randomiser, value, n = DRAWS) {
  const counts = new Map();
  for (let i = 0; i < n; i++) {
    const key = Buffer.from(randomiser.randomise(value, csprng)).toString("hex");
    counts.set(key, (counts.get(key) ?? 0) + 1);
  }
  return counts;
}

const hexOf = (value, width) => value.toString(16).padStart(2 * width, "0");
const frac = (big, total) => Number(big) / Number(total);

/** A ByteSource that replays `bytes` then zeros: used to read the OLH hash off the implementation. */
const replay = (bytes) => {
  let pos = 0;
  return (count) => {
    const out = new Uint8Array(count);
    for (let i = 0; i < count; i++) out[i] = bytes[pos++] ?? 0;
    return out;
  };
};

function bitmapHex(d, members) {
  const out = Buffer.alloc(Math.ceil(d / 8));
  for (const j of members) out[j >> 3] |= 0x80 >> (j % 8);
  return out.toString("hex");
}

function subsets(items, size) {
  if (size === 0) return [[]];
  if (items.length < size) return [];
  const [first, ...rest] = items;
  return [...subsets(rest, size - 1).map((s) => [first, ...s]), ...subsets(rest, size)];
}

/** The exact output law of `randomiser` on `value`, from its integer thresholds (docs/wire.md §6). */
function law(randomiser, value) {
  const t = randomiser.thresholds;
  const d = randomiser.domainSize;
  const out = new Map();
  if (randomiser.name === "binary_rr") {
    const keep = frac(t.keep_threshold, SCALE);
    out.set(hexOf(value, 1), keep).set(hexOf(1 - value, 1), 1 - keep);
  } else if (randomiser.name === "grr") {
    for (let c = 0; c < d; c++) out.set(hexOf(c, randomiser.payloadLength), frac(c === value ? t.keep_weight : 2n ** 40n, t.total_weight));
  } else if (randomiser.name === "sue" || randomiser.name === "oue") {
    for (let mask = 0; mask < 2 ** d; mask++) {
      let p = 1;
      const members = [];
      for (let j = 0; j < d; j++) {
        const q = frac(j === value ? t.own_threshold : t.other_threshold, SCALE);
        const set = (mask >> j) & 1;
        p *= set ? q : 1 - q;
        if (set) members.push(j);
      }
      out.set(bitmapHex(d, members), p);
    }
  } else if (randomiser.name === "subset_selection") {
    const omega = Number(t.subset_size);
    const include = frac(t.include_threshold, SCALE);
    const others = [...Array(d).keys()].filter((j) => j !== value);
    for (const s of subsets(others, omega)) out.set(bitmapHex(d, s), (1 - include) / subsets(others, omega).length);
    for (const s of subsets(others, omega - 1)) out.set(bitmapHex(d, [...s, value]), include / subsets(others, omega - 1).length);
  } else if (randomiser.name === "hadamard_response") {
    const order = Number(t.order);
    const inside = frac(t.inside_threshold, SCALE);
    const w = value + 1;
    for (let i = 0; i < order; i++) {
      const even = [...(i & w).toString(2)].filter((c) => c === "1").length % 2 === 0;
      out.set(hexOf(i, randomiser.payloadLength), (even ? inside : 1 - inside) / (order / 2));
    }
  } else if (randomiser.name === "olh") {
    const g = Number(t.g), seeds = Number(t.seeds);
    const seedBytes = randomiser.payloadLength - 1;
    const bits = seeds.toString(2).length;
    for (let s = 0; s < seeds; s++) {
      // randbelow(S) reads ⌈bits/8⌉ bytes shifted; r2 = 0 keeps the hashed bucket: y(s, value)
      const shifted = BigInt(s) << BigInt((8 - (bits % 8)) % 8);
      const y = randomiser.randomise(value, replay(Buffer.from(hexOf(shifted, Math.ceil(bits / 8)), "hex")))[seedBytes];
      for (let c = 0; c < g; c++) {
        out.set(hexOf(s, seedBytes) + hexOf(c, 1), (1 / seeds) * frac(c === y ? t.keep_weight : 2n ** 40n, t.total_weight));
      }
    }
  }
  return out;
}

const CASES = [
  { name: "binary_rr", mechanism: 1, epsilon0: 1, d: 2, params: {} },
  { name: "grr", mechanism: 2, epsilon0: 1, d: 8, params: {} },
  { name: "sue", mechanism: 3, epsilon0: 1, d: 4, params: {} },
  { name: "oue", mechanism: 4, epsilon0: 2, d: 4, params: {} },
  { name: "olh", mechanism: 5, epsilon0: 1, d: 20, params: { g: 4 } },
  { name: "hadamard_response", mechanism: 6, epsilon0: 1, d: 8, params: {} },
  { name: "subset_selection", mechanism: 7, epsilon0: 1, d: 6, params: { subset_size: 2 } },
];

for (const c of CASES) {
  test(`${c.name}: chi-square against the exact law, and the audit lower bound ≤ ε0 = ${c.epsilon0}`, () => {
    const randomiser = randomiserFor({ mechanism: c.mechanism, epsilon0: c.epsilon0, domainSize: c.d, params: c.params });
    const exact = law(randomiser, 1);
    assert.ok(Math.abs([...exact.values()].reduce((a, b) => a + b, 0) - 1) < 1e-9, "the law sums to 1");
    const countsA = sample(randomiser, 1);
    const fit = chiSquare(countsA, exact, DRAWS);
    assert.ok(fit.pValue >= ALPHA, `${c.name}: chi-square ${fit.statistic.toFixed(1)} on ${fit.cells - 1} df, p = ${fit.pValue}`);
    const countsB = sample(randomiser, 0);
    const events = [...new Set([...exact.keys(), ...law(randomiser, 0).keys()])];
    // the union of input 1's most likely outputs (OLH: "the bucket is input 1's hash"), post-processing
    const top = Math.max(...exact.values());
    events.push([...exact].filter(([, p]) => p === top).map(([cell]) => cell));
    const bound = auditLowerBound(countsA, countsB, DRAWS, events, ALPHA);
    console.log(`# ${c.name}: chi-square p = ${fit.pValue.toFixed(4)} (${fit.cells - 1} df); audit lower bound ${bound.toFixed(3)} ≤ ε0 ${c.epsilon0}`);
    assert.ok(bound <= c.epsilon0, `${c.name}: audit lower bound ${bound} exceeds ε0 ${c.epsilon0}`);
  });
}

test("the checks can fail: a randomiser at ε0 = 2 fails the ε0 = 1 law and its audit refutes ε0 = 1", () => {
  const claimed = randomiserFor({ mechanism: 2, epsilon0: 1, domainSize: 8, params: {} });
  const actual = randomiserFor({ mechanism: 2, epsilon0: 2, domainSize: 8, params: {} });
  const counts = sample(actual, 1);
  assert.ok(chiSquare(counts, law(claimed, 1), DRAWS).pValue < ALPHA);
  const binary = randomiserFor({ mechanism: 1, epsilon0: 2, domainSize: 2, params: {} });
  const bound = auditLowerBound(sample(binary, 1), sample(binary, 0), DRAWS, ["00", "01"], ALPHA);
  assert.ok(bound > 1, `audit of an ε0 = 2 randomiser claimed at ε0 = 1: ${bound}`);
});
