/**
 * A small protobuf codec for the four messages a device handles (proto/deniable/v1/deniable.proto):
 * `Campaign` (read, and re-encoded canonically for its signature), `EncryptedReport` and
 * `SubmitReportsRequest` (written), `SubmitReportsResponse` (read). Hand-written rather than
 * generated so the bundle carries no protobuf runtime (ADR 0034).
 */

/** Thrown for bytes that are not a well-formed message of the expected type. */
export class ProtoError extends Error {
  override name = "ProtoError";
}

/** One field record as received: its number, wire type and exact bytes (tag included). */
export interface FieldRecord {
  field: number;
  wireType: number;
  /** The record's bytes, tag and value, exactly as received. */
  raw: Uint8Array;
  /** The value: a varint as bigint, or the bytes of a length-delimited / fixed field. */
  value: bigint | Uint8Array;
}

function readVarint(buf: Uint8Array, pos: number): [bigint, number] {
  let result = 0n;
  let shift = 0n;
  for (let i = 0; i < 10; i++) {
    if (pos >= buf.length) throw new ProtoError("truncated varint");
    const byte = buf[pos++]!;
    result |= BigInt(byte & 0x7f) << shift;
    if ((byte & 0x80) === 0) return [result & 0xffffffffffffffffn, pos];
    shift += 7n;
  }
  throw new ProtoError("varint longer than 10 bytes");
}

/** Split a message into its field records, in the order received. */
export function parseRecords(buf: Uint8Array): FieldRecord[] {
  const records: FieldRecord[] = [];
  let pos = 0;
  while (pos < buf.length) {
    const start = pos;
    const [tag, afterTag] = readVarint(buf, pos);
    pos = afterTag;
    const field = Number(tag >> 3n);
    const wireType = Number(tag & 7n);
    if (field < 1 || field > 536870911) throw new ProtoError(`bad field number ${field}`);
    let value: bigint | Uint8Array;
    if (wireType === 0) {
      [value, pos] = readVarint(buf, pos);
    } else if (wireType === 1 || wireType === 5) {
      const size = wireType === 1 ? 8 : 4;
      if (pos + size > buf.length) throw new ProtoError("truncated fixed field");
      value = buf.subarray(pos, pos + size);
      pos += size;
    } else if (wireType === 2) {
      const [length, afterLength] = readVarint(buf, pos);
      if (afterLength + Number(length) > buf.length) throw new ProtoError("truncated length-delimited field");
      value = buf.subarray(afterLength, afterLength + Number(length));
      pos = afterLength + Number(length);
    } else {
      throw new ProtoError(`unsupported wire type ${wireType}`);
    }
    records.push({ field, wireType, raw: buf.subarray(start, pos), value });
  }
  return records;
}

/** Append a varint. */
export function writeVarint(out: number[], value: number | bigint): void {
  let v = BigInt(value) & 0xffffffffffffffffn;
  while (v >= 0x80n) {
    out.push(Number(v & 0x7fn) | 0x80);
    v >>= 7n;
  }
  out.push(Number(v));
}

function writeBytesField(out: number[], field: number, bytes: Uint8Array): void {
  writeVarint(out, (field << 3) | 2);
  writeVarint(out, bytes.length);
  for (const b of bytes) out.push(b);
}

const utf8 = new TextEncoder();
const utf8Strict = new TextDecoder("utf-8", { fatal: true });

function asString(value: bigint | Uint8Array): string {
  if (!(value instanceof Uint8Array)) throw new ProtoError("expected a length-delimited field");
  try {
    return utf8Strict.decode(value);
  } catch {
    throw new ProtoError("string field is not valid UTF-8");
  }
}

function asDouble(value: bigint | Uint8Array): number {
  if (!(value instanceof Uint8Array) || value.length !== 8) throw new ProtoError("expected a double");
  return new DataView(value.buffer, value.byteOffset, 8).getFloat64(0, true);
}

function asBigint(value: bigint | Uint8Array): bigint {
  if (typeof value !== "bigint") throw new ProtoError("expected a varint");
  return value;
}

function asInt64(value: bigint | Uint8Array): number {
  return Number(BigInt.asIntN(64, asBigint(value)));
}

function asUint32(value: bigint | Uint8Array): number {
  return Number(asBigint(value) & 0xffffffffn);
}

