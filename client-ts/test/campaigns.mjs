// Test helper: serialised, signed Campaign descriptions built in JS (deterministic field order), with
// an Ed25519 key of the test's own, so the SDK's checks can be exercised field by field.
import { ed25519 } from "@noble/curves/ed25519.js";
import { layoutFor, randomiserFor } from "../dist/index.js";

const utf8 = new TextEncoder();

function varint(out, value) {
  let v = BigInt.asUintN(64, BigInt(value));
  while (v >= 0x80n) {
    out.push(Number(v & 0x7fn) | 0x80);
    v >>= 7n;
  }
  out.push(Number(v));
}
const tag = (out, field, wire) => varint(out, (field << 3) | wire);
function bytesField(out, field, bytes) {
  tag(out, field, 2);
  varint(out, bytes.length);
  out.push(...bytes);
}
function doubleField(out, field, value) {
  tag(out, field, 1);
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, value, true);
  out.push(...new Uint8Array(view.buffer));
}
function intField(out, field, value) {
  if (!value) return;
  tag(out, field, 0);
  varint(out, value);
}

export const SIGNING_KEY = new Uint8Array(32).fill(7);
export const PINNED = ed25519.getPublicKey(SIGNING_KEY);

/** Campaign fields with defaults for a valid binary_rr campaign; lengths computed unless given. */
export function campaignFields(overrides = {}) {
  const base = {
    id: "c1", kind: 1, labels: ["no", "yes"], mechanism: 1, epsilon0: 1, nMin: 1, keyId: 1,
    publicKey: new Uint8Array(32).fill(9), hpkeSuite: "X25519-HKDF-SHA256-CHACHA20POLY1305", deviceBudgetEpsilon: 1,
    params: {}, windowStart: 0, windowEnd: 0, incarnation: new Uint8Array(16).fill(0xab), ...overrides,
  };
  if (base.payloadLength === undefined) {
    let payload = 1;
    try {
      payload = randomiserFor({ mechanism: base.mechanism, epsilon0: base.epsilon0, domainSize: base.labels.length, params: base.params }).payloadLength;
    } catch {
      // an unsupported mechanism: any lengths
    }
    const layout = layoutFor(payload);
    Object.assign(base, { payloadLength: payload, plaintextLength: layout.plaintextLength, ciphertextLength: layout.ciphertextLength, ...overrides });
  }
  return base;
}

/** The canonical (signed) body of `fields` without a signature. */
export function encodeCampaign(f) {
  const out = [];
  bytesField(out, 1, utf8.encode(f.id));
  intField(out, 3, f.kind);
  for (const label of f.labels) bytesField(out, 4, utf8.encode(label));
  intField(out, 5, f.mechanism);
  doubleField(out, 6, f.epsilon0);
  intField(out, 8, f.nMin);
  intField(out, 9, f.windowStart);
  intField(out, 10, f.windowEnd);
  intField(out, 11, f.keyId);
  bytesField(out, 12, f.publicKey);
  bytesField(out, 13, utf8.encode(f.hpkeSuite));
  intField(out, 14, f.payloadLength);
  intField(out, 15, f.plaintextLength);
  intField(out, 16, f.ciphertextLength);
  doubleField(out, 17, f.deviceBudgetEpsilon);
  for (const key of Object.keys(f.params).sort()) {
    const entry = [];
    bytesField(entry, 1, utf8.encode(key));
    doubleField(entry, 2, f.params[key]);
    bytesField(out, 21, entry);
  }
  if (f.incarnation.length > 0) bytesField(out, 40, f.incarnation);
  return Uint8Array.from(out);
}

const DOMAIN = utf8.encode("deniable/v1/campaign-signature\u0000");

/** Serialised Campaign `fields` signed by `key` (default SIGNING_KEY); `tamper` edits the bytes after signing. */
export function signedCampaign(overrides = {}, key = SIGNING_KEY) {
  const body = encodeCampaign(campaignFields(overrides));
  const message = new Uint8Array(DOMAIN.length + body.length);
  message.set(DOMAIN);
  message.set(body, DOMAIN.length);
  const signature = ed25519.sign(message, key);
  // field 22 goes where a deterministic encoder puts it: before the fields numbered above it (40)
  const fields = campaignFields(overrides);
  const below = encodeCampaign({ ...fields, incarnation: new Uint8Array(0) });
  const out = [...below];
  bytesField(out, 22, signature);
  out.push(...body.slice(below.length));
  return Uint8Array.from(out);
}
