// The SDK's checks and device-side machinery without services: signature, policy, refusals,
// outbox and retries with equal-jitter backoff, the budget ledger, and no Math.random anywhere.
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import {
  BudgetExceeded, BudgetLedger, CampaignClosed, CampaignInvalid, CampaignPolicyError, CampaignSignatureError,
  MemoryStore, Reporter, TransportError, UnsupportedCampaign, backoffCap, backoffDelay, decodeSubmitResponse,
  encodeSubmitRequest, verifyDescription,
} from "../dist/index.js";
import { FileStore } from "../dist/node.js";
import { PINNED, signedCampaign } from "./campaigns.mjs";

const ROOT = new URL("../", import.meta.url);

test("no Math.random in the SDK's sources, the example, nor the browser bundle (privacy noise only from the CSPRNG)", () => {
  const files = readdirSync(new URL("src/", ROOT)).map((f) => new URL(`src/${f}`, ROOT));
  files.push(new URL("bundle/deniable.min.js", ROOT), new URL("examples/send.mjs", ROOT));
  for (const file of files) assert.doesNotMatch(readFileSync(file, "utf8"), /Math\.random/, file.pathname);
  assert.match(readFileSync(new URL("src/random.ts", ROOT), "utf8"), /getRandomValues/);
});

test("a correctly signed description verifies; every altered field or another key is refused", () => {
  const good = signedCampaign();
  assert.equal(verifyDescription(good, { aggregatorKey: PINNED }).campaign.id, "c1");
  assert.equal(verifyDescription(good, { aggregatorKey: Buffer.from(PINNED).toString("hex") }).randomiser.name, "binary_rr");
  // flip one byte anywhere in the signed body: refused
  const bodyLength = good.length - 67; // the signature record: tag b201, length 64, 64 bytes
  const signatureAt = good.length - 67 - 19; // before the incarnation record (tag c202, length 16, 16 bytes)
  for (let i = 0; i < good.length; i++) {
    if (i >= signatureAt && i < signatureAt + 67) continue;
    const altered = good.slice();
    altered[i] ^= 0x01;
    assert.throws(() => verifyDescription(altered, { aggregatorKey: PINNED }), (e) => e instanceof CampaignSignatureError || e.name === "ProtoError" || e instanceof CampaignInvalid || e instanceof UnsupportedCampaign, `byte ${i}`);
  }
  assert.throws(() => verifyDescription(signedCampaign({}, new Uint8Array(32).fill(8)), { aggregatorKey: PINNED }), CampaignSignatureError);
  const unsigned = Uint8Array.from([...good.slice(0, signatureAt), ...good.slice(signatureAt + 67)]);
  assert.equal(unsigned.length, bodyLength);
  assert.throws(() => verifyDescription(unsigned, { aggregatorKey: PINNED }), /not signed/);
  assert.throws(() => verifyDescription(good, {}), /no aggregator signing key pinned/);
  assert.throws(() => verifyDescription(good, { aggregatorKey: "abcd" }), /32 bytes/);
  // with the check removed (insecureSkipVerify), the forged key is taken: the signature is what refuses it
  const forged = signedCampaign({ publicKey: new Uint8Array(32).fill(1) }, new Uint8Array(32).fill(8));
  assert.equal(verifyDescription(forged, { insecureSkipVerify: true }).campaign.publicKey[0], 1);
});

test("DevicePolicy refuses weaker campaigns with CampaignPolicyError (same limits as the Python SDK)", () => {
  const check = (overrides, policy) => verifyDescription(signedCampaign(overrides), { aggregatorKey: PINNED, policy });
  assert.throws(() => check({ epsilon0: 3, deviceBudgetEpsilon: 3 }, { maxEpsilon0: 2 }), CampaignPolicyError);
  assert.throws(() => check({ deviceBudgetEpsilon: 5 }, { maxDeviceBudget: 2 }), CampaignPolicyError);
  assert.throws(() => check({ nMin: 10 }, { minBatch: 100 }), /n_min 10 is below/);
  assert.throws(() => check({}, { allowedMechanisms: ["grr"] }), /binary_rr is not an allowed/);
  assert.doesNotThrow(() => check({ epsilon0: 2, nMin: 100 }, { maxEpsilon0: 2, minBatch: 100, allowedMechanisms: ["BINARY_RR"] }));
});

