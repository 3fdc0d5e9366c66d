/**
 * Node-only pieces (import "@deniable/client/node"): `FileStore`, an outbox/ledger store in one JSON
 * file replaced atomically and fsynced on every write, and `nodeFetch`, a FetchLike over node:https
 * that trusts a given CA (the development CA of `deniable certs dev`, or a private PKI).
 */
import { Agent, request } from "node:https";
import { type PeerCertificate, checkServerIdentity } from "node:tls";
import { open, readFile, rename } from "node:fs/promises";
import { dirname } from "node:path";
import type { KeyValueStore } from "./store.js";
import type { FetchLike } from "./transport.js";

/** A KeyValueStore in one JSON file: survives restarts; each write is complete or absent. */
export class FileStore implements KeyValueStore {
  private queue: Promise<unknown> = Promise.resolve();
  private constructor(private readonly path: string, private readonly data: Map<string, string>) {}

  /** Open (or start) the store at `path`. */
  static async open(path: string): Promise<FileStore> {
    let data = new Map<string, string>();
    try {
      data = new Map(Object.entries(JSON.parse(await readFile(path, "utf8")) as Record<string, string>));
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
    }
    return new FileStore(path, data);
  }

  private persist(change: () => void): Promise<void> {
    const run = this.queue.then(async () => {
      change();
      const temporary = `${this.path}.tmp`;
      const file = await open(temporary, "w", 0o600);
      try {
        await file.writeFile(JSON.stringify(Object.fromEntries(this.data)));
        await file.sync();
      } finally {
        await file.close();
      }
      await rename(temporary, this.path);
      const dir = await open(dirname(this.path), "r");
      try {
        await dir.sync();
      } finally {
        await dir.close();
      }
    });
    this.queue = run.catch(() => undefined);
    return run;
  }

  async get(key: string): Promise<string | undefined> {
    await this.queue;
    return this.data.get(key);
  }
  setMany(entries: ReadonlyArray<readonly [string, string]>): Promise<void> {
    return this.persist(() => entries.forEach(([k, v]) => this.data.set(k, v)));
  }
  deleteMany(keys: readonly string[]): Promise<void> {
    return this.persist(() => keys.forEach((k) => this.data.delete(k)));
  }
  async keys(prefix: string): Promise<string[]> {
    await this.queue;
    return [...this.data.keys()].filter((k) => k.startsWith(prefix)).sort();
  }
}

/**
 * The host check plus the peer's role: its certificate must name `spiffe://deniable/<role>` (docs/security.md,
 * roles), so a holder of another Deniable certificate (aggregator, operator, device) cannot pose as the shuffler.
 */
export function roleChecker(role: string | null): (host: string, cert: PeerCertificate) => Error | undefined {
  return (host, cert) => {
    const error = checkServerIdentity(host, cert);
    if (error !== undefined || role === null) return error;
    const uris = (cert.subjectaltname ?? "").split(", ").filter((n) => n.startsWith("URI:"));
    if (!uris.includes(`URI:spiffe://deniable/${role}`)) {
      return new Error(`the server's certificate is not a ${role} certificate (it names ${uris.join(" ") || "no role"})`);
    }
    return undefined;
  };
}

/**
 * A FetchLike over node:https that verifies the server against `ca` (PEM) instead of the system roots,
 * and its role (default "shuffler"; null to skip, for a certificate from a PKI without Deniable roles).
 */
export function nodeFetch(options: { ca?: string | Buffer; timeoutMs?: number; role?: string | null } = {}): FetchLike {
  const role = options.role === undefined ? "shuffler" : options.role;
  const agent = new Agent({ keepAlive: true, ca: options.ca, minVersion: "TLSv1.2", checkServerIdentity: roleChecker(role) });
  return (url, init) =>
    new Promise((resolve, reject) => {
      const req = request(url, { method: init.method, headers: init.headers, agent, timeout: options.timeoutMs ?? 15000 }, (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (chunk: Buffer) => chunks.push(chunk));
        res.on("error", reject);
        res.on("end", () => {
          const body = Buffer.concat(chunks);
          resolve({
            status: res.statusCode ?? 0,
            headers: { get: (name: string) => (res.headers[name.toLowerCase()] as string | undefined) ?? null },
            arrayBuffer: async () => body.buffer.slice(body.byteOffset, body.byteOffset + body.byteLength) as ArrayBuffer,
          });
        });
      });
      req.on("timeout", () => req.destroy(new Error("request timed out")));
      req.on("error", reject);
      req.end(init.body === undefined ? undefined : Buffer.from(init.body));
    });
}

export * from "./index.js";
