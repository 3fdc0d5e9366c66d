// Statistics for the distribution tests, computed in JS: Pearson's chi-square with its p-value
// (regularised upper incomplete gamma), and a sound audit lower bound on epsilon from Hoeffding bounds.

function logGamma(x) {
  // Lanczos approximation (g = 7, n = 9), relative error < 1e-13 for x > 0
  const c = [0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313, -176.61502916214059,
    12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7];
  if (x < 0.5) return Math.log(Math.PI / Math.sin(Math.PI * x)) - logGamma(1 - x);
  x -= 1;
  let a = c[0];
  const t = x + 7.5;
  for (let i = 1; i < 9; i++) a += c[i] / (x + i);
  return 0.5 * Math.log(2 * Math.PI) + (x + 0.5) * Math.log(t) - t + Math.log(a);
}

/** Q(a, x) = Γ(a, x) / Γ(a): series below a + 1, Lentz continued fraction above (Numerical Recipes). */
export function gammaQ(a, x) {
  if (x <= 0) return 1;
  const front = Math.exp(-x + a * Math.log(x) - logGamma(a));
  if (x < a + 1) {
    let sum = 1 / a, term = sum;
    for (let n = 1; n < 10000 && Math.abs(term) > Math.abs(sum) * 1e-15; n++) sum += (term *= x / (a + n));
    return 1 - sum * front;
  }
  let b = x + 1 - a, c = 1e300, d = 1 / b, h = d;
  for (let i = 1; i < 10000; i++) {
    const an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (Math.abs(d) < 1e-300) d = 1e-300;
    c = b + an / c;
    if (Math.abs(c) < 1e-300) c = 1e-300;
    d = 1 / d;
    const delta = d * c;
    h *= delta;
    if (Math.abs(delta - 1) < 1e-15) break;
  }
  return h * front;
}

/** Pearson's chi-square of `counts` (Map cell → count) against `law` (Map cell → probability); p-value. */
export function chiSquare(counts, law, n) {
  let statistic = 0;
  let cells = 0;
  for (const [cell, p] of law) {
    if (p <= 0) {
      if ((counts.get(cell) ?? 0) > 0) return { statistic: Infinity, pValue: 0, cells: law.size };
      continue;
    }
    const expected = n * p;
    const observed = counts.get(cell) ?? 0;
    statistic += (observed - expected) ** 2 / expected;
    cells++;
  }
  for (const cell of counts.keys()) if (!law.has(cell)) return { statistic: Infinity, pValue: 0, cells };
  return { statistic, pValue: gammaQ((cells - 1) / 2, statistic / 2), cells };
}

/**
 * A lower confidence bound on max over `events` of |ln P_a(S) / P_b(S)|, holding with probability
 * ≥ 1 − alpha: one-sided Hoeffding bounds per event, direction and side, Bonferroni-corrected.
 * An event is one output cell or an array of cells (their union), fixed before sampling.
 */
export function auditLowerBound(countsA, countsB, n, events, alpha) {
  const radius = Math.sqrt(Math.log((4 * events.length) / alpha) / (2 * n));
  let best = 0;
  for (const event of events) {
    const cells = Array.isArray(event) ? event : [event];
    const pa = cells.reduce((sum, cell) => sum + (countsA.get(cell) ?? 0), 0) / n;
    const pb = cells.reduce((sum, cell) => sum + (countsB.get(cell) ?? 0), 0) / n;
    for (const [top, bottom] of [[pa, pb], [pb, pa]]) {
      const lower = top - radius;
      const upper = Math.min(1, bottom + radius);
      if (lower > 0) best = Math.max(best, Math.log(lower / upper));
    }
  }
  return best;
}