test("campaigns this SDK cannot serve are refused with a clear error", () => {
  const check = (overrides) => verifyDescription(signedCampaign(overrides), { aggregatorKey: PINNED });
  for (const mechanism of [8, 9, 10, 11, 12, 13]) {
    assert.throws(() => check({ mechanism, labels: ["a", "b", "c"] }), /multi-message \(shuffle-only\) protocol/);
  }
  assert.throws(() => check({ mechanism: 99 }), /unknown mechanism 99/);
  assert.throws(() => check({ plaintextLength: 112 }), /declares payload\/plaintext\/ciphertext lengths/);
  assert.throws(() => check({ publicKey: new Uint8Array(31) }), /public key is 31 bytes/);
  assert.throws(() => check({ hpkeSuite: "X25519-HKDF-SHA256-AES128GCM" }), /HPKE suite/);
  assert.throws(() => check({ deviceBudgetEpsilon: 0 }), /device budget/);
  assert.throws(() => check({ id: "Bad Id" }), /invalid campaign id/);
  assert.throws(() => check({ mechanism: 5, labels: ["a", "b", "c"], params: { g: 6 } }), /prime power/);
  assert.throws(() => check({ mechanism: 7, labels: ["a", "b", "c"], params: { subset_size: 3 } }), /subset_size/);
});

/** A transport over a signed campaign whose submit answers from `script` (a function per call). */
function fakeTransport(campaign, script) {
  const calls = [];
  return {
    calls,
    getCampaign: async () => campaign,
    submit: async (id, reports) => {
      calls.push(reports.map((r) => r.ciphertext));
      return script(calls.length, reports);
    },
  };
}

const instant = { sleep: async () => {}, clock: () => 1000 };

test("retries: transient failures back off and resend the same ciphertexts; after maxAttempts reports stay queued", async () => {
  const delays = [];
  const transport = fakeTransport(signedCampaign(), (n) => {
    if (n <= 3) throw new TransportError("unavailable", true, 503);
    return { accepted: 2, rejected: [] };
  });
  const store = new MemoryStore();
  const reporter = await Reporter.fetch("c1", { transport, store, aggregatorKey: PINNED, ...instant, sleep: async (ms) => { delays.push(ms); } });
  await reporter.recordMany([0, 1]);
  const first = await reporter.sendPending({ maxAttempts: 2 });
  assert.deepEqual(first, { acknowledged: 0, rejected: 0, pending: 2, rejections: {} });
  const second = await reporter.sendPending({ maxAttempts: 8, baseDelayS: 0.1, maxDelayS: 1 });
  assert.deepEqual(second, { acknowledged: 2, rejected: 0, pending: 0, rejections: {} });
  assert.equal(transport.calls.length, 4);
  for (const call of transport.calls) assert.deepEqual(call, transport.calls[0], "the same sealed ciphertexts every time");
  assert.equal(delays.length, 2);
  assert.ok(delays[1] >= 50 && delays[1] < 100, `second-call first delay in [cap/2, cap): ${delays[1]}`);
});

test("a rejection is final and counted; a permanent failure is thrown and keeps the reports", async () => {
  const transport = fakeTransport(signedCampaign(), (n) => {
    if (n === 1) throw new TransportError("malformed_body", false, 400);
    return { accepted: 1, rejected: [{ index: 1, reason: 9, detail: "closed" }] };
  });
  const reporter = await Reporter.fetch("c1", { transport, store: new MemoryStore(), aggregatorKey: PINNED, ...instant });
  await reporter.recordMany([0, 1]);
  await assert.rejects(reporter.sendPending(), TransportError);
  assert.equal(await reporter.outbox.count("c1"), 2);
  assert.deepEqual(await reporter.sendPending(), { acknowledged: 1, rejected: 1, pending: 0, rejections: { CAMPAIGN_CLOSED: 1 } });
});

test("a response that does not account for every report is refused", async () => {
  const transport = fakeTransport(signedCampaign(), () => ({ accepted: 5, rejected: [] }));
  const reporter = await Reporter.fetch("c1", { transport, store: new MemoryStore(), aggregatorKey: PINNED, ...instant });
  await reporter.recordMany([0]);
  await assert.rejects(reporter.sendPending(), /accounted for 5 \+ 0 of 1/);
});

