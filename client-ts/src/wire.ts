/**
 * The report layout of docs/wire.md §3–§4: the fixed-length padded plaintext, the HPKE `info`
 * that binds campaign and key id, and the lengths a campaign must declare. Everything a later wire
 * change touches is here and derived from the Campaign description alone (`layoutFor`).
 */

export const PLAINTEXT_VERSION = 1;
export const HEADER_LENGTH = 88;
export const CAMPAIGN_FIELD = 64;
export const HPKE_OVERHEAD = 48;
export const HPKE_SUITE = "X25519-HKDF-SHA256-CHACHA20POLY1305";
export const INFO_PREFIX = "deniable/v1/report";
const CAMPAIGN_ID = /^[a-z0-9][a-z0-9._-]{0,62}$/;

const utf8 = new TextEncoder();

/** Whether `id` is a valid campaign id (`[a-z0-9][a-z0-9._-]{0,62}`). */
export function validCampaignId(id: string): boolean {
  return CAMPAIGN_ID.test(id);
}

/** The sizes a campaign declares (payload_length, plaintext_length, ciphertext_length). */
export interface Layout {
  payloadLength: number;
  plaintextLength: number;
  ciphertextLength: number;
}

/** §3: every plaintext length a campaign may have, shared by all campaigns: 128, 256, …, 131072 bytes. */
export const SIZE_CLASSES: readonly number[] = Array.from({ length: 11 }, (_, k) => 2 ** (7 + k));

/** §3: plaintext_length = the smallest size class ≥ 88 + payload_length; ciphertext adds the 48-byte HPKE overhead. */
export function layoutFor(payloadLength: number): Layout {
  if (!(Number.isInteger(payloadLength) && payloadLength > 0 && payloadLength <= 0xffff)) {
    throw new RangeError(`payload length ${payloadLength} is not in 1..65535`);
  }
  const plaintextLength = SIZE_CLASSES.find((size) => size >= HEADER_LENGTH + payloadLength);
  if (plaintextLength === undefined) throw new RangeError(`payload length ${payloadLength} exceeds the largest size class`);
  return { payloadLength, plaintextLength, ciphertextLength: plaintextLength + HPKE_OVERHEAD };
}

/** One message's plaintext fields (§3). */
export interface Plaintext {
  reportId: Uint8Array;
  campaignId: string;
  keyId: number;
  payload: Uint8Array;
}

/** §3: version ‖ report_id ‖ u32 key_id ‖ u8 campaign_len ‖ campaign_id padded to 64 ‖ u16 payload_len ‖ payload ‖ zeros. */
export function encodePlaintext(fields: Plaintext, plaintextLength: number): Uint8Array {
  const campaign = utf8.encode(fields.campaignId);
  if (fields.reportId.length !== 16) throw new RangeError("a report id is 16 bytes");
  if (campaign.length < 1 || campaign.length > CAMPAIGN_FIELD) throw new RangeError("campaign id is 1..64 bytes");
  if (HEADER_LENGTH + fields.payload.length > plaintextLength) throw new RangeError("payload does not fit");
  const out = new Uint8Array(plaintextLength);
  const view = new DataView(out.buffer);
  out[0] = PLAINTEXT_VERSION;
  out.set(fields.reportId, 1);
  view.setUint32(17, fields.keyId);
  out[21] = campaign.length;
  out.set(campaign, 22);
  view.setUint16(86, fields.payload.length);
  out.set(fields.payload, HEADER_LENGTH);
  return out;
}

/**
 * §4: "deniable/v1/report" ‖ u16 len(campaign_id) ‖ campaign_id ‖ u32 key_id, then, for a campaign
 * with an incarnation, u8 len(incarnation) ‖ incarnation: a report replayed into another life of
 * the same id does not open.
 */
export function hpkeInfo(campaignId: string, keyId: number, incarnation: Uint8Array = new Uint8Array(0)): Uint8Array {
  if (incarnation.length > 255) throw new RangeError("an incarnation is at most 255 bytes");
  const prefix = utf8.encode(INFO_PREFIX);
  const campaign = utf8.encode(campaignId);
  const tail = incarnation.length > 0 ? 1 + incarnation.length : 0;
  const out = new Uint8Array(prefix.length + 2 + campaign.length + 4 + tail);
  const view = new DataView(out.buffer);
  out.set(prefix, 0);
  view.setUint16(prefix.length, campaign.length);
  out.set(campaign, prefix.length + 2);
  const after = prefix.length + 2 + campaign.length;
  view.setUint32(after, keyId);
  if (tail > 0) {
    out[after + 4] = incarnation.length;
    out.set(incarnation, after + 5);
  }
  return out;
}
