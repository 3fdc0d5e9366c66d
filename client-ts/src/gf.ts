/**
 * GF(g) arithmetic for OLH (docs/wire.md §6.6): mod g for a prime g; for g = p^k (k ≥ 2) base-p
 * digit polynomials modulo the first primitive x^k + c_{k−1}x^{k−1} + … + c_0 found scanning
 * low = 1, 2, … with c_i = digit i of low (c_0 ≠ 0), as core/mechanisms/olh.py does.
 */

/** Addition and multiplication in GF(g) on the integers 0 … g − 1. */
export interface Field {
  add(a: number, b: number): number;
  mul(a: number, b: number): number;
}

/** [p, k] with g = p^k, or undefined if g is not a prime power ≥ 2. */
export function primePower(g: number): [number, number] | undefined {
  if (!Number.isInteger(g) || g < 2) return undefined;
  let p = 2;
  while (p * p <= g && g % p !== 0) p++;
  if (g % p !== 0) p = g;
  let k = 0;
  for (let rest = g; rest > 1; rest /= p, k++) if (rest % p !== 0) return undefined;
  return [p, k];
}

function digits(x: number, p: number, k: number): number[] {
  const out: number[] = [];
  for (let i = 0; i < k; i++, x = Math.floor(x / p)) out.push(x % p);
  return out;
}

function polyMul(a: number, b: number, p: number, k: number, coeffs: number[]): number {
  const da = digits(a, p, k), db = digits(b, p, k);
  const prod = new Array<number>(2 * k - 1).fill(0);
  da.forEach((x, i) => db.forEach((y, j) => { prod[i + j] = (prod[i + j]! + x * y) % p; }));
  for (let top = 2 * k - 2; top >= k; top--) {
    const c = prod[top]!;
    prod[top] = 0;
    for (let i = 0; i < k; i++) prod[top - k + i] = (((prod[top - k + i]! - c * coeffs[i]!) % p) + p) % p;
  }
  return prod.slice(0, k).reduce((sum, digit, i) => sum + digit * p ** i, 0);
}

function primitiveCoefficients(p: number, k: number): number[] {
  const q = p ** k;
  for (let low = 1; low < q; low++) {
    const coeffs = digits(low, p, k);
    if (coeffs[0] === 0) continue;
    let power = 1, order = 0;
    do {
      power = polyMul(power, p, p, k, coeffs);
      order++;
    } while (power !== 1 && order < q);
    if (order === q - 1) return coeffs;
  }
  throw new Error(`no primitive polynomial for GF(${p}^${k})`);
}

/** The field GF(g) for a prime power g (tables for multiplication: g is small). */
export function field(g: number): Field {
  const pk = primePower(g);
  if (pk === undefined) throw new RangeError(`g = ${g} is not a prime power`);
  const [p, k] = pk;
  if (k === 1) return { add: (a, b) => (a + b) % g, mul: (a, b) => (a * b) % g };
  const coeffs = primitiveCoefficients(p, k);
  const table = new Array<number>(g * g);
  for (let a = 0; a < g; a++) for (let c = 0; c < g; c++) table[a * g + c] = polyMul(a, c, p, k, coeffs);
  return {
    add: (a, c) => digits(a, p, k).reduce((sum, x, i) => sum + ((x + digits(c, p, k)[i]!) % p) * p ** i, 0),
    mul: (a, c) => table[a * g + c]!,
  };
}