test("fetch retries a retryable failure until the deadline, then CampaignUnavailable", async () => {
  let now = 0;
  const transport = { getCampaign: async () => { throw new TransportError("down", true, 503); } };
  await assert.rejects(
    Reporter.fetch("c1", { transport, store: new MemoryStore(), aggregatorKey: PINNED, clock: () => now, sleep: async (ms) => { now += ms / 1000; }, giveUpAfterS: 3 }),
    /unavailable/,
  );
  assert.ok(now >= 3);
});

test("window, value domain and the one-report budget (durable in a FileStore across restarts)", async () => {
  const dir = mkdtempSync(join(tmpdir(), "deniable-ledger-"));
  try {
    const path = join(dir, "device.json");
    const open = async (overrides = {}) => {
      const store = await FileStore.open(path);
      const transport = fakeTransport(signedCampaign(overrides), () => ({ accepted: 1, rejected: [] }));
      return Reporter.fetch("c1", { transport, store, ledger: new BudgetLedger(store), aggregatorKey: PINNED, ...instant });
    };
    const reporter = await open();
    await assert.rejects(reporter.record(2), RangeError);
    await reporter.record(1);
    await assert.rejects(reporter.record(1), BudgetExceeded);
    const restarted = await open();
    assert.equal(await restarted.outbox.count("c1"), 1, "the outbox survived the restart");
    await assert.rejects(restarted.record(0), BudgetExceeded, "the ledger survived the restart");
    const closed = await open({ id: "c1", windowEnd: 500 });
    await assert.rejects(closed.record(0), CampaignClosed);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("backoff: cap doubles to the max; delays uniform in [cap/2, cap) from the CSPRNG", () => {
  assert.deepEqual([0, 1, 2, 10].map((a) => backoffCap(a, 0.05, 1)), [0.05, 0.1, 0.2, 1]);
  for (let i = 0; i < 2000; i++) {
    const d = backoffDelay(3, 0.05, 5);
    assert.ok(d >= 0.2 && d < 0.4, String(d));
  }
  assert.equal(backoffDelay(0, 0, 5), 0);
  assert.equal(backoffDelay(0, 1, 5, () => new Uint8Array(7).fill(0)), 0.5);
  assert.ok(backoffDelay(0, 1, 5, () => new Uint8Array(7).fill(255)) < 1);
});

test("SubmitReportsRequest / Response codec", () => {
  const body = encodeSubmitRequest([{ campaignId: "c1", keyId: 3, ciphertext: Uint8Array.of(1, 2) }]);
  assert.equal(Buffer.from(body).toString("hex"), "0a0a" + "0a026331" + "1003" + "1a020102");
  const response = decodeSubmitResponse(Uint8Array.from([0x08, 0x02, 0x12, 0x06, 0x08, 0x01, 0x10, 0x08, 0x1a, 0x00]));
  assert.deepEqual(response, { accepted: 2, rejected: [{ index: 1, reason: 8, detail: "" }] });
});

test("React Native shape: an AsyncStorage-like store and an injected fetch carry the whole flow", async () => {
  const { HttpTransport, asyncStorageStore } = await import("../dist/index.js");
  const data = new Map();
  const AsyncStorage = {
    getItem: async (k) => data.get(k) ?? null,
    multiSet: async (pairs) => pairs.forEach(([k, v]) => data.set(k, v)),
    multiRemove: async (keys) => keys.forEach((k) => data.delete(k)),
    getAllKeys: async () => [...data.keys()],
  };
  const requests = [];
  const fetch = async (url, init) => {
    requests.push([init.method, url, init.headers["Content-Type"]]);
    const body = init.method === "GET" ? signedCampaign() : Uint8Array.from([0x08, 0x01]);
    return { status: 200, headers: { get: () => "application/x-protobuf" }, arrayBuffer: async () => body.buffer.slice(body.byteOffset, body.byteOffset + body.byteLength) };
  };
  const store = asyncStorageStore(AsyncStorage);
  const reporter = await Reporter.fetch("c1", { transport: new HttpTransport("https://shuffler.example/", { fetch }), store, ledger: new BudgetLedger(store), aggregatorKey: PINNED });
  await reporter.record(1);
  assert.ok([...data.keys()].every((k) => k.startsWith("deniable:")));
  assert.equal([...data.keys()].filter((k) => k.startsWith("deniable:outbox/c1/")).length, 1);
  assert.deepEqual(await reporter.sendPending(), { acknowledged: 1, rejected: 0, pending: 0, rejections: {} });
  assert.deepEqual(requests, [
    ["GET", "https://shuffler.example/v1/campaigns/c1", undefined],
    ["POST", "https://shuffler.example/v1/campaigns/c1/reports", "application/x-protobuf"],
  ]);
});

test("HttpTransport: 408/429/5xx and network errors are retryable, other 4xx permanent with the endpoint's code", async () => {
  const { HttpTransport } = await import("../dist/index.js");
  const answer = (status, body, type = "application/json") => async () => ({
    status, headers: { get: () => type }, arrayBuffer: async () => new TextEncoder().encode(body).buffer,
  });
  const outcome = async (fetch) => new HttpTransport("https://s", { fetch }).getCampaign("c1").then(() => "ok", (e) => [e.retryable, e.status, e.code]);
  assert.deepEqual(await outcome(answer(503, '{"code":"overloaded","message":"x"}')), [true, 503, "overloaded"]);
  assert.deepEqual(await outcome(answer(429, '{"code":"quota_exceeded","message":"x"}')), [true, 429, "quota_exceeded"]);
  assert.deepEqual(await outcome(answer(408, "")), [true, 408, undefined]);
  assert.deepEqual(await outcome(answer(400, '{"code":"malformed_body","message":"x"}')), [false, 400, "malformed_body"]);
  assert.deepEqual(await outcome(answer(404, '{"code":"not_found","message":"x"}')), [false, 404, "not_found"]);
  assert.deepEqual(await outcome(answer(200, "<html>", "text/html")), [true, 200, undefined], "a proxy's page");
  assert.deepEqual(await outcome(async () => { throw new TypeError("fetch failed"); }), [true, undefined, undefined]);
});

test("the incarnation is pinned on first fetch (durably): an older life's signed description is refused", async () => {
  const { CampaignIncarnationError } = await import("../dist/index.js");
  const dir = mkdtempSync(join(tmpdir(), "deniable-incarnation-"));
  try {
    const path = join(dir, "device.json");
    const fetchWith = async (incarnation) => {
      const transport = fakeTransport(signedCampaign({ incarnation }), () => ({ accepted: 1, rejected: [] }));
      return Reporter.fetch("c1", { transport, store: await FileStore.open(path), aggregatorKey: PINNED, ...instant });
    };
    const current = new Uint8Array(16).fill(2);
    await fetchWith(current);
    await fetchWith(current);
    await assert.rejects(fetchWith(new Uint8Array(16).fill(1)), CampaignIncarnationError, "a genuinely signed older life");
    await assert.rejects(fetchWith(new Uint8Array(16).fill(1)), CampaignInvalid, "a CampaignInvalid, as in Python");
    await fetchWith(new Uint8Array(0)); // made before incarnations existed: neither pinned nor refused (Python's rule)
    // a fresh device (no pin) accepts either: the pin is what refuses the replay
    const transport = fakeTransport(signedCampaign({ incarnation: new Uint8Array(16).fill(1) }), () => ({ accepted: 1, rejected: [] }));
    await Reporter.fetch("c1", { transport, store: new MemoryStore(), aggregatorKey: PINNED, ...instant });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the incarnation is bound into the HPKE info of every sealed report", async () => {
  const { hpkeInfo } = await import("../dist/index.js");
  const plain = Buffer.from(hpkeInfo("c1", 7)).toString("hex");
  assert.equal(plain, Buffer.from("deniable/v1/report").toString("hex") + "0002" + "6331" + "00000007");
  assert.equal(Buffer.from(hpkeInfo("c1", 7, Uint8Array.of(0xaa, 0xbb))).toString("hex"), plain + "02aabb");
  assert.throws(() => hpkeInfo("c1", 7, new Uint8Array(256)), /at most 255/);
});

test("size classes: every plaintext is padded to 128, 256, … bytes whatever the mechanism", async () => {
  const { layoutFor, SIZE_CLASSES } = await import("../dist/index.js");
  assert.equal(SIZE_CLASSES[0], 128);
  assert.equal(SIZE_CLASSES.at(-1), 131072);
  assert.deepEqual(layoutFor(1), { payloadLength: 1, plaintextLength: 128, ciphertextLength: 176 });
  assert.equal(layoutFor(40).plaintextLength, 128);
  assert.equal(layoutFor(41).plaintextLength, 256);
  assert.equal(layoutFor(65535).plaintextLength, 131072);
  assert.throws(() => layoutFor(0), RangeError);
});
