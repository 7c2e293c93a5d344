import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  codeRun,
  commandRun,
  filesExists,
  filesList,
  filesRead,
  filesWrite,
  PAYLOAD_TYPES,
  providers,
  UnsupportedBackendTool,
  type CodeLanguage,
  type SandboxHandle,
  type SandboxSpec,
} from "../runtime/index.js";
import { providerMissing, requireService } from "./support/runtime-services.js";

/**
 * Every payload type against every built-in provider, on real sandboxes:
 * host processes, bubblewrap, the test dockerd and the test sshd.
 */

interface Target {
  provider: string;
  /** The service script that makes the provider available. */
  script: string;
  spec: () => SandboxSpec;
  /** Interpreters the sandbox is known to have (05-runtime.sh installs python3 and bash on the host). */
  has: readonly CodeLanguage[];
  /** Interpreters it is known to lack. */
  lacks: readonly CodeLanguage[];
}

const targets: Target[] = [
  { provider: "local", script: "05-runtime.sh", spec: () => ({}), has: ["python", "node", "javascript", "bash", "sh"], lacks: [] },
  { provider: "bubblewrap", script: "05-runtime.sh", spec: () => ({}), has: ["python", "bash", "sh"], lacks: [] },
  // The BusyBox image has sh and nothing else.
  { provider: "docker", script: "30-docker.sh", spec: () => ({ image: requireService("STRATA_DOCKER_IMAGE_BUSYBOX", "30-docker.sh") }), has: ["sh"], lacks: ["python", "node", "javascript", "bash"] },
  // The test sshd logs in to this very machine, as an unprivileged user.
  { provider: "ssh", script: "40-sshd.sh", spec: () => ({}), has: ["python", "bash", "sh"], lacks: [] },
];

/** The names code.run looks for, to ask the sandbox itself whether an interpreter is there. */
const CANDIDATES: Record<CodeLanguage, string> = { python: "python3 python", node: "node nodejs", javascript: "node nodejs", bash: "bash", sh: "sh" };

const bytes = (text: string) => new TextEncoder().encode(text);
const PROGRAMS: Record<CodeLanguage, string> = {
  python: `import sys\nprint("hello from python", "$HOME'\\"")\nprint("to stderr", file=sys.stderr)\nsys.exit(3)\n`,
  node: `console.log("hello from node", "$HOME'\\"");\nconsole.error("to stderr");\nprocess.exit(3);\n`,
  javascript: `console.log("hello from javascript", "$HOME'\\"");\nconsole.error("to stderr");\nprocess.exit(3);\n`,
  bash: `echo "hello from bash" '$HOME'"'"'"'\necho "to stderr" >&2\nexit 3\n`,
  sh: `echo "hello from sh" '$HOME'"'"'"'\necho "to stderr" >&2\nexit 3\n`,
};

