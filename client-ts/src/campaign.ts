/**
 * Checking a fetched campaign description before anything in it is used: the aggregator's Ed25519
 * signature against the pinned key (docs/security.md, "Campaign signatures"), the app's
 * `DevicePolicy`, and the checks of docs/wire.md §2.2 (id, mechanism, lengths, key, suite, budget).
 */
import { ed25519 } from "@noble/curves/ed25519.js";
import { type Campaign, canonicalCampaignBody, decodeCampaign } from "./proto.js";
import { MECHANISMS, UNSUPPORTED_MECHANISMS, type Randomiser, randomiserFor } from "./mechanisms.js";
import { HPKE_SUITE, type Layout, layoutFor, validCampaignId } from "./wire.js";

/** The description is unsigned, altered, or signed by a key other than the pinned one. */
export class CampaignSignatureError extends Error {
  override name = "CampaignSignatureError";
}

/** A correctly signed campaign asks for more than this app's DevicePolicy accepts. */
export class CampaignPolicyError extends Error {
  override name = "CampaignPolicyError";
}

/** The description is not one this SDK can report to correctly (wire.md §2.2). */
export class CampaignInvalid extends Error {
  override name = "CampaignInvalid";
}

const SIGNATURE_DOMAIN = new TextEncoder().encode("deniable/v1/campaign-signature\u0000");

/** The bytes the aggregator signs: the domain string and 0x00, then the canonical Campaign without field 22. */
export function canonicalCampaignBytes(campaign: Campaign): Uint8Array {
  const body = canonicalCampaignBody(campaign.records);
  const out = new Uint8Array(SIGNATURE_DOMAIN.length + body.length);
  out.set(SIGNATURE_DOMAIN, 0);
  out.set(body, SIGNATURE_DOMAIN.length);
  return out;
}

/** A pinned key from hex or raw bytes; CampaignSignatureError if it is not 32 bytes. */
export function pinnedKey(key: Uint8Array | string): Uint8Array {
  const raw = typeof key === "string" ? hexToBytes(key.trim()) : key;
  if (raw.length !== 32) {
    throw new CampaignSignatureError(`the pinned aggregator key is unusable: an Ed25519 key is 32 bytes, got ${raw.length}`);
  }
  return raw;
}

/** Hex (lower or upper case, no separators) to bytes; RangeError for anything else. */
export function hexToBytes(hex: string): Uint8Array {
  if (hex.length % 2 !== 0 || !/^[0-9a-fA-F]*$/.test(hex)) throw new RangeError("not a hex string");
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return out;
}

/** Raise CampaignSignatureError unless `campaign` carries a valid Ed25519 signature by `key`. */
export function verifyCampaign(campaign: Campaign, key: Uint8Array | string): void {
  const raw = pinnedKey(key);
  const name = JSON.stringify(campaign.id.slice(0, 80));
  if (campaign.signature.length === 0) throw new CampaignSignatureError(`campaign ${name} is not signed`);
  if (campaign.signature.length !== 64) throw new CampaignSignatureError(`campaign ${name}: malformed signature`);
  let ok = false;
  try {
    ok = ed25519.verify(campaign.signature, canonicalCampaignBytes(campaign), raw);
  } catch {
    ok = false;
  }
  if (!ok) {
    throw new CampaignSignatureError(
      `campaign ${name}: signature does not verify with the pinned aggregator key (altered, or signed by another key)`,
    );
  }
}

/** The weakest campaign an app accepts (same semantics as the Python SDK's DevicePolicy). */
export interface DevicePolicy {
  /** Largest ε0 accepted (default: any). */
  maxEpsilon0?: number;
  /** Mechanism names accepted, e.g. ["grr", "binary_rr"] (default: every one). */
  allowedMechanisms?: readonly string[];
  /** The smallest n_min (reports per shuffled batch) accepted (default 0). */
  minBatch?: number;
  /** Largest device_budget_epsilon accepted (default: any). */
  maxDeviceBudget?: number;
  /** Refuse shuffle-only protocols (this SDK refuses them anyway: they are multi-message). */
  requireLocalDp?: boolean;
}

function mechanismName(mechanism: number): string {
  return MECHANISMS[mechanism] ?? UNSUPPORTED_MECHANISMS[mechanism] ?? `mechanism ${mechanism}`;
}

