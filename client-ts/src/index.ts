/**
 * @deniable/client: the Deniable device SDK for browsers, Node ≥ 20 and React Native (pluggable fetch
 * and storage). See README.md; the wire format is docs/wire.md of the Deniable repository.
 */
export { backoffCap, backoffDelay } from "./backoff.js";
export {
  CampaignInvalid, CampaignPolicyError, CampaignSignatureError, type CheckedCampaign, type DevicePolicy,
  type VerifyOptions, canonicalCampaignBytes, checkPolicy, hexToBytes, validateCampaign, verifyCampaign,
  verifyDescription,
} from "./campaign.js";
export { seal } from "./hpke.js";
export { BudgetExceeded, BudgetLedger, fits, toMicro } from "./ledger.js";
export {
  MECHANISMS, type MechanismSpec, type Randomiser, UnsupportedCampaign, checkValue, expLowerBound, randomiserFor,
} from "./mechanisms.js";
export { Outbox } from "./outbox.js";
export {
  type Campaign, type EncryptedReport, ProtoError, type SubmitResponse, decodeCampaign, decodeSubmitResponse,
  encodeSubmitRequest,
} from "./proto.js";
export { type ByteSource, csprng, randbelow, randbits, u64le } from "./random.js";
export {
  CampaignClosed, CampaignIncarnationError, CampaignUnavailable, Reporter, pinIncarnation, type ReporterOptions, type SendResult,
} from "./reporter.js";
export { type AsyncStorageLike, IndexedDBStore, type KeyValueStore, MemoryStore, asyncStorageStore } from "./store.js";
export { type FetchLike, HttpTransport, type Transport, TransportError } from "./transport.js";
export { type Layout, SIZE_CLASSES, encodePlaintext, hpkeInfo, layoutFor, validCampaignId } from "./wire.js";
