/**
 * Every TypeScript and JavaScript block in README.md and docs/*.md runs as
 * written, so a snippet can never drift from the API or fail on a fresh
 * machine. Each block is written to its own file in a temporary directory and
 * run with tsx, the package name mapped to this checkout's sources. The
 * services a snippet names come from the test setup, under the conventional
 * variable names a user would set: DATABASE_URL, REDIS_URL, DOCKER_HOST,
 * IMAGE (a local image with sh), SSH_HOST, SSH_PORT, SSH_USER, SSH_KEY_FILE,
 * SSH_HOST_KEY.
 */
import { execFile } from "node:child_process";
import { mkdtemp, readFile, readdir, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { requireService } from "./support/runtime-services.js";

const run = promisify(execFile);
const repo = resolve(import.meta.dirname, "..");
const tsx = join(repo, "node_modules", ".bin", "tsx");

interface Snippet {
  file: string;
  line: number;
  code: string;
}

async function snippets(): Promise<Snippet[]> {
  const files = ["README.md", ...(await readdir(join(repo, "docs"))).filter((f) => f.endsWith(".md")).map((f) => `docs/${f}`)];
  const found: Snippet[] = [];
  for (const file of files) {
    const text = await readFile(join(repo, file), "utf8");
    const fence = /^```(ts|typescript|js|javascript)\n([\s\S]*?)^```$/gm;
    for (let match = fence.exec(text); match; match = fence.exec(text)) {
      found.push({ file, line: text.slice(0, match.index).split("\n").length, code: match[2]! });
    }
  }
  return found;
}

const all = await snippets();
let dir = "";

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "strata-docs-"));
  // Snippets import the packages a user installs beside Strata (ai, @langchain/core, deepagents) as a user's code would.
  await symlink(join(repo, "node_modules"), join(dir, "node_modules"), "dir");
  const entry = (path: string) => [join(repo, path)];
  await writeFile(
    join(dir, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: {
        module: "nodenext",
        moduleResolution: "nodenext",
        target: "es2022",
        paths: {
          "strata-workspace": entry("index.ts"),
          "strata-workspace/core": entry("core/index.ts"),
          "strata-workspace/runtime": entry("runtime/index.ts"),
          "strata-workspace/tools": entry("tools/index.ts"),
          "strata-workspace/conformance": entry("conformance/index.ts"),
          "strata-workspace/mcp": entry("mcp/index.ts"),
          "strata-workspace/*": [join(repo, "*.ts")],
        },
      },
    }),
  );
});

afterAll(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

function serviceEnv(): NodeJS.ProcessEnv {
  return {
    ...process.env,
    DATABASE_URL: requireService("STRATA_POSTGRES_URL", "10-postgres.sh"),
    REDIS_URL: requireService("STRATA_REDIS_URL", "20-redis.sh"),
    DOCKER_HOST: `unix://${requireService("STRATA_DOCKER_HOST", "30-docker.sh")}`,
    IMAGE: requireService("STRATA_DOCKER_IMAGE_GNU", "30-docker.sh"),
    SSH_HOST: requireService("STRATA_SSH_HOST", "40-sshd.sh"),
    SSH_PORT: requireService("STRATA_SSH_PORT", "40-sshd.sh"),
    SSH_USER: requireService("STRATA_SSH_USER", "40-sshd.sh"),
    SSH_KEY_FILE: requireService("STRATA_SSH_KEY", "40-sshd.sh"),
    SSH_HOST_KEY: requireService("STRATA_SSH_HOST_KEY", "40-sshd.sh"),
  };
}

describe("code blocks in the README and docs", () => {
  it("finds the blocks", () => {
    expect(all.length).toBeGreaterThan(10);
  });

  it.each(all.map((s) => [`${s.file}:${s.line}`, s] as const))("%s runs as written", async (_, snippet) => {
    const work = await mkdtemp(join(dir, "run-"));
    const file = join(work, "snippet.mts");
    await writeFile(file, snippet.code);
    try {
      await run(tsx, ["--tsconfig", join(dir, "tsconfig.json"), file], { cwd: work, env: serviceEnv(), timeout: 120_000 });
    } catch (error) {
      const { stdout, stderr } = error as { stdout?: string; stderr?: string };
      throw new Error(`${snippet.file}:${snippet.line} failed:\n${stderr ?? ""}\n${stdout ?? ""}`, { cause: error });
    }
  }, 150_000);
});
