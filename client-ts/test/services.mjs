// Starts the real Python services for the Node and browser tests: `deniable certs dev`, an aggregator
// and a shuffler (TLS everywhere, the shuffler's HTTPS device endpoint on a free port), campaigns
// created with the aggregator-operator certificate. Finds `deniable` in $DENIABLE_BIN, ../.venv/bin, or PATH.
import { execFile, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);
const REPO = fileURLToPath(new URL("../../", import.meta.url));

/** The `deniable` executable, or an Error saying how to provide it. */
export function deniableBin() {
  const candidates = [process.env.DENIABLE_BIN, join(REPO, ".venv/bin/deniable")].filter(Boolean);
  for (const candidate of candidates) if (existsSync(candidate)) return candidate;
  for (const dir of (process.env.PATH ?? "").split(":")) {
    if (dir && existsSync(join(dir, "deniable"))) return join(dir, "deniable");
  }
  throw new Error(
    "the e2e tests need the Python services: run `pip install -e \".[server]\"` in a venv at the repository root (.venv) or set DENIABLE_BIN",
  );
}

/** The Python of the environment `deniable` is installed in (the one that has the Deniable core). */
export function pythonBin() {
  const beside = join(dirname(deniableBin()), "python");
  return existsSync(beside) ? beside : "python3";
}

async function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** Resolve with the first captured group of `pattern` in the child's stderr/stdout, or reject on exit. */
function waitForLine(child, pattern, what, timeoutMs = 60000) {
  return new Promise((resolve, reject) => {
    let seen = "";
    const timer = setTimeout(() => reject(new Error(`${what} did not start in time:\n${seen.slice(-2000)}`)), timeoutMs);
    const onData = (chunk) => {
      seen += chunk.toString();
      const match = seen.match(pattern);
      if (match) {
        clearTimeout(timer);
        resolve(match[1]);
      }
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", onData);
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`${what} exited with ${code}:\n${seen.slice(-2000)}`));
    });
  });
}

/**
 * Start aggregator + shuffler. `campaigns`: [{id, kind, labels?, epsilon0, mechanism?}];
 * `corsOrigins`: browser origins allowed on the HTTPS endpoint. Returns the stack; call `stop()`.
 */
export async function startServices({ campaigns, corsOrigins = [] }) {
  const bin = deniableBin();
  const dir = mkdtempSync(join(tmpdir(), "deniable-ts-"));
  const certs = join(dir, "certs");
  await run(bin, ["certs", "dev", "--out", certs]);
  // One CA per party (ADR 0030): each caller trusts only its peer's CA; servers verify callers with a bundle.
  const tls = (role, ca) => ["--tls-cert", join(certs, `${role}.pem`), "--tls-key", join(certs, `${role}.key`), "--tls-ca", join(certs, ca)];
  const [aggregatorPort, shufflerPort, operatorPort] = [await freePort(), await freePort(), await freePort()];
  const aggregator = `127.0.0.1:${aggregatorPort}`;
  const children = [];
  const spawnService = (args) => {
    const child = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] });
    children.push(child);
    return child;
  };
  const stop = async () => {
    for (const child of children) if (child.exitCode === null) child.kill("SIGTERM");
    await Promise.all(children.map((c) => (c.exitCode === null ? new Promise((r) => c.once("exit", r)) : null)));
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    const agg = spawnService(["aggregator", "serve", "--data-dir", join(dir, "agg"), "--listen", aggregator, ...tls("aggregator", "aggregator-clients-ca.pem")]);
    await waitForLine(agg, /(serving|listening)[^\n]*?(\d+\.\d+\.\d+\.\d+:\d+)/, "aggregator");
    const shuffler = spawnService([
      "shuffler", "serve", "--data-dir", join(dir, "shuf"), "--listen", `127.0.0.1:${shufflerPort}`,
      "--operator-listen", `127.0.0.1:${operatorPort}`, "--upstream", aggregator, "--quota-per-source", "0",
      "--min-n-min", "1", "--min-batch-target", "1", // tests send single reports; production keeps the floor
      "--https-listen", "127.0.0.1:0", ...corsOrigins.flatMap((o) => ["--https-cors-origin", o]), ...tls("shuffler", "shuffler-clients-ca.pem"),
      "--upstream-ca", join(certs, "aggregator-ca.pem"),
    ]);
    const https = await waitForLine(shuffler, /serving devices over HTTPS on (\S+?:\d+)/, "shuffler");
    const op = ["--aggregator", aggregator, ...tls("aggregator-operator", "aggregator-ca.pem")];
    for (const c of campaigns) {
      const labels = c.labels ? ["--labels", c.labels.join(",")] : [];
      const mechanism = c.mechanism ? ["--mechanism", c.mechanism] : [];
      await run(bin, ["campaign", "create", ...op, "--id", c.id, "--question", "q?", "--kind", c.kind ?? "binary",
        ...labels, ...mechanism, "--epsilon0", String(c.epsilon0 ?? 1), "--n-min", "1"]);
    }
    const keys = JSON.parse((await run(bin, ["keys", "show", ...op, "--json"])).stdout);
    return {
      dir, bin, certs, ca: join(certs, "shuffler-ca.pem"), caPem: readFileSync(join(certs, "shuffler-ca.pem"), "utf8"),
      shufflerCert: join(certs, "shuffler.pem"), url: `https://${https}`, https,
      aggregatorKey: keys.signing_public_key, stop,
      /** Forward everything the shuffler holds, then the aggregator's JSON answer for `id` once it counted `expected`. */
      async counted(id, kind, expected, timeoutMs = 60000) {
        const opShuffler = ["--shuffler", `127.0.0.1:${operatorPort}`, ...tls("shuffler-operator", "shuffler-ca.pem")];
        await run(bin, ["shuffler", "flush", ...opShuffler]);
        const deadline = Date.now() + timeoutMs;
        for (;;) {
          const answer = JSON.parse((await run(bin, ["query", kind, id, ...op, "--json"])).stdout);
          if (answer.n >= expected || Date.now() > deadline) return answer;
          await new Promise((r) => setTimeout(r, 500));
        }
      },
    };
  } catch (error) {
    await stop();
    throw error;
  }
}