/** The fields of `deniable.v1.Campaign` a device reads (docs/wire.md §2.1). */
export interface Campaign {
  id: string;
  question: string;
  kind: number;
  labels: string[];
  mechanism: number;
  epsilon0: number;
  delta: number;
  nMin: number;
  windowStartUnix: number;
  windowEndUnix: number;
  keyId: number;
  publicKey: Uint8Array;
  hpkeSuite: string;
  payloadLength: number;
  plaintextLength: number;
  ciphertextLength: number;
  deviceBudgetEpsilon: number;
  params: Record<string, number>;
  signature: Uint8Array;
  localGuarantee: boolean;
  /** Which life of this campaign id the description belongs to (bound into every report's HPKE info). */
  incarnation: Uint8Array;
  /** Every field record as received (what the signature is checked over, `canonicalCampaignBytes`). */
  records: FieldRecord[];
}

function emptyCampaign(records: FieldRecord[]): Campaign {
  return {
    id: "", question: "", kind: 0, labels: [], mechanism: 0, epsilon0: 0, delta: 0, nMin: 0,
    windowStartUnix: 0, windowEndUnix: 0, keyId: 0, publicKey: new Uint8Array(0), hpkeSuite: "",
    payloadLength: 0, plaintextLength: 0, ciphertextLength: 0, deviceBudgetEpsilon: 0, params: {},
    signature: new Uint8Array(0), localGuarantee: false, incarnation: new Uint8Array(0), records,
  };
}

function parseParam(entry: Uint8Array): [string, number] {
  let key = "";
  let value = 0;
  for (const r of parseRecords(entry)) {
    if (r.field === 1) key = asString(r.value);
    else if (r.field === 2) value = asDouble(r.value);
  }
  return [key, value];
}

type Setter = (c: Campaign, v: bigint | Uint8Array) => void;
const SETTERS: Record<number, Setter> = {
  1: (c, v) => { c.id = asString(v); },
  2: (c, v) => { c.question = asString(v); },
  3: (c, v) => { c.kind = asUint32(v); },
  4: (c, v) => { c.labels.push(asString(v)); },
  5: (c, v) => { c.mechanism = asUint32(v); },
  6: (c, v) => { c.epsilon0 = asDouble(v); },
  7: (c, v) => { c.delta = asDouble(v); },
  8: (c, v) => { c.nMin = asUint32(v); },
  9: (c, v) => { c.windowStartUnix = asInt64(v); },
  10: (c, v) => { c.windowEndUnix = asInt64(v); },
  11: (c, v) => { c.keyId = asUint32(v); },
  12: (c, v) => { if (!(v instanceof Uint8Array)) throw new ProtoError("public_key"); c.publicKey = v.slice(); },
  13: (c, v) => { c.hpkeSuite = asString(v); },
  14: (c, v) => { c.payloadLength = asUint32(v); },
  15: (c, v) => { c.plaintextLength = asUint32(v); },
  16: (c, v) => { c.ciphertextLength = asUint32(v); },
  17: (c, v) => { c.deviceBudgetEpsilon = asDouble(v); },
  21: (c, v) => {
    if (!(v instanceof Uint8Array)) throw new ProtoError("params entry");
    const [key, value] = parseParam(v);
    c.params[key] = value;
  },
  22: (c, v) => { if (!(v instanceof Uint8Array)) throw new ProtoError("signature"); c.signature = v.slice(); },
  38: (c, v) => { c.localGuarantee = asBigint(v) !== 0n; },
  40: (c, v) => { if (!(v instanceof Uint8Array)) throw new ProtoError("incarnation"); c.incarnation = v.slice(); },
};

/** Fields of Campaign this SDK knows (sorted by number in the canonical encoding); others are unknown. */
const KNOWN_FIELDS = new Set([
  1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 28, 29, 30, 31, 34, 38, 39, 40,
]);
const WIRE_TYPES: Record<number, number> = { 6: 1, 7: 1, 17: 1, 19: 1, 39: 1 };

