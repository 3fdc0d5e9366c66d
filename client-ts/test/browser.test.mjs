// The SDK in headless Chromium (Debian's /usr/bin/chromium driven by playwright-core; nothing downloads
// a browser): the browser bundle loaded by a page served on http://localhost, IndexedDB outboxes and
// ledgers, reports sent over HTTPS (CORS allow-list set to the page's origin) to the real services.
// TLS: Chromium trusts exactly the shuffler's key through --ignore-certificate-errors-spki-list (its
// SPKI SHA-256 pin), not a blanket ignore. Chromium negotiates HTTP/2 with the HTTPS face (ALPN h2,
// ADR 0038); the test checks it through the DevTools protocol.
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { createServer } from "node:http";
import { after, before, test } from "node:test";
import { chromium } from "playwright-core";
import { chromiumArgs, spkiPin } from "./chromium.mjs";
import { startServices } from "./services.mjs";

const CHROMIUM = process.env.CHROMIUM_BIN ?? "/usr/bin/chromium";
const DEVICES = 12;
const FILES = {
  "/": ["test/browser/page.html", "text/html"],
  "/deniable.min.js": ["bundle/deniable.min.js", "text/javascript"],
};
let stack, server, browser, origin;

before(async () => {
  if (!existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} is missing: install Debian's chromium (scripts/system-deps.sh)`);
  const root = new URL("../", import.meta.url);
  server = createServer((req, res) => {
    const file = FILES[new URL(req.url, "http://localhost").pathname];
    if (!file) return res.writeHead(404).end();
    res.writeHead(200, { "Content-Type": file[1] }).end(readFileSync(new URL(file[0], root)));
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  origin = `http://localhost:${server.address().port}`;
  stack = await startServices({ campaigns: [{ id: "dark-mode", epsilon0: 1 }], corsOrigins: [origin] });
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: chromiumArgs(spkiPin(readFileSync(stack.shufflerCert))) });
});

after(async () => {
  await browser?.close();
  server?.close();
  await stack?.stop();
});

test(`${DEVICES} browser devices: IndexedDB outbox survives a reload, reports counted once`, async () => {
  const context = await browser.newContext();
  const page = await context.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  // which HTTP version each answer of the shuffler came over, as Chromium's network stack saw it
  const protocols = new Set();
  const cdp = await context.newCDPSession(page);
  await cdp.send("Network.enable");
  cdp.on("Network.responseReceived", (e) => {
    if (e.response.url.startsWith(stack.url)) protocols.add(e.response.protocol);
  });
  const load = async () => {
    await page.goto(`${origin}/`);
    await page.waitForFunction(() => window.ready === true);
  };
  await load();
  const base = { shuffler: stack.url, campaign: "dark-mode", aggregatorKey: stack.aggregatorKey };
  // device 0 records, the page reloads before it sends: the report waits in IndexedDB
  const queued = await page.evaluate((args) => window.device(args), { ...base, name: "device-0", value: 1, send: false });
  assert.deepEqual(queued, { queued: 1, result: null });
  await load();
  let acknowledged = 0;
  const first = await page.evaluate((args) => window.device(args), { ...base, name: "device-0" });
  assert.equal(first.queued, 1, "the queued report survived the reload");
  acknowledged += first.result.acknowledged;
  for (let i = 1; i < DEVICES; i++) {
    const { result } = await page.evaluate((args) => window.device(args), { ...base, name: `device-${i}`, value: i % 2 });
    assert.deepEqual(result, { acknowledged: 1, rejected: 0, pending: 0, rejections: {} });
    acknowledged += result.acknowledged;
  }
  // the ledger in IndexedDB refuses a second report from device 1
  const again = await page.evaluate((args) => window.device(args).then(() => "sent", (e) => e.name), { ...base, name: "device-1", value: 1 });
  assert.equal(again, "BudgetExceeded");
  const answer = await stack.counted("dark-mode", "binary-sum", DEVICES);
  console.log(`# browser: sent ${DEVICES}, acknowledged ${acknowledged}, counted ${answer.n}`);
  assert.equal(acknowledged, DEVICES);
  assert.equal(answer.n, DEVICES);
  assert.equal(answer.rejected, 0);
  assert.deepEqual(errors, []);
  assert.deepEqual([...protocols], ["h2"], "Chromium negotiates HTTP/2 with the shuffler (ALPN h2)");
  await context.close();
});

test("a page from an origin not on the allow-list cannot report (CORS)", async () => {
  const context = await browser.newContext();
  const page = await context.newPage();
  await page.route("http://elsewhere.test/", (route) => route.fulfill({ contentType: "text/html", body: "<p>x</p>" }));
  await page.goto("http://elsewhere.test/");
  const outcome = await page.evaluate((url) => fetch(`${url}/v1/campaigns/dark-mode`).then((r) => `status ${r.status}`, (e) => e.name), stack.url);
  assert.equal(outcome, "TypeError", "the browser refuses the cross-origin answer");
  await context.close();
});

test("without the SPKI pin Chromium refuses the dev CA's certificate: the pin is what lets the page in", async () => {
  const args = chromiumArgs("x").filter((a) => !a.startsWith("--ignore-certificate-errors-spki-list"));
  const unpinned = await chromium.launch({ executablePath: CHROMIUM, headless: true, args });
  try {
    const page = await unpinned.newPage();
    await page.goto(`${origin}/`);
    await page.waitForFunction(() => window.ready === true);
    const outcome = await page.evaluate((url) => fetch(`${url}/v1/campaigns/dark-mode`).then((r) => `status ${r.status}`, (e) => e.name), stack.url);
    assert.equal(outcome, "TypeError");
  } finally {
    await unpinned.close();
  }
});