/** Raise CampaignPolicyError naming the first limit of `policy` that `campaign` exceeds. */
export function checkPolicy(policy: DevicePolicy, campaign: Campaign): void {
  const name = `campaign ${JSON.stringify(campaign.id.slice(0, 80))}`;
  if (policy.requireLocalDp && MECHANISMS[campaign.mechanism] === undefined) {
    throw new CampaignPolicyError(`${name}: a shuffle-only protocol, its reports carry no local guarantee`);
  }
  if (!(campaign.epsilon0 <= (policy.maxEpsilon0 ?? Infinity))) {
    throw new CampaignPolicyError(`${name}: ε0 ${campaign.epsilon0} exceeds the policy's ${policy.maxEpsilon0}`);
  }
  if (!(campaign.deviceBudgetEpsilon <= (policy.maxDeviceBudget ?? Infinity))) {
    throw new CampaignPolicyError(
      `${name}: device budget ${campaign.deviceBudgetEpsilon} exceeds the policy's ${policy.maxDeviceBudget}`,
    );
  }
  if (campaign.nMin < (policy.minBatch ?? 0)) {
    throw new CampaignPolicyError(`${name}: n_min ${campaign.nMin} is below the policy's ${policy.minBatch}`);
  }
  const allowed = policy.allowedMechanisms?.map((m) => m.toLowerCase());
  if (allowed !== undefined && !allowed.includes(mechanismName(campaign.mechanism))) {
    throw new CampaignPolicyError(`${name}: ${mechanismName(campaign.mechanism)} is not an allowed mechanism`);
  }
}

/** A campaign that passed every check, with its randomiser and layout. */
export interface CheckedCampaign {
  campaign: Campaign;
  randomiser: Randomiser;
  layout: Layout;
}

/** wire.md §2.2: raise CampaignInvalid (or UnsupportedCampaign) unless this SDK can report to `campaign`. */
export function validateCampaign(campaign: Campaign): CheckedCampaign {
  const name = JSON.stringify(campaign.id.slice(0, 80));
  if (!validCampaignId(campaign.id)) throw new CampaignInvalid(`invalid campaign id ${name}`);
  const randomiser = randomiserFor({
    mechanism: campaign.mechanism, epsilon0: campaign.epsilon0, domainSize: campaign.labels.length,
    params: campaign.params,
  });
  if (campaign.hpkeSuite !== HPKE_SUITE) {
    throw new CampaignInvalid(`campaign ${name}: HPKE suite ${JSON.stringify(campaign.hpkeSuite)} is not ${HPKE_SUITE}`);
  }
  const layout = layoutFor(randomiser.payloadLength);
  const declared = [campaign.payloadLength, campaign.plaintextLength, campaign.ciphertextLength];
  const expected = [layout.payloadLength, layout.plaintextLength, layout.ciphertextLength];
  if (declared.join() !== expected.join()) {
    throw new CampaignInvalid(
      `campaign ${name} declares payload/plaintext/ciphertext lengths (${declared.join(", ")}), its mechanism gives (${expected.join(", ")})`,
    );
  }
  if (campaign.publicKey.length !== 32) {
    throw new CampaignInvalid(`campaign ${name}: public key is ${campaign.publicKey.length} bytes, not 32 (x25519)`);
  }
  const budget = campaign.deviceBudgetEpsilon;
  if (!(Number.isFinite(budget) && budget > 0)) {
    throw new CampaignInvalid(`campaign ${name}: device budget ${budget} is not a positive number`);
  }
  return { campaign, randomiser, layout };
}

/** Options for `verifyDescription`. */
export interface VerifyOptions {
  /** The aggregator's Ed25519 signing public key, pinned in the app (hex or raw). */
  aggregatorKey?: Uint8Array | string;
  /** Tests only: accept an unverified description when no key is pinned. */
  insecureSkipVerify?: boolean;
  policy?: DevicePolicy;
}

/** Decode serialised Campaign bytes, verify the signature, then the policy, then validate. */
export function verifyDescription(bytes: Uint8Array, options: VerifyOptions): CheckedCampaign {
  const campaign = decodeCampaign(bytes);
  if (options.aggregatorKey !== undefined) verifyCampaign(campaign, options.aggregatorKey);
  else if (!options.insecureSkipVerify) {
    throw new CampaignSignatureError("no aggregator signing key pinned: pass aggregatorKey (or insecureSkipVerify in tests)");
  }
  if (options.policy !== undefined) checkPolicy(options.policy, campaign);
  return validateCampaign(campaign);
}