/** Decode a serialised Campaign; unknown fields are kept (in `records`) and otherwise ignored. */
export function decodeCampaign(bytes: Uint8Array): Campaign {
  const records = parseRecords(bytes);
  const campaign = emptyCampaign(records);
  for (const record of records) {
    const setter = SETTERS[record.field];
    if (setter === undefined) continue;
    const wanted = WIRE_TYPES[record.field] ?? (typeof record.value === "bigint" ? 0 : 2);
    if (record.wireType !== wanted) throw new ProtoError(`field ${record.field} has wire type ${record.wireType}`);
    setter(campaign, record.value);
  }
  return campaign;
}

function paramKey(record: FieldRecord): string {
  return record.value instanceof Uint8Array ? parseParam(record.value)[0] : "";
}

function compareBytes(a: Uint8Array, b: Uint8Array): number {
  for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return a[i]! - b[i]!;
  return a.length - b.length;
}

/**
 * The Campaign's canonical encoding without `signature` (docs/security.md, "Campaign signatures"):
 * known fields in increasing number (repeated ones in received order, map entries sorted by key
 * bytes), then unknown fields in received order; every record byte for byte as received.
 */
export function canonicalCampaignBody(records: FieldRecord[]): Uint8Array {
  const known = records.filter((r) => KNOWN_FIELDS.has(r.field) && r.field !== 22);
  const unknown = records.filter((r) => !KNOWN_FIELDS.has(r.field));
  known.sort((a, b) => {
    if (a.field !== b.field) return a.field - b.field;
    if (a.field === 21) return compareBytes(utf8.encode(paramKey(a)), utf8.encode(paramKey(b)));
    return 0;
  });
  const parts = [...known, ...unknown].map((r) => r.raw);
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let pos = 0;
  for (const part of parts) {
    out.set(part, pos);
    pos += part.length;
  }
  return out;
}

/** `EncryptedReport{campaign_id, key_id, ciphertext}` as sent to the shuffler. */
export interface EncryptedReport {
  campaignId: string;
  keyId: number;
  ciphertext: Uint8Array;
}

/** Serialise `SubmitReportsRequest{repeated EncryptedReport reports = 1}`. */
export function encodeSubmitRequest(reports: readonly EncryptedReport[]): Uint8Array {
  const out: number[] = [];
  for (const report of reports) {
    const inner: number[] = [];
    writeBytesField(inner, 1, utf8.encode(report.campaignId));
    if (report.keyId !== 0) {
      writeVarint(inner, 2 << 3);
      writeVarint(inner, report.keyId);
    }
    writeBytesField(inner, 3, report.ciphertext);
    writeBytesField(out, 1, Uint8Array.from(inner));
  }
  return Uint8Array.from(out);
}

/** One per-report refusal in a `SubmitReportsResponse` (a final outcome: the report is dropped). */
export interface Rejection {
  index: number;
  reason: number;
  detail: string;
}

/** A decoded `SubmitReportsResponse{accepted, repeated Rejection rejected}`. */
export interface SubmitResponse {
  accepted: number;
  rejected: Rejection[];
}

/** Decode a `SubmitReportsResponse`. */
export function decodeSubmitResponse(bytes: Uint8Array): SubmitResponse {
  const response: SubmitResponse = { accepted: 0, rejected: [] };
  for (const record of parseRecords(bytes)) {
    if (record.field === 1) response.accepted = asUint32(record.value);
    if (record.field !== 2 || !(record.value instanceof Uint8Array)) continue;
    const rejection: Rejection = { index: 0, reason: 0, detail: "" };
    for (const r of parseRecords(record.value)) {
      if (r.field === 1) rejection.index = asUint32(r.value);
      else if (r.field === 2) rejection.reason = asUint32(r.value);
      else if (r.field === 3) rejection.detail = asString(r.value);
    }
    response.rejected.push(rejection);
  }
  return response;
}

/** RejectReason names (proto enum), for logs and results. */
export const REJECT_REASONS: readonly string[] = [
  "REJECT_REASON_UNSPECIFIED", "WRONG_CIPHERTEXT_LENGTH", "UNKNOWN_CAMPAIGN", "UNKNOWN_KEY_ID",
  "UNDECRYPTABLE", "MALFORMED_PLAINTEXT", "CAMPAIGN_MISMATCH", "PAYLOAD_OUT_OF_DOMAIN",
  "DUPLICATE_REPORT", "CAMPAIGN_CLOSED",
];
