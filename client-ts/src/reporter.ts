/**
 * `Reporter`: one campaign's device side, as the Python SDK's (client/reporter.py): fetch and verify
 * the signed description, charge the budget ledger, randomise with the CSPRNG, seal the fixed-length
 * plaintext with HPKE into the durable outbox, and deliver it with equal-jitter retries.
 */
import { backoffDelay } from "./backoff.js";
import { CampaignInvalid, type CheckedCampaign, type VerifyOptions, verifyDescription } from "./campaign.js";
import { seal } from "./hpke.js";
import { BudgetExceeded, type BudgetLedger, fits } from "./ledger.js";
import { checkValue } from "./mechanisms.js";
import { Outbox } from "./outbox.js";
import { type EncryptedReport, REJECT_REASONS, type SubmitResponse } from "./proto.js";
import { type ByteSource, csprng } from "./random.js";
import type { KeyValueStore } from "./store.js";
import { type Transport, TransportError } from "./transport.js";
import { encodePlaintext, hpkeInfo } from "./wire.js";

/** The window is not open now. */
export class CampaignClosed extends Error {
  override name = "CampaignClosed";
}

/** The campaign could not be fetched before the deadline (retryable later). */
export class CampaignUnavailable extends Error {
  override name = "CampaignUnavailable";
}

/**
 * The description belongs to another life (incarnation) of a campaign id than the one this device
 * pinned when it first joined: an older description replayed by a relay, refused. A CampaignInvalid,
 * as in the Python SDK.
 */
export class CampaignIncarnationError extends CampaignInvalid {
  override name = "CampaignIncarnationError";
}

