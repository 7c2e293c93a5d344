/**
 * `strata mcp --permissions FILE` (and the config file's `permissions` key) as
 * a real process: a rule that says `ask` is put to the client's user through
 * MCP elicitation, accepted or declined, and a client without the elicitation
 * capability is denied with a message that says why.
 */
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { ElicitRequestSchema, type CallToolResult, type ElicitResult } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, afterEach, describe, expect, it } from "vitest";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const TSX = pathToFileURL(join(ROOT, "node_modules", "tsx", "dist", "loader.mjs")).href;
const NODE_ARGS = ["--import", TSX, join(ROOT, "cli", "strata.ts"), "mcp", "--no-execute"];

const RULES = [
  { action: "ask", operations: ["write", "edit"], paths: ["protected/**"], name: "protected" },
  { action: "deny", operations: ["read"], paths: ["*.key"], name: "keys" },
];

const dirs: string[] = [];
const clients: Client[] = [];
afterEach(async () => {
  for (const client of clients.splice(0)) await client.close().catch(() => undefined);
});
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

function workspace(): string {
  const dir = mkdtempSync(join(tmpdir(), "strata-mcp-perm-"));
  dirs.push(dir);
  writeFileSync(join(dir, "rules.json"), JSON.stringify({ rules: RULES }));
  writeFileSync(join(dir, "api.key"), "sk-secret");
  return dir;
}

async function connect(args: string[], answer?: (message: string) => ElicitResult): Promise<Client> {
  const client = new Client({ name: "strata-perm-test", version: "1" }, answer ? { capabilities: { elicitation: {} } } : {});
  if (answer) client.setRequestHandler(ElicitRequestSchema, (request) => answer(request.params.message));
  // The whole environment: on Node 24 the server needs NODE_OPTIONS' better-sqlite3 hook, which the SDK's default environment drops.
  const env = process.env as Record<string, string>;
  await client.connect(new StdioClientTransport({ command: process.execPath, args: [...NODE_ARGS, ...args], cwd: ROOT, stderr: "pipe", env }));
  clients.push(client);
  return client;
}

async function call(client: Client, name: string, args: Record<string, unknown>): Promise<{ isError: boolean; text: string }> {
  const result = (await client.callTool({ name, arguments: args })) as CallToolResult;
  const first = result.content[0];
  return { isError: result.isError === true, text: first?.type === "text" ? first.text : "" };
}

describe("strata mcp: permission rules that ask", () => {
  it("asks the client's user through elicitation: accept writes, decline does not", async () => {
    const dir = workspace();
    const asked: string[] = [];
    let reply: ElicitResult["action"] = "accept";
    const client = await connect(["--root", dir, "--permissions", join(dir, "rules.json")], (message) => {
      asked.push(message);
      return reply === "accept" ? { action: "accept", content: { allow: true } } : { action: reply };
    });

    // Outside the rule: no question.
    expect((await call(client, "write_file", { file_path: "/free.txt", content: "free" })).isError).toBe(false);
    expect(asked).toEqual([]);

    const accepted = await call(client, "write_file", { file_path: "/protected/a.txt", content: "approved" });
    expect(accepted.isError, accepted.text).toBe(false);
    expect(readFileSync(join(dir, "protected", "a.txt"), "utf8")).toBe("approved");
    expect(asked).toHaveLength(1);
    expect(asked[0]).toContain("/protected/a.txt");
    expect(asked[0]).toContain("'protected'");

    reply = "decline";
    const declined = await call(client, "write_file", { file_path: "/protected/b.txt", content: "refused" });
    expect(declined.isError).toBe(true);
    expect(declined.text).toContain("declined");
    expect(existsSync(join(dir, "protected", "b.txt"))).toBe(false);

    const edit = await call(client, "edit_file", { file_path: "/protected/a.txt", old_string: "approved", new_string: "changed" });
    expect(edit.isError).toBe(true);
    expect(readFileSync(join(dir, "protected", "a.txt"), "utf8")).toBe("approved");
    expect(asked).toHaveLength(3);
    expect(asked[0]).not.toContain(dir);

    // A deny rule is not asked about.
    const key = await call(client, "read_file", { file_path: "/api.key" });
    expect(key.isError).toBe(true);
    expect(key.text).not.toContain("sk-secret");
    expect(asked).toHaveLength(3);
  });

  it("denies an ask rule for a client that cannot be asked, and says why (rules from the config file)", async () => {
    const dir = workspace();
    writeFileSync(join(dir, "strata.json"), JSON.stringify({ root: ".", permissions: RULES }));
    const client = await connect(["--config", join(dir, "strata.json")]);
    const denied = await call(client, "write_file", { file_path: "/protected/c.txt", content: "x" });
    expect(denied.isError).toBe(true);
    expect(denied.text).toContain("elicitation");
    expect(denied.text).not.toContain(dir);
    expect(existsSync(join(dir, "protected", "c.txt"))).toBe(false);
    expect((await call(client, "write_file", { file_path: "/elsewhere.txt", content: "fine" })).isError).toBe(false);
  });

  it("a grep over many files an ask rule governs is one elicitation, listing them; a preset by name works too", async () => {
    const dir = workspace();
    const rules = [{ action: "ask", operations: ["read"], paths: ["private/**"], name: "private" }];
    writeFileSync(join(dir, "read-rules.json"), JSON.stringify(rules));
    mkdirSync(join(dir, "private"));
    for (let i = 0; i < 75; i++) writeFileSync(join(dir, "private", `n${String(i).padStart(2, "0")}.txt`), "needle\n");
    writeFileSync(join(dir, "open.txt"), "needle\n");
    const asked: string[] = [];
    const client = await connect(["--root", dir, "--no-memories", "--permissions", join(dir, "read-rules.json")], (message) => {
      asked.push(message);
      return { action: "accept", content: { allow: true } };
    });
    // A case-folded search reads every candidate, 50 at a time: still one question.
    const found = await call(client, "grep", { pattern: "NEEDLE", case_insensitive: true, output_mode: "count" });
    expect(found.isError, found.text).toBe(false);
    expect(found.text.split("\n").filter((line) => /:\d+$/.test(line))).toHaveLength(76);
    expect(asked, asked.join("\n---\n")).toHaveLength(1);
    expect(asked[0]).toContain("'private'");
    expect(asked[0]).toContain("/private/n00.txt");
    expect(asked[0]).not.toContain(dir);
    // A literal search (the native grep first): one question again, for this search.
    expect((await call(client, "grep", { pattern: "needle" })).isError).toBe(false);
    expect(asked).toHaveLength(2);

    // `--permissions read-only`: the preset, not a file.
    const readOnly = await connect(["--root", dir, "--no-memories", "--permissions", "read-only"]);
    const refused = await call(readOnly, "write_file", { file_path: "/new.txt", content: "x" });
    expect(refused.isError).toBe(true);
    expect(refused.text).toContain("read-only");
    expect(existsSync(join(dir, "new.txt"))).toBe(false);
  });

  it("refuses a permissions file that is not rules, naming only the file", async () => {
    const dir = workspace();
    writeFileSync(join(dir, "bad.json"), JSON.stringify([{ action: "maybe" }]));
    await expect(connect(["--root", dir, "--permissions", join(dir, "bad.json")])).rejects.toThrow();
  });
});
