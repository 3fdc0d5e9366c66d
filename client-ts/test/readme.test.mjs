// README.md's snippets run as written (Node: with SHUFFLER_URL / AGGREGATOR_KEY in the environment and
// certs/shuffler-ca.pem in its working directory; browser: the two documented placeholders replaced), and
// examples/send.mjs, all against the real services; every report must be counted.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { after, before, test } from "node:test";
import { chromium } from "playwright-core";
import { chromiumArgs, spkiPin } from "./chromium.mjs";
import { startServices } from "./services.mjs";

const run = promisify(execFile);
const ROOT = fileURLToPath(new URL("../", import.meta.url));
const README = readFileSync(join(ROOT, "README.md"), "utf8");
let stack, work, server, origin;
let page = "";

/** The fenced block of `language` after the `<!-- snippet: name` marker. */
function snippet(name, language) {
  const start = README.indexOf(`<!-- snippet: ${name}`);
  assert.ok(start >= 0, `README has a ${name} snippet`);
  const match = README.slice(start).match(new RegExp("```" + language + "\\n([\\s\\S]*?)```"));
  return match[1];
}

before(async () => {
  work = mkdtempSync(join(tmpdir(), "deniable-readme-"));
  const bundle = readFileSync(join(ROOT, "bundle/deniable.min.js"));
  server = createServer((req, res) => {
    if (req.url === "/deniable.min.js") return res.writeHead(200, { "Content-Type": "text/javascript" }).end(bundle);
    res.writeHead(200, { "Content-Type": "text/html" }).end(page);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  origin = `http://localhost:${server.address().port}`;
  stack = await startServices({
    campaigns: [{ id: "dark-mode" }, { id: "survey", kind: "categorical", labels: ["a", "b", "c"] }],
    corsOrigins: [origin],
  });
});

after(async () => {
  server?.close();
  await stack?.stop();
  rmSync(work, { recursive: true, force: true });
});

test("the Node snippet, as written", async () => {
  // inside the package so `@deniable/client` resolves to this package (self-reference), cwd elsewhere
  const dir = join(ROOT, "test", ".snippets");
  mkdirSync(dir, { recursive: true });
  const file = join(dir, "node-snippet.mjs");
  writeFileSync(file, snippet("node", "js"));
  mkdirSync(join(work, "node"));
  symlinkSync(stack.certs, join(work, "node", "certs"));
  const { stdout } = await run(process.execPath, [file], {
    cwd: join(work, "node"), env: { ...process.env, SHUFFLER_URL: stack.url, AGGREGATOR_KEY: stack.aggregatorKey },
  });
  assert.match(stdout, /acknowledged: 1, rejected: 0, pending: 0/);
});

test("the browser snippet, as written, in headless Chromium", async () => {
  page = snippet("browser", "html")
    .replace("https://shuffler.example:8443", stack.url)
    .replace("PINNED_AGGREGATOR_KEY_HEX", stack.aggregatorKey);
  const pin = spkiPin(readFileSync(stack.shufflerCert));
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM_BIN ?? "/usr/bin/chromium", headless: true, args: chromiumArgs(pin) });
  try {
    const tab = await browser.newPage();
    const errors = [];
    tab.on("pageerror", (e) => errors.push(e.message));
    await tab.goto(`${origin}/`);
    const answer = await stack.counted("dark-mode", "binary-sum", 2, 30000);
    assert.deepEqual(errors, []);
    assert.equal(answer.n, 2, "the Node snippet's report and the page's report counted");
  } finally {
    await browser.close();
  }
});

test("examples/send.mjs: N simulated devices, 'sent N, acknowledged A' last, all counted", async () => {
  const devices = 25;
  const { stdout } = await run(process.execPath, [
    join(ROOT, "examples/send.mjs"), "--shuffler", stack.url, "--ca", stack.ca, "--campaign", "survey",
    "--aggregator-key", stack.aggregatorKey, "--devices", String(devices),
  ]);
  const last = stdout.trim().split("\n").at(-1);
  assert.equal(last, `sent ${devices}, acknowledged ${devices}`);
  const answer = await stack.counted("survey", "histogram", devices);
  console.log(`# send.mjs: ${last}, counted ${answer.n}`);
  assert.equal(answer.n, devices);
  const { stdout: fixed } = await run(process.execPath, [
    join(ROOT, "examples/send.mjs"), "--shuffler", stack.url, "--ca", stack.ca, "--campaign", "survey",
    "--aggregator-key", stack.aggregatorKey, "--devices", "3", "--value", "2",
  ]);
  assert.equal(fixed.trim().split("\n").at(-1), "sent 3, acknowledged 3");
});
