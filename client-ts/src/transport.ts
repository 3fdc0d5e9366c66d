/**
 * The shuffler's HTTPS device endpoint (docs/https.md): `GET /v1/campaigns/{id}` (signed Campaign
 * bytes) and `POST /v1/campaigns/{id}/reports` (SubmitReportsRequest → SubmitReportsResponse), over a
 * pluggable `fetch` (the global one in browsers and Node; React Native's, or `nodeFetch` with a CA).
 */
import { type EncryptedReport, type SubmitResponse, decodeSubmitResponse, encodeSubmitRequest } from "./proto.js";

const PROTOBUF = "application/x-protobuf";
const RETRYABLE = new Set([408, 429]);

/** The subset of the Fetch API this SDK uses. */
export type FetchLike = (
  url: string,
  init: { method: string; headers: Record<string, string>; body?: Uint8Array; signal?: AbortSignal },
) => Promise<{ status: number; headers: { get(name: string): string | null }; arrayBuffer(): Promise<ArrayBuffer> }>;

/** A failed exchange with the shuffler; `retryable` says whether the same request may succeed later. */
export class TransportError extends Error {
  override name = "TransportError";
  constructor(message: string, readonly retryable: boolean, readonly status?: number, readonly code?: string) {
    super(message);
  }
}

/** What the Reporter needs from a transport (an HTTPS one here; tests inject fakes). */
export interface Transport {
  getCampaign(campaignId: string): Promise<Uint8Array>;
  submit(campaignId: string, reports: readonly EncryptedReport[]): Promise<SubmitResponse>;
}

async function refusal(status: number, body: ArrayBuffer): Promise<[string, string | undefined]> {
  try {
    const error = JSON.parse(new TextDecoder().decode(body)) as { code?: string; message?: string };
    if (typeof error.code === "string") return [`${error.code}: ${error.message ?? ""}`, error.code];
  } catch {
    // not the endpoint's JSON error body: a proxy's page
  }
  return [`HTTP ${status}`, undefined];
}

/** The shuffler over HTTPS at `baseUrl` (e.g. "https://shuffler.example:8443"). */
export class HttpTransport implements Transport {
  private readonly fetchFn: FetchLike;
  private readonly baseUrl: string;

  constructor(baseUrl: string, options: { fetch?: FetchLike; timeoutMs?: number } = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    // the global fetch must be called on globalThis ("Illegal invocation" otherwise, in browsers)
    const global = typeof globalThis.fetch === "function" ? (globalThis.fetch.bind(globalThis) as unknown as FetchLike) : undefined;
    const fetchFn = options.fetch ?? global;
    if (fetchFn === undefined) throw new Error("no fetch available: pass options.fetch");
    this.fetchFn = fetchFn;
    this.timeoutMs = options.timeoutMs ?? 15000;
  }
  private readonly timeoutMs: number;

  private async exchange(path: string, method: string, body?: Uint8Array): Promise<Uint8Array> {
    const headers: Record<string, string> = { Accept: PROTOBUF };
    if (body !== undefined) headers["Content-Type"] = PROTOBUF;
    let response;
    let data: ArrayBuffer;
    // AbortSignal.timeout is missing on some React Native runtimes: no client-side timeout there
    const hasTimeout = typeof AbortSignal !== "undefined" && typeof AbortSignal.timeout === "function";
    const signal = hasTimeout ? AbortSignal.timeout(this.timeoutMs) : undefined;
    try {
      response = await this.fetchFn(this.baseUrl + path, { method, headers, body, signal });
      data = await response.arrayBuffer();
    } catch (error) {
      throw new TransportError(`shuffler unreachable: ${(error as Error).message ?? error}`, true);
    }
    if (response.status === 200) {
      const type = response.headers.get("content-type") ?? "";
      if (!type.startsWith(PROTOBUF) && !type.startsWith("application/protobuf")) {
        throw new TransportError(`shuffler answered 200 with content type ${JSON.stringify(type)}`, true, 200);
      }
      return new Uint8Array(data);
    }
    const [message, code] = await refusal(response.status, data);
    const retryable = RETRYABLE.has(response.status) || response.status >= 500;
    throw new TransportError(`shuffler refused ${method} ${path}: ${message}`, retryable, response.status, code);
  }

  /** The signed Campaign bytes (verify them: `verifyDescription`). */
  getCampaign(campaignId: string): Promise<Uint8Array> {
    return this.exchange(`/v1/campaigns/${encodeURIComponent(campaignId)}`, "GET");
  }

  /** Submit sealed reports of one campaign; the response accounts for each. */
  async submit(campaignId: string, reports: readonly EncryptedReport[]): Promise<SubmitResponse> {
    const body = encodeSubmitRequest(reports);
    const bytes = await this.exchange(`/v1/campaigns/${encodeURIComponent(campaignId)}/reports`, "POST", body);
    try {
      return decodeSubmitResponse(bytes);
    } catch (error) {
      throw new TransportError(`shuffler response is not a SubmitReportsResponse: ${(error as Error).message}`, false);
    }
  }
}
