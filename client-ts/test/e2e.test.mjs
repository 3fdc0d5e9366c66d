// End to end over TLS: the real Python aggregator and shuffler (processes started by test/services.mjs),
// N devices in Node, each with its own file-backed outbox and budget ledger, reporting through the
// shuffler's HTTPS endpoint; the aggregator's query API must count every report exactly once.
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:https";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { BudgetExceeded, BudgetLedger, CampaignSignatureError, HttpTransport, Reporter } from "../dist/index.js";
import { FileStore, nodeFetch } from "../dist/node.js";
import { startServices } from "./services.mjs";

const DEVICES = 30;
const PER_MECHANISM = 8;
const MECHANISMS = ["grr", "sue", "oue", "olh", "hadamard_response", "subset_selection"];
const LABELS = ["en", "es", "de", "fr", "it", "pt", "nl", "pl", "sv"];
let stack;
let work;

before(async () => {
  work = mkdtempSync(join(tmpdir(), "deniable-ts-devices-"));
  stack = await startServices({
    campaigns: [
      { id: "dark-mode", kind: "binary", epsilon0: 1 },
      ...MECHANISMS.map((m) => ({ id: `lang-${m.replace(/_/g, "-")}`, kind: "categorical", labels: LABELS, mechanism: m, epsilon0: 2 })),
    ],
  });
});

after(async () => {
  await stack?.stop();
  if (work) rmSync(work, { recursive: true, force: true });
});

async function device(index, campaignId) {
  const store = await FileStore.open(join(work, `device-${index}.json`));
  const transport = new HttpTransport(stack.url, { fetch: nodeFetch({ ca: stack.caPem }) });
  const reporter = await Reporter.fetch(campaignId, {
    transport, store, ledger: new BudgetLedger(store), aggregatorKey: stack.aggregatorKey,
    policy: { maxEpsilon0: 2, minBatch: 1 },
  });
  return { reporter, store, transport };
}

test(`${DEVICES} Node devices over HTTPS: recorded, restarted, sent, acknowledged and counted once`, async () => {
  let acknowledged = 0;
  let trueYes = 0;
  for (let i = 0; i < DEVICES; i++) {
    const { reporter } = await device(i, "dark-mode");
    const value = i % 3 === 0 ? 1 : 0;
    trueYes += value;
    await reporter.record(value);
    await assert.rejects(reporter.record(value), BudgetExceeded, "one report per device: the budget ledger refuses a second");
    // a restart: a fresh Reporter on the same file finds the queued report and sends it
    const { reporter: restarted } = await device(i, "dark-mode");
    assert.equal(await restarted.outbox.count("dark-mode"), 1);
    await assert.rejects(restarted.record(value), BudgetExceeded, "the ledger survives the restart too");
    const result = await restarted.sendPending();
    assert.deepEqual(result, { acknowledged: 1, rejected: 0, pending: 0, rejections: {} });
    acknowledged += result.acknowledged;
  }
  const answer = await stack.counted("dark-mode", "binary-sum", DEVICES);
  console.log(`# e2e: sent ${DEVICES}, acknowledged ${acknowledged}, counted ${answer.n} (true yes ${trueYes})`);
  assert.equal(acknowledged, DEVICES);
  assert.equal(answer.n, DEVICES, "every report counted");
  assert.equal(answer.rejected, 0);
  assert.equal(answer.buckets.reduce((sum, b) => sum + b.raw_count, 0), DEVICES, "each counted once");
});

test("every single-message mechanism's reports are accepted and counted by the aggregator", async () => {
  for (const mechanism of MECHANISMS) {
    const id = `lang-${mechanism.replace(/_/g, "-")}`;
    let acknowledged = 0;
    for (let i = 0; i < PER_MECHANISM; i++) {
      const { reporter } = await device(`${mechanism}-${i}`, id);
      assert.equal(reporter.checked.randomiser.name, mechanism);
      await reporter.record(i % LABELS.length);
      acknowledged += (await reporter.sendPending()).acknowledged;
    }
    const answer = await stack.counted(id, "histogram", PER_MECHANISM);
    console.log(`# e2e ${mechanism}: sent ${PER_MECHANISM}, acknowledged ${acknowledged}, counted ${answer.n}`);
    assert.equal(acknowledged, PER_MECHANISM);
    assert.equal(answer.n, PER_MECHANISM, `${mechanism}: every report counted`);
    assert.equal(answer.rejected, 0, `${mechanism}: nothing rejected (no PAYLOAD_OUT_OF_DOMAIN)`);
  }
});

test("a description not signed by the pinned key is refused before anything is sent", async () => {
  const store = await FileStore.open(join(work, "wrong-key.json"));
  const transport = new HttpTransport(stack.url, { fetch: nodeFetch({ ca: stack.caPem }) });
  const wrongKey = "11".repeat(32);
  await assert.rejects(Reporter.fetch("dark-mode", { transport, store, aggregatorKey: wrongKey }), CampaignSignatureError);
  await assert.rejects(Reporter.fetch("dark-mode", { transport, store }), CampaignSignatureError, "no pinned key: refused");
});

test("the shuffler's certificate is verified: without the dev CA the TLS handshake fails (retryable)", async () => {
  const transport = new HttpTransport(stack.url, { fetch: nodeFetch({}) });
  await assert.rejects(transport.getCampaign("dark-mode"), (e) => e.retryable === true && /unreachable/.test(e.message));
});

test("a server holding another Deniable certificate (the aggregator's) cannot pose as the shuffler", async () => {
  const key = readFileSync(join(stack.certs, "aggregator.key"));
  const cert = readFileSync(join(stack.certs, "aggregator.pem"));
  let reached = 0;
  const impostor = createServer({ key, cert }, (req, res) => {
    reached++;
    res.writeHead(200, { "Content-Type": "application/x-protobuf" }).end();
  });
  await new Promise((resolve) => impostor.listen(0, "127.0.0.1", resolve));
  try {
    const url = `https://127.0.0.1:${impostor.address().port}`;
    const refused = new HttpTransport(url, { fetch: nodeFetch({ ca: stack.caPem }) });
    // the shuffler party's CA (one CA per party, ADR 0030) does not vouch for the aggregator's certificate
    await assert.rejects(refused.getCampaign("dark-mode"), /unable to verify/);
    assert.equal(reached, 0, "no request reached the impostor");
    // the role pin refuses it on its own too, even from a client that trusts the aggregator's CA
    const aggregatorCa = readFileSync(join(stack.certs, "aggregator-ca.pem"), "utf8");
    const pinned = new HttpTransport(url, { fetch: nodeFetch({ ca: aggregatorCa }) });
    await assert.rejects(pinned.getCampaign("dark-mode"), /not a shuffler certificate/);
    assert.equal(reached, 0, "no request reached the impostor");
    // control: trusting that CA without the role check (the old single-CA layout) reaches the impostor
    const unchecked = new HttpTransport(url, { fetch: nodeFetch({ ca: aggregatorCa, role: null }) });
    assert.equal((await unchecked.getCampaign("dark-mode")).length, 0);
    assert.equal(reached, 1);
  } finally {
    impostor.close();
  }
});
