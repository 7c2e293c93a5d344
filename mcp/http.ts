/**
 * Streamable HTTP for MCP: one endpoint (`/mcp`), one MCP server (so one
 * ToolSession) per session, each session its own transport.
 *
 * Safe by default:
 * - binds to loopback (127.0.0.1) unless told otherwise;
 * - on loopback, a request whose Host header is not a loopback name, or
 *   whose Origin (when a browser sends one) is not a loopback origin, is
 *   refused (DNS rebinding: a web page whose name resolves to 127.0.0.1 must
 *   not reach the server);
 * - bound to any other address it will not start without a bearer token,
 *   and every request must carry it (compared in constant time).
 *
 * A call whose client goes away is not cut short: it runs to its end (the
 * native API's changes are atomic), so it either completes or, when it had
 * not started, is not applied. MCP cancellation (notifications/cancelled)
 * aborts the call's signal, which the native API honours.
 */
import { randomUUID, timingSafeEqual, createHash } from "node:crypto";
import { createServer, type IncomingMessage, type Server as HttpServer, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";

export interface HttpServeOptions {
  /** Address to bind. Default "127.0.0.1" (loopback only). */
  host?: string;
  /** Port. Default 0: any free port (see the answer's `port`). */
  port?: number;
  /** Bearer token every request must carry. Required when `host` is not a loopback address. */
  token?: string;
  /** Host header values (host or host:port) accepted besides the loopback names. */
  allowedHosts?: string[];
  /** Largest request body, in bytes. Default 4 MiB. */
  maxBodyBytes?: number;
  /** Sessions open at once; a new one beyond is refused (503). Default 256. */
  maxSessions?: number;
  /** A session no request has used for this long is closed. Default 30 minutes. */
  idleTimeoutMs?: number;
}

export interface HttpMcpServer {
  /** The endpoint, e.g. http://127.0.0.1:41234/mcp */
  readonly url: string;
  readonly port: number;
  /** Sessions open now. */
  sessions(): number;
  /** Closes every session and stops listening. */
  close(): Promise<void>;
}

const ENDPOINT = "/mcp";
const LOOPBACK_NAMES = new Set(["localhost", "127.0.0.1", "::1", "[::1]"]);

/** Whether an address (or name) only reaches this machine. */
export function isLoopback(host: string): boolean {
  const bare = host.replace(/^\[|\]$/g, "").toLowerCase();
  return bare === "localhost" || bare === "::1" || /^127(\.\d{1,3}){3}$/.test(bare) || bare === "::ffff:127.0.0.1";
}

/**
 * The rule for binding: loopback needs nothing, any other address a token.
 * Answers the reason a configuration is refused, or undefined when it is fine.
 */
export function bindingProblem(host: string, token: string | undefined): string | undefined {
  if (isLoopback(host)) return undefined;
  if (token === undefined || token.length < 16) {
    return `Binding to '${host}' exposes the workspace beyond this machine: a bearer token of at least 16 characters is required (--token or STRATA_MCP_TOKEN)`;
  }
  return undefined;
}

/** Serves a fresh MCP server (from `makeServer`) per session over Streamable HTTP. */
export async function serveHttp(makeServer: () => Server, options: HttpServeOptions = {}): Promise<HttpMcpServer> {
  const host = options.host ?? "127.0.0.1";
  const problem = bindingProblem(host, options.token);
  if (problem) throw new Error(problem);
  const maxBody = options.maxBodyBytes ?? 4 * 1024 * 1024;
  const maxSessions = options.maxSessions ?? 256;
  const allowedHosts = new Set((options.allowedHosts ?? []).map((name) => name.toLowerCase()));
  const tokenDigest = options.token === undefined ? undefined : digest(options.token);
  const sessions = new Map<string, { transport: StreamableHTTPServerTransport; server: Server; lastUsed: number }>();
  const idleMs = options.idleTimeoutMs ?? 30 * 60_000;
  // A client that vanished without ending its session (no DELETE) does not hold it, and its workspace, forever.
  const sweeper = setInterval(() => {
    const cutoff = Date.now() - idleMs;
    for (const { transport, lastUsed } of sessions.values()) if (lastUsed < cutoff) void transport.close().catch(() => undefined);
  }, Math.min(idleMs, 60_000));
  sweeper.unref();
  let port = 0;

  const hostAllowed = (header: string | undefined): boolean => {
    if (header === undefined) return false;
    const value = header.toLowerCase();
    if (allowedHosts.has(value)) return true;
    const match = /^(\[[^\]]+\]|[^:]+)(?::(\d+))?$/.exec(value);
    if (!match) return false;
    const [, name = "", givenPort] = match;
    if (allowedHosts.has(name)) return true;
    // Off loopback the token guards the server; the Host check is for loopback, where a rebound name could reach it.
    if (!isLoopback(host)) return true;
    return LOOPBACK_NAMES.has(name) || /^127(\.\d{1,3}){3}$/.test(name) ? givenPort === undefined || Number(givenPort) === port : false;
  };

  const originAllowed = (origin: string | undefined): boolean => {
    if (origin === undefined) return true;
    if (!isLoopback(host)) return true;
    try {
      const url = new URL(origin);
      return isLoopback(url.hostname) || allowedHosts.has(url.host.toLowerCase());
    } catch {
      return false;
    }
  };

  const authorized = (header: string | undefined): boolean => {
    if (tokenDigest === undefined) return true;
    const match = /^Bearer\s+(.+)$/i.exec(header ?? "");
    return match !== null && timingSafeEqual(digest(match[1] ?? ""), tokenDigest);
  };

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    if (!hostAllowed(req.headers.host)) return reply(res, 403, "Forbidden: this Host is not allowed (DNS rebinding protection)");
    if (!originAllowed(req.headers.origin)) return reply(res, 403, "Forbidden: this Origin is not allowed");
    if (!authorized(req.headers.authorization)) {
      res.setHeader("WWW-Authenticate", 'Bearer realm="strata"');
      return reply(res, 401, "Unauthorized: a valid bearer token is required");
    }
    const path = new URL(req.url ?? "/", "http://localhost").pathname;
    if (path !== ENDPOINT) return reply(res, 404, `Not found: the MCP endpoint is ${ENDPOINT}`);

    const sessionId = req.headers["mcp-session-id"];
    let body: unknown;
    if (req.method === "POST") {
      const read = await readJson(req, maxBody);
      if ("error" in read) return reply(res, read.status, read.error);
      body = read.value;
    }
    if (typeof sessionId === "string") {
      const session = sessions.get(sessionId);
      if (!session) return jsonRpcError(res, 404, "Session not found: start a new one with initialize");
      session.lastUsed = Date.now();
      return session.transport.handleRequest(req, res, body);
    }
    if (req.method !== "POST" || !isInitializeRequest(body)) {
      return jsonRpcError(res, 400, "Bad request: no mcp-session-id, and not an initialize request");
    }
    if (sessions.size >= maxSessions) return jsonRpcError(res, 503, "Too many sessions open; close one and try again");
    const server = makeServer();
    const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
      sessionIdGenerator: randomUUID,
      onsessioninitialized: (id) => {
        sessions.set(id, { transport, server, lastUsed: Date.now() });
      },
    });
    // The server's own close handling (chained after this by connect) lets its workspace go.
    transport.onclose = () => {
      if (transport.sessionId !== undefined) sessions.delete(transport.sessionId);
    };
    await server.connect(transport);
    await transport.handleRequest(req, res, body);
  };

  const http: HttpServer = createServer((req, res) => {
    handle(req, res).catch((error: unknown) => {
      if (!res.headersSent) jsonRpcError(res, 500, `Internal error: ${error instanceof Error ? error.message : String(error)}`);
      else res.end();
    });
  });
  await new Promise<void>((resolve, reject) => {
    http.once("error", reject);
    http.listen(options.port ?? 0, host, () => {
      http.off("error", reject);
      resolve();
    });
  });
  port = (http.address() as AddressInfo).port;
  const shownHost = host.includes(":") ? `[${host}]` : host;
  return {
    url: `http://${shownHost}:${port}${ENDPOINT}`,
    port,
    sessions: () => sessions.size,
    async close() {
      clearInterval(sweeper);
      await Promise.all([...sessions.values()].map(({ transport }) => transport.close().catch(() => undefined)));
      sessions.clear();
      http.closeAllConnections();
      await new Promise<void>((resolve) => http.close(() => resolve()));
    },
  };
}

function digest(value: string): Buffer {
  return createHash("sha256").update(value).digest();
}

function reply(res: ServerResponse, status: number, message: string): void {
  res.writeHead(status, { "content-type": "text/plain; charset=utf-8" }).end(`${message}\n`);
}

function jsonRpcError(res: ServerResponse, status: number, message: string): void {
  res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message }, id: null }));
}

async function readJson(req: IncomingMessage, maxBytes: number): Promise<{ value: unknown } | { status: number; error: string }> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > maxBytes) return { status: 413, error: `Request body over ${maxBytes} bytes` };
    chunks.push(chunk);
  }
  try {
    return { value: JSON.parse(Buffer.concat(chunks).toString("utf8")) };
  } catch {
    return { status: 400, error: "Parse error: the body is not JSON" };
  }
}