function hex(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * Pin the campaign's incarnation in `store` on first use; refuse a description of another one.
 * Descriptions without an incarnation (made before they existed) are neither pinned nor refused,
 * as in the Python SDK (BudgetLedger.pin_incarnation).
 */
export async function pinIncarnation(store: KeyValueStore, campaignId: string, incarnation: Uint8Array): Promise<void> {
  if (incarnation.length === 0) return;
  const key = `incarnation/${campaignId}`;
  const pinned = await store.get(key);
  if (pinned === undefined) {
    await store.setMany([[key, hex(incarnation)]]);
  } else if (pinned !== hex(incarnation)) {
    throw new CampaignIncarnationError(
      `campaign ${JSON.stringify(campaignId)}: the description is of incarnation ${hex(incarnation)},` +
        ` this device pinned incarnation ${pinned}: another life of the id, refused`,
    );
  }
}

/** Outcome of one `sendPending`: acknowledged, permanently rejected, and still queued reports. */
export interface SendResult {
  acknowledged: number;
  rejected: number;
  pending: number;
  rejections: Record<string, number>;
}

/** Options of `Reporter.fetch`. */
export interface ReporterOptions extends VerifyOptions {
  transport: Transport;
  /** Where the outbox lives (IndexedDBStore, FileStore, an AsyncStorage adapter, MemoryStore). */
  store: KeyValueStore;
  ledger?: BudgetLedger;
  /** Seconds since the epoch (tests). */
  clock?: () => number;
  /** Wait `ms` milliseconds (tests). */
  sleep?: (ms: number) => Promise<void>;
  /** Randomness for the randomiser (tests only; default the CSPRNG). */
  random?: ByteSource;
  /** Give up fetching after this many seconds of retryable failures (default 60). */
  giveUpAfterS?: number;
}

const realSleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** Records answers to one campaign into the outbox and delivers them to the shuffler. */
export class Reporter {
  readonly outbox: Outbox;
  private readonly clock: () => number;
  private readonly sleep: (ms: number) => Promise<void>;
  private readonly random: ByteSource;
  private sending: Promise<unknown> = Promise.resolve();

  constructor(readonly checked: CheckedCampaign, private readonly options: ReporterOptions) {
    this.outbox = new Outbox(options.store);
    this.clock = options.clock ?? (() => Date.now() / 1000);
    this.sleep = options.sleep ?? realSleep;
    this.random = options.random ?? csprng;
  }

  /**
   * A Reporter once the description verifies with the pinned key, fits the policy, is valid, and is
   * of the incarnation this device pinned in `store` when it first fetched the campaign.
   */
  static async fetch(campaignId: string, options: ReporterOptions): Promise<Reporter> {
    const clock = options.clock ?? (() => Date.now() / 1000);
    const sleep = options.sleep ?? realSleep;
    const deadline = clock() + (options.giveUpAfterS ?? 60);
    let bytes: Uint8Array;
    for (let attempt = 0; ; attempt++) {
      try {
        bytes = await options.transport.getCampaign(campaignId);
        break;
      } catch (error) {
        if (!(error instanceof TransportError) || !error.retryable) throw error;
        const remaining = deadline - clock();
        if (remaining <= 0) throw new CampaignUnavailable(`campaign ${JSON.stringify(campaignId)} unavailable: ${error.message}`);
        await sleep(1000 * Math.min(remaining, backoffDelay(attempt, 0.05, 5)));
      }
    }
    const checked = verifyDescription(bytes, options);
    if (checked.campaign.id !== campaignId) {
      throw new CampaignInvalid(`asked for campaign ${JSON.stringify(campaignId)}, got ${JSON.stringify(checked.campaign.id)}`);
    }
    await pinIncarnation(options.store, campaignId, checked.campaign.incarnation);
    return new Reporter(checked, options);
  }

  /** Throw CampaignClosed unless the window is open now (start inclusive, end exclusive). */
  checkOpen(): void {
    const { windowStartUnix: start, windowEndUnix: end, id } = this.checked.campaign;
    const now = this.clock();
    if (start && now < start) throw new CampaignClosed(`campaign ${JSON.stringify(id)} opens at ${start}`);
    if (end && now >= end) throw new CampaignClosed(`campaign ${JSON.stringify(id)} closed at ${end}`);
  }

  /** Randomise `value` and seal it: one EncryptedReport (single-message mechanisms only). */
  async seal(value: number): Promise<EncryptedReport> {
    const { campaign, randomiser, layout } = this.checked;
    const payload = randomiser.randomise(value, this.random);
    const plaintext = encodePlaintext(
      { reportId: csprng(16), campaignId: campaign.id, keyId: campaign.keyId, payload },
      layout.plaintextLength,
    );
    const ciphertext = await seal(campaign.publicKey, hpkeInfo(campaign.id, campaign.keyId, campaign.incarnation), plaintext);
    if (ciphertext.length !== layout.ciphertextLength) {
      throw new CampaignInvalid(`sealed ${ciphertext.length} bytes, campaign expects ${layout.ciphertextLength}`);
    }
    return { campaignId: campaign.id, keyId: campaign.keyId, ciphertext };
  }

  /**
   * Queue this device's randomised, sealed answer. Refuses a value outside the domain (RangeError),
   * a closed window (CampaignClosed) and an exhausted budget (BudgetExceeded); the budget is charged
   * durably before the answer is randomised, so a crash can over-count spend, never under-count it.
   */
  async record(value: number): Promise<void> {
    const { campaign, randomiser } = this.checked;
    checkValue(randomiser, value);
    this.checkOpen();
    if (this.options.ledger !== undefined) {
      await this.options.ledger.charge(campaign.id, campaign.epsilon0, campaign.deviceBudgetEpsilon);
    }
    await this.outbox.add([await this.seal(value)]);
  }

  /** Simulations: one report per value, each standing for a different device (no ledger charge). */
  async recordMany(values: readonly number[]): Promise<number> {
    const { campaign, randomiser } = this.checked;
    values.forEach((v) => checkValue(randomiser, v));
    this.checkOpen();
    if (!fits(campaign.epsilon0, campaign.deviceBudgetEpsilon)) {
      throw new BudgetExceeded(`campaign ${JSON.stringify(campaign.id)}`, 0, campaign.epsilon0, campaign.deviceBudgetEpsilon);
    }
    const sealed: EncryptedReport[] = [];
    for (const value of values) sealed.push(await this.seal(value));
    await this.outbox.add(sealed);
    return sealed.length;
  }

  /**
   * Deliver queued reports in batches. Accepted and rejected reports leave the outbox (a rejection
   * is final); a retryable failure is retried after equal-jitter backoff (core/backoff.py), and after
   * `maxAttempts` consecutive failures the rest stay queued. A permanent failure is thrown.
   */
  sendPending(options: { batchSize?: number; maxAttempts?: number; baseDelayS?: number; maxDelayS?: number } = {}): Promise<SendResult> {
    const run = this.sending.then(() => this.sendNow(options));
    this.sending = run.catch(() => undefined);
    return run;
  }

  private async sendNow(options: { batchSize?: number; maxAttempts?: number; baseDelayS?: number; maxDelayS?: number }): Promise<SendResult> {
    const { batchSize = 1000, maxAttempts = 8, baseDelayS = 0.05, maxDelayS = 5 } = options;
    if (!(batchSize > 0 && maxAttempts > 0)) throw new RangeError("batchSize and maxAttempts must be positive");
    const id = this.checked.campaign.id;
    const result: SendResult = { acknowledged: 0, rejected: 0, pending: 0, rejections: {} };
    let failures = 0;
    for (let rows = await this.outbox.pending(id, batchSize); rows.length > 0; rows = await this.outbox.pending(id, batchSize)) {
      let response: SubmitResponse;
      try {
        response = await this.options.transport.submit(id, rows);
      } catch (error) {
        if (!(error instanceof TransportError) || !error.retryable) throw error;
        if (++failures >= maxAttempts) break;
        await this.sleep(1000 * backoffDelay(failures - 1, baseDelayS, maxDelayS));
        continue;
      }
      failures = 0;
      const refused = checkResponse(response, rows.length);
      for (const rejection of refused) {
        const name = REJECT_REASONS[rejection] ?? `REJECT_REASON_${rejection}`;
        result.rejections[name] = (result.rejections[name] ?? 0) + 1;
      }
      await this.outbox.remove(rows.map((r) => r.key));
      result.acknowledged += rows.length - refused.length;
      result.rejected += refused.length;
    }
    result.pending = await this.outbox.count(id);
    return result;
  }
}

/** The rejection reasons; a response that does not account for each report exactly once is refused. */
function checkResponse(response: SubmitResponse, sent: number): number[] {
  const seen = new Set<number>();
  for (const rejection of response.rejected) {
    if (rejection.index >= sent || seen.has(rejection.index)) {
      throw new TransportError(`shuffler response has a bad rejection index ${rejection.index}`, false);
    }
    seen.add(rejection.index);
  }
  if (response.accepted + seen.size !== sent) {
    throw new TransportError(`shuffler accounted for ${response.accepted} + ${seen.size} of ${sent} reports`, false);
  }
  return response.rejected.map((r) => r.reason);
}