describe.each(targets)("payloads on the $provider provider", ({ provider: name, script, spec, has, lacks }) => {
  let handle: SandboxHandle;
  /** Where the sandbox's paths start, payloads' included: its workspace (LocalSandbox's "/" is its workspace). */
  let ws = "/";
  /** `/x` in the workspace, as the sandbox names it: `${ws}/x`. */
  const at = (path: string) => (ws === "/" ? path : path === "/" ? ws : `${ws}${path}`);

  beforeAll(async () => {
    const provider = providers.get(name);
    if (!provider.isAvailable()) providerMissing(name, (provider as { unavailableReason?: () => string | undefined }).unavailableReason?.(), script);
    handle = await provider.open(spec());
    handle.acquire();
    ws = handle.sandbox.root;
  });
  afterAll(async () => {
    if (handle && !handle.closed) await handle.release();
  });

  it("supports every payload type", () => {
    expect([...providers.get(name).supportedCalls()].sort()).toEqual([...PAYLOAD_TYPES].sort());
  });

  it("command.run separates stdout from stderr and keeps the exit code", async () => {
    const result = await handle.dispatch(commandRun({ cmd: "echo out; echo err >&2; echo more out; exit 3" }));
    expect(result).toMatchObject({ type: "command_result", stdout: "out\nmore out\n", stderr: "err\n", exitCode: 3, truncated: false });
    if (result.type === "command_result") expect(result.elapsedMs).toBeGreaterThan(0);
  });

  it("command.run takes argv, env, cwd and stdin", async () => {
    await handle.dispatch(filesWrite({ path: at("/sub/dir/keep"), data: "" }));
    const argv = await handle.dispatch(commandRun({ cmd: ["printf", "%s|", "a b", "it's", "$HOME", ""] }));
    expect(argv).toMatchObject({ stdout: "a b|it's|$HOME||", exitCode: 0 });
    const result = await handle.dispatch(
      commandRun({ cmd: 'cat; echo "[$GREETING]"; pwd', env: { GREETING: "hi there" }, cwd: at("/sub/dir"), stdin: "from stdin\n" }),
    );
    expect(result.type).toBe("command_result");
    if (result.type !== "command_result") return;
    expect(result.stdout).toMatch(/^from stdin\n\[hi there\]\n\/.*\/sub\/dir\n$/);
    expect(result.stderr).toBe("");
  });

  it("command.run reports syntax errors and `exit` like any failing command", async () => {
    const syntax = await handle.dispatch(commandRun({ cmd: "if then fi (" }));
    expect(syntax).toMatchObject({ type: "command_result", stdout: "" });
    if (syntax.type === "command_result") {
      expect(syntax.exitCode).not.toBe(0);
      expect(syntax.stderr).not.toBe("");
    }
    expect(await handle.dispatch(commandRun({ cmd: "echo before; exit 7; echo after" }))).toMatchObject({ stdout: "before\n", stderr: "", exitCode: 7 });
  });

  it("command.run fails with code timeout when its timeout passes", async () => {
    const started = performance.now();
    const result = await handle.dispatch(commandRun({ cmd: "echo started; sleep 30", timeout: 1 }));
    expect(result).toEqual({ error: { code: "timeout", message: "Timed out after 1 s; the command was killed" } });
    expect(performance.now() - started).toBeLessThan(10_000);
  });

  it("command.run with a missing cwd fails as file_not_found", async () => {
    expect(await handle.dispatch(commandRun({ cmd: "pwd", cwd: at("/no/such/dir") }))).toMatchObject({ error: { code: "file_not_found", path: at("/no/such/dir") } });
    // A relative cwd starts in the workspace.
    expect(await handle.dispatch(commandRun({ cmd: "pwd", cwd: "no/such/dir" }))).toMatchObject({ error: { code: "file_not_found", path: at("/no/such/dir") } });
  });

  it("files.write and files.read round-trip text and bytes", async () => {
    const written = await handle.dispatch(filesWrite({ path: at("/docs/notes.md"), data: "héllo\nwörld\n" }));
    expect(written).toEqual({ type: "file_write_result", path: at("/docs/notes.md"), bytesWritten: 14 });
    // A relative path starts in the workspace; the answer names the file as the sandbox does.
    expect(await handle.dispatch(filesRead({ path: "docs//notes.md" }))).toEqual({ type: "file_content", path: at("/docs/notes.md"), data: "héllo\nwörld\n", encoding: "utf-8" });
    expect(await handle.dispatch(commandRun({ cmd: "cat docs/notes.md" }))).toMatchObject({ stdout: "héllo\nwörld\n", exitCode: 0 });
    const binary = Uint8Array.from({ length: 256 }, (_, i) => i);
    expect(await handle.dispatch(filesWrite({ path: at("/bin.dat"), data: binary }))).toMatchObject({ bytesWritten: 256 });
    const raw = await handle.dispatch(filesRead({ path: at("/bin.dat"), encoding: null }));
    expect(raw.type).toBe("file_content");
    if (raw.type === "file_content") expect(Array.from(raw.data as Uint8Array)).toEqual(Array.from(binary));
    expect(await handle.dispatch(filesRead({ path: at("/bin.dat") }))).toMatchObject({ error: { code: "binary_file", path: at("/bin.dat") } });
    // files.write replaces an existing file.
    await handle.dispatch(filesWrite({ path: at("/docs/notes.md"), data: bytes("v2") }));
    expect(await handle.dispatch(filesRead({ path: at("/docs/notes.md") }))).toMatchObject({ data: "v2" });
  });

  it("files.write sets the mode when asked", async () => {
    await handle.dispatch(filesWrite({ path: at("/run.sh"), data: "#!/bin/sh\necho ran\n", mode: 0o755 }));
    expect(await handle.dispatch(commandRun({ cmd: "./run.sh" }))).toMatchObject({ stdout: "ran\n", exitCode: 0 });
    await handle.dispatch(filesWrite({ path: "run.sh", data: "#!/bin/sh\necho ran\n", mode: 0o600 }));
    expect(await handle.dispatch(commandRun({ cmd: "test -x run.sh && echo x || echo not-x" }))).toMatchObject({ stdout: "not-x\n" });
  });

  it("file payloads fail with typed failures, never throws", async () => {
    expect(await handle.dispatch(filesRead({ path: at("/missing.txt") }))).toEqual({
      error: { code: "file_not_found", message: `File '${at("/missing.txt")}' not found`, path: at("/missing.txt") },
    });
    expect(await handle.dispatch(filesRead({ path: at("/docs") }))).toMatchObject({ error: { code: "is_directory", path: at("/docs") } });
    expect(await handle.dispatch(filesRead({ path: "/../etc/passwd" }))).toMatchObject({ error: { code: "invalid_path", path: "/../etc/passwd" } });
    expect(await handle.dispatch(filesWrite({ path: "/", data: "x" }))).toMatchObject({ error: { code: "is_directory", path: "/" } });
    // The workspace itself, by its path and as ".".
    expect(await handle.dispatch(filesWrite({ path: ws, data: "x" }))).toMatchObject({ error: { code: "is_directory", path: ws } });
    expect(await handle.dispatch(filesWrite({ path: ".", data: "x" }))).toMatchObject({ error: { code: "is_directory", path: ws } });
    expect(await handle.dispatch(filesWrite({ path: at("/docs"), data: "x" }))).toMatchObject({ error: { code: "is_directory", path: at("/docs") } });
    expect(await handle.dispatch(filesList({ path: "~/x" }))).toMatchObject({ error: { code: "invalid_path", path: "~/x" } });
    expect(await handle.dispatch({ type: "files.write", path: "/x" } as never)).toMatchObject({ error: { code: "invalid_argument" } });
    expect(await handle.dispatch({ type: "command.run", cmd: "true", extra: 1 } as never)).toMatchObject({ error: { code: "invalid_argument" } });
  });

  it("an unknown payload type throws UnsupportedBackendTool", async () => {
    await expect(handle.dispatch({ type: "gpu.launch" } as never)).rejects.toBeInstanceOf(UnsupportedBackendTool);
  });

  it("files.list lists one level, sorted, directories ending in /", async () => {
    await handle.dispatch(filesWrite({ path: at("/tree/b.txt"), data: "b" }));
    await handle.dispatch(filesWrite({ path: at("/tree/a/deep.txt"), data: "deep" }));
    const listed = await handle.dispatch(filesList({ path: at("/tree") }));
    expect(listed.type).toBe("file_entries");
    if (listed.type !== "file_entries") return;
    expect(listed.entries.map((entry) => [entry.path, entry.is_dir])).toEqual([
      [at("/tree/a/"), true],
      [at("/tree/b.txt"), false],
    ]);
    expect(listed.entries[1]!.size).toBe(1);
    expect(await handle.dispatch(filesList({ path: at("/no/such") }))).toEqual({ type: "file_entries", path: at("/no/such"), entries: [] });
  });

  it("files.exists answers for files, directories and missing paths", async () => {
    await handle.dispatch(filesWrite({ path: at("/exists/file.txt"), data: "x" }));
    await handle.dispatch(commandRun({ cmd: "mkdir -p exists/empty-dir" }));
    expect(await handle.dispatch(filesExists({ path: at("/exists/file.txt") }))).toBe(true);
    expect(await handle.dispatch(filesExists({ path: "exists/file.txt" }))).toBe(true);
    expect(await handle.dispatch(filesExists({ path: at("/exists/empty-dir") }))).toBe(true);
    expect(await handle.dispatch(filesExists({ path: at("/exists") }))).toBe(true);
    expect(await handle.dispatch(filesExists({ path: ws }))).toBe(true);
    expect(await handle.dispatch(filesExists({ path: "/" }))).toBe(true);
    expect(await handle.dispatch(filesExists({ path: at("/exists/nope") }))).toBe(false);
    expect(await handle.dispatch(filesExists({ path: at("/exists/file.txt/under-a-file") }))).toBe(false);
  });

  it.each(["python", "node", "javascript", "bash", "sh"] as const)("code.run %s: runs it, or says the interpreter is missing", async (language) => {
    const probe = await handle.dispatch(commandRun({ cmd: `for c in ${CANDIDATES[language]}; do command -v "$c" && exit 0; done; exit 1` }));
    const present = probe.type === "command_result" && probe.exitCode === 0;
    if (has.includes(language)) expect(present, `${language} should be installed in the ${name} sandbox`).toBe(true);
    if (lacks.includes(language)) expect(present).toBe(false);
    const result = await handle.dispatch(codeRun({ code: PROGRAMS[language], language }));
    if (!present) {
      // Core has no code of its own for a missing interpreter: the sandbox does not support the language.
      expect(result).toEqual({ error: { code: "unsupported", message: expect.stringMatching(new RegExp(`^No ${language} interpreter in this sandbox \\(looked for `)) } });
      return;
    }
    // The program's quotes and `$HOME` arrive untouched: it travels on stdin, not through a shell's argv.
    expect(result).toMatchObject({
      type: "code_result",
      language,
      stdout: `hello from ${language} $HOME'"\n`,
      stderr: "to stderr\n",
      exitCode: 3,
      error: "to stderr",
    });
  });

  it("code.run carries a program larger than any argv", async () => {
    const big = `x=0\n${"x=$((x + 1))\n".repeat(20_000)}echo "$x"\n`;
    expect(big.length).toBeGreaterThan(200_000);
    expect(await handle.dispatch(codeRun({ code: big, language: "sh" }))).toMatchObject({ type: "code_result", stdout: "20000\n", exitCode: 0, error: null });
  });

  it("code.run times out", async () => {
    expect(await handle.dispatch(codeRun({ code: "sleep 30", language: "sh", timeout: 1 }))).toEqual({
      error: { code: "timeout", message: "Timed out after 1 s; the command was killed" },
    });
  });
});
