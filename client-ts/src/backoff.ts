/**
 * The retry backoff of core/backoff.py (ADR 0026): the n-th consecutive failure (n = 0, 1, …) waits
 * uniformly in [cap/2, cap) with cap = min(max, base · 2^n), "equal jitter" from the CSPRNG.
 */
import { type ByteSource, csprng, randbits } from "./random.js";

const FRACTION_BITS = 52;
const MAX_DOUBLINGS = 64;

/** The upper end of the `attempt`-th delay (0-based): base · 2^attempt, at most max. */
export function backoffCap(attempt: number, base: number, max: number): number {
  return Math.max(0, Math.min(max, base * 2 ** Math.min(Math.max(attempt, 0), MAX_DOUBLINGS)));
}

/** The `attempt`-th delay: uniform in [cap/2, cap) from the CSPRNG; 0 if cap is 0. */
export function backoffDelay(attempt: number, base: number, max: number, source: ByteSource = csprng): number {
  const cap = backoffCap(attempt, base, max);
  if (cap <= 0) return 0;
  const fraction = Number(randbits(source, FRACTION_BITS)) / 2 ** FRACTION_BITS;
  return Math.min((cap * (1 + fraction)) / 2, cap - Number.EPSILON * cap);
}
