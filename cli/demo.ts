/**
 * `strata demo` (and `npm run demo`): one composite workspace on embedded defaults, exercised
 * the way an agent would, printing each call and what came back.
 *
 *   /            a sandbox (bubblewrap when available, else a plain local process); its files
 *                are its own paths, as its commands see them: /workspace/… in bubblewrap
 *   /memories    StoreBackend over SQLite (.strata/demo.db in the current directory), kept across runs
 *   /scratch     StateBackend, in memory
 *   /docs        FilesystemBackend over the package's docs/ (read-only use)
 */
import { existsSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { CompositeBackend } from "../backends/composite.js";
import { FilesystemBackend } from "../backends/filesystem.js";
import { StateBackend } from "../backends/state.js";
import { StoreBackend } from "../backends/store.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";
import { LocalSandbox } from "../sandboxes/local.js";
import { SqliteStore } from "../stores/sqlite.js";

// From source the docs are one level up; built, cli/ sits in dist/ and they are two.
const here = dirname(fileURLToPath(import.meta.url));
const docsDir = [join(here, "..", "docs"), join(here, "..", "..", "docs")].find((dir) => existsSync(dir)) ?? here;

const step = (title: string) => console.log(`\n\x1b[1m▸ ${title}\x1b[0m`);
const show = (value: unknown) => console.log(typeof value === "string" ? value : JSON.stringify(value, null, 2));

export async function runDemo(): Promise<void> {
  const dataDir = join(process.cwd(), ".strata");
  mkdirSync(dataDir, { recursive: true });
  const isolated = await BubblewrapSandbox.isAvailable();
  const sandbox = isolated ? new BubblewrapSandbox() : new LocalSandbox();
  const store = new SqliteStore({ path: join(dataDir, "demo.db") });
  // Files and commands share the sandbox's paths, starting at its root: /workspace in bubblewrap
  // (/workspace/app.py is the file python3 runs), "/" in LocalSandbox (whose "/" is its workspace).
  const home = sandbox.root === "/" ? "" : sandbox.root;
  const app = `${home}/app.py`;
  const workspace = new CompositeBackend({
    default: sandbox,
    routes: {
      "/memories": new StoreBackend({ store, namespace: ["demo", "memories"] }),
      "/scratch": new StateBackend(),
      "/docs": new FilesystemBackend({ workspace: docsDir }),
    },
  });
  console.log(`Workspace: sandbox '${sandbox.id}' (${isolated ? "bubblewrap: namespaces, no network" : "local process, no isolation"}) at ${sandbox.root}, SQLite at /memories, memory at /scratch, disk at /docs`);

  try {
    step("ls /  — routes show up as directories");
    const root = await workspace.ls("/");
    show(root.error ?? root.entries.map((info) => info.path));

    step(`write ${app} in the sandbox, then run it`);
    show(await workspace.write(app, 'print("hello from", __name__)\n', { overwrite: true }));
    show(await workspace.execute("ls; if command -v python3 >/dev/null; then python3 app.py; else cat app.py; fi"));

    step("write the same path again without overwrite — refused, content kept");
    show(await workspace.write(app, "clobbered"));

    step("edit: an ambiguous string is refused with a count, replaceAll changes every one");
    await workspace.write("/scratch/config.ini", "debug = false\nverbose = false\n", { overwrite: true });
    show(await workspace.edit("/scratch/config.ini", "false", "true"));
    show(await workspace.edit("/scratch/config.ini", "false", "true", { replaceAll: true }));
    show(await workspace.read("/scratch/config.ini"));

    step("a memory in SQLite, appended to on every run");
    const stamp = new Date().toISOString();
    const existing = await workspace.read("/memories/log.md");
    if (existing.error?.code === "file_not_found") show(await workspace.write("/memories/log.md", `# Runs\n- ${stamp}\n`));
    else show(await workspace.edit("/memories/log.md", "# Runs\n", `# Runs\n- ${stamp}\n`));
    show(await workspace.read("/memories/log.md", { offset: 0, limit: 5 }));

    step("grep fans out to every backend; the glob filter is the same dialect as glob");
    show(await workspace.grep("hello", { path: "/", maxCount: 4 }));
    const docs = await workspace.glob("**/*.md");
    show(docs.error ?? docs.entries.map((info) => info.path));

    step("upload and download bytes across backends, answers in input order");
    const png = Uint8Array.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 255]);
    const uploads = await workspace.uploadFiles([["/scratch/logo.png", png], ["/../escape", png], ["/memories/logo.png", png]]);
    show(uploads.error ?? uploads.files.map((u) => ({ path: u.path, error: u.error })));
    const downloads = await workspace.downloadFiles(["/memories/logo.png", `${home}/nope`]);
    show(downloads.error ?? downloads.files.map((d) => ({ path: d.path, bytes: d.content?.length ?? null, error: d.error?.code ?? null })));
    const logo = await workspace.read("/scratch/logo.png");
    show(logo.error ?? (logo.encoding === "binary" ? { path: logo.path, encoding: logo.encoding, mimeType: logo.mimeType, size: logo.size } : logo));

    step("hostile paths get invalid_path and nothing is written");
    for (const path of ["/../etc/passwd", "~/.ssh/id_rsa", "C:\\Windows", "/a/\0b"]) {
      const result = await workspace.write(path, "x");
      console.log(`${JSON.stringify(path).padEnd(18)} → ${result.error ? `${result.error.code}: ${result.error.message}` : `written: ${result.path}`}`);
    }

    step("a command past its timeout is killed with exit code 124");
    show(await workspace.execute("sleep 10", { timeout: 1 }));
  } finally {
    await sandbox.close();
    await store.close();
  }
}
