/**
 * The durable outbox: sealed reports wait here until the shuffler accounts for them (accepted or
 * rejected). A retry resends the same ciphertext (never re-seals the answer), so a report is
 * counted at most once (the aggregator dedupes report ids, docs/wire.md §3.1).
 */
import type { EncryptedReport } from "./proto.js";
import { csprng } from "./random.js";
import type { KeyValueStore } from "./store.js";

const PREFIX = "outbox/";

/** A queued report and its store key. */
export interface QueuedReport extends EncryptedReport {
  key: string;
}

function toHex(bytes: Uint8Array): string {
  let out = "";
  for (const b of bytes) out += b.toString(16).padStart(2, "0");
  return out;
}

function fromHex(hex: string): Uint8Array {
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return out;
}

/** Sealed reports per campaign in a KeyValueStore, oldest first. */
export class Outbox {
  private sequence = 0;
  constructor(private readonly store: KeyValueStore) {}

  private newKey(campaignId: string): string {
    // time-ordered, unique across restarts: the store keeps insertion order by key
    const stamp = Date.now().toString(36).padStart(9, "0");
    const count = (this.sequence++).toString(36).padStart(6, "0");
    return `${PREFIX}${campaignId}/${stamp}${count}${toHex(csprng(6))}`;
  }

  /** Queue `reports` in one durable write. */
  async add(reports: readonly EncryptedReport[]): Promise<void> {
    await this.store.setMany(
      reports.map((r) => [this.newKey(r.campaignId), JSON.stringify({ k: r.keyId, c: toHex(r.ciphertext) })] as const),
    );
  }

  /** Up to `limit` queued reports of `campaignId`, oldest first. */
  async pending(campaignId: string, limit: number): Promise<QueuedReport[]> {
    const keys = (await this.store.keys(`${PREFIX}${campaignId}/`)).slice(0, limit);
    const out: QueuedReport[] = [];
    for (const key of keys) {
      const value = await this.store.get(key);
      if (value === undefined) continue;
      const parsed = JSON.parse(value) as { k: number; c: string };
      out.push({ key, campaignId, keyId: parsed.k, ciphertext: fromHex(parsed.c) });
    }
    return out;
  }

  /** How many reports of `campaignId` are queued. */
  async count(campaignId: string): Promise<number> {
    return (await this.store.keys(`${PREFIX}${campaignId}/`)).length;
  }

  /** Drop reports the shuffler accounted for. */
  async remove(keys: readonly string[]): Promise<void> {
    await this.store.deleteMany(keys);
  }
}
