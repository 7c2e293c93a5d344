/**
 * The root import loads no engine package, each loads when its class is first
 * used, and one that is not installed fails with a StrataError that says what
 * to install. Every check runs in a fresh Node process (a module registry of
 * its own): this one has long since loaded every engine.
 *
 * Absence is real, not mocked: the sources are copied into a temporary
 * directory whose node_modules links every installed package but the five
 * engines, so Node's own resolution fails for them.
 */
import { execFile } from "node:child_process";
import { cpSync, mkdirSync, mkdtempSync, readdirSync, realpathSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const ROOT = dirname(dirname(fileURLToPath(import.meta.url)));
/** In the order the tests use them: ssh2 comes before dockerode, which loads it too (docker-modem depends on it). */
const ENGINES = ["pg", "ioredis", "ssh2", "dockerode", "better-sqlite3"] as const;

/** Runs an ES module script under tsx in a fresh process with cwd `cwd`, and parses the JSON it prints last. */
function runScript(cwd: string, script: string): Promise<unknown> {
  const env = { ...process.env };
  delete env.NODE_PATH; // resolution must go by node_modules alone
  delete env.NODE_OPTIONS;
  return new Promise((resolve, reject) => {
    execFile(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { cwd, env, timeout: 60_000 }, (error, stdout, stderr) => {
      if (error) return reject(new Error(`child failed: ${error.message}\n${stderr}`));
      const last = stdout.trim().split("\n").at(-1) ?? "";
      try {
        resolve(JSON.parse(last));
      } catch {
        reject(new Error(`child printed no JSON: ${stdout}\n${stderr}`));
      }
    });
  });
}

/** A script body that prints which engines the process's CommonJS registry holds (all five are CommonJS packages). */
const LOADED = `
const { createRequire } = await import("node:module");
const cache = createRequire(import.meta.url).cache;
const loaded = () => ${JSON.stringify(ENGINES)}.filter((name) => Object.keys(cache).some((file) => file.includes("/node_modules/" + name + "/")));
`;

/** Uses each engine's class once; each entry is what the attempt ended with. */
const USE_EACH = `
const attempt = async (engine, use) => {
  try {
    await use();
    return { engine, outcome: "no error" };
  } catch (error) {
    return { engine, name: error?.name, code: error?.code, message: error?.message };
  }
};
const uses = (m) => [
  () => attempt("pg", async () => { await new m.PostgresStore({ connectionString: "postgres://nobody@127.0.0.1:1/none" }).close(); }),
  () => attempt("ioredis", async () => { await new m.RedisStore({ url: "redis://127.0.0.1:1", connectTimeoutMs: 200 }).close(); }),
  () => attempt("ssh2", () =>
    m.SshSandbox.connect({ host: "127.0.0.1", port: 1, username: "nobody", workspace: "/w", connectTimeoutSeconds: 2, insecureAcceptAnyHostKey: true }),
  ),
  () => attempt("dockerode", () => m.DockerSandbox.sweepExpired("/nonexistent/docker.sock")),
  () => attempt("better-sqlite3", async () => { await new m.SqliteStore({ path: ":memory:" }).close(); }),
];
`;

describe("engine packages", () => {
  it("the root import loads none of them; each loads when its class is first used", async () => {
    const result = await runScript(
      ROOT,
      `${LOADED}${USE_EACH}
const m = await import(${JSON.stringify(pathToFileURL(join(ROOT, "index.ts")).href)});
const afterImport = loaded();
const afterEachUse = [];
for (const use of uses(m)) {
  await use();
  afterEachUse.push(loaded());
}
console.log(JSON.stringify({ afterImport, afterEachUse }));`,
    );
    // What follows the import shows the check sees a package loaded later: an empty first list is not blindness.
    expect(result).toEqual({ afterImport: [], afterEachUse: ENGINES.map((_, i) => ENGINES.slice(0, i + 1)) });
  });

  describe("when one is not installed", () => {
    let dir: string;

    beforeAll(() => {
      dir = mkdtempSync(join(tmpdir(), "strata-no-engines-"));
      for (const part of ["core", "backends", "stores", "sandboxes"]) cpSync(join(ROOT, part), join(dir, part), { recursive: true });
      cpSync(join(ROOT, "index.ts"), join(dir, "index.ts"));
      writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "strata-copy", type: "module", private: true }));
      const modules = realpathSync(join(ROOT, "node_modules"));
      const linked = join(dir, "node_modules");
      mkdirSync(linked);
      for (const name of readdirSync(modules)) {
        if (name.startsWith(".") || (ENGINES as readonly string[]).includes(name)) continue;
        symlinkSync(join(modules, name), join(linked, name));
      }
    });

    afterAll(() => {
      if (dir) rmSync(dir, { recursive: true, force: true });
    });

    it("the copy cannot resolve them (the premise of the next test)", () => {
      const require = createRequire(join(dir, "stores", "optional-package.ts"));
      for (const engine of ENGINES) expect(() => require.resolve(engine), engine).toThrow(/Cannot find module/);
      expect(require.resolve("picomatch")).toContain("picomatch");
    });

    it("the root import still works, and each class fails with unavailable naming the package to install", async () => {
      const result = await runScript(
        dir,
        `${USE_EACH}
const m = await import(${JSON.stringify(pathToFileURL(join(dir, "index.ts")).href)});
const outcomes = [];
for (const use of uses(m)) outcomes.push(await use());
console.log(JSON.stringify(outcomes));`,
      );
      const users: Record<(typeof ENGINES)[number], string> = {
        pg: "PostgresStore",
        ioredis: "RedisStore",
        dockerode: "DockerSandbox",
        ssh2: "SshSandbox",
        "better-sqlite3": "SqliteStore",
      };
      expect(result).toEqual(
        ENGINES.map((engine) => ({
          engine,
          name: "StrataError",
          code: "unavailable",
          message: `${users[engine]} needs the package '${engine}', which is not installed: npm install ${engine}`,
        })),
      );
    });
  });
});
