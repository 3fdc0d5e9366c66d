/**
 * The device's durable privacy-budget ledger (client/budget.py semantics): per campaign, the local ε
 * spent, in integer micro-ε (rounded to nearest), charged before randomising; a charge that would
 * pass the campaign's `device_budget_epsilon` (or the device-wide limit) is refused and charges nothing.
 */
import type { KeyValueStore } from "./store.js";

const MICRO = 1_000_000;
const MAX_MICRO = 9_000_000_000_000_000;
const PREFIX = "budget/";

/** A report would take this device past its privacy budget; nothing was charged. */
export class BudgetExceeded extends Error {
  override name = "BudgetExceeded";
  constructor(readonly scope: string, readonly spent: number, readonly requested: number, readonly limit: number) {
    super(`privacy budget exceeded for ${scope}: spent ${spent} + requested ${requested} > limit ${limit} (epsilon)`);
  }
}

/** ε in integer micro-ε, rounded half to even like Python's round (saturating near 9e9 ε). */
export function toMicro(epsilon: number): number {
  if (!(Number.isFinite(epsilon) && epsilon >= 0)) throw new RangeError(`epsilon must be finite and non-negative, got ${epsilon}`);
  const x = epsilon * MICRO;
  const floor = Math.floor(x);
  const rounded = x - floor > 0.5 || (x - floor === 0.5 && floor % 2 === 1) ? floor + 1 : floor;
  return Math.min(rounded, MAX_MICRO);
}

function chargeMicro(epsilon: number): number {
  if (!(epsilon > 0)) throw new RangeError(`a charge must be positive, got ${epsilon}`);
  return Math.max(1, toMicro(epsilon));
}

/** Whether one charge of `epsilon` fits an empty budget of `limit`. */
export function fits(epsilon: number, limit: number): boolean {
  return chargeMicro(epsilon) <= toMicro(limit);
}

/** Durable per-campaign (and optional device-wide) ε spend in a KeyValueStore. */
export class BudgetLedger {
  private queue: Promise<unknown> = Promise.resolve();

  /** `totalLimit`: the most ε this device spends over all campaigns (default: no device-wide limit). */
  constructor(private readonly store: KeyValueStore, private readonly totalLimit?: number) {}

  /** ε spent on `campaignId` so far. */
  async spent(campaignId: string): Promise<number> {
    return Number((await this.store.get(PREFIX + campaignId)) ?? "0") / MICRO;
  }

  /** Record `epsilon` spent on `campaignId` durably, or throw BudgetExceeded and charge nothing. */
  charge(campaignId: string, epsilon: number, limit: number): Promise<void> {
    const run = this.queue.then(() => this.chargeNow(campaignId, epsilon, limit));
    this.queue = run.catch(() => undefined);
    return run;
  }

  private async chargeNow(campaignId: string, epsilon: number, limit: number): Promise<void> {
    const amount = chargeMicro(epsilon);
    const spent = Number((await this.store.get(PREFIX + campaignId)) ?? "0");
    if (spent + amount > toMicro(limit)) {
      throw new BudgetExceeded(`campaign ${JSON.stringify(campaignId)}`, spent / MICRO, epsilon, limit);
    }
    if (this.totalLimit !== undefined) {
      let total = 0;
      for (const key of await this.store.keys(PREFIX)) total += Number((await this.store.get(key)) ?? "0");
      if (total + amount > toMicro(this.totalLimit)) {
        throw new BudgetExceeded("this device", total / MICRO, epsilon, this.totalLimit);
      }
    }
    await this.store.setMany([[PREFIX + campaignId, String(spent + amount)]]);
  }
}
