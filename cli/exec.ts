/**
 * `strata exec`: a shell command in the workspace's sandbox, as `strata mcp`
 * would run it (bubblewrap when it works here; a plain local process only with
 * --unsafe-local or --sandbox local). The output streams as it comes; the exit
 * status is the command's own (124 on timeout).
 */
import { Command, InvalidArgumentError } from "commander";
import { isStrataError } from "../core/errors.js";
import { isSandbox } from "../core/protocol.js";
import { embeddedShell, openEmbeddedWorkspace, type SandboxChoice } from "../mcp/embedded.js";
import { fail, printJson, report, unwrap } from "./common.js";

interface ExecFlags {
  root?: string;
  sandbox?: SandboxChoice;
  identity?: string;
  knownHosts?: string;
  unsafeLocal?: boolean;
  timeout?: number;
  cwd?: string;
  json?: boolean;
}

function seconds(value: string): number {
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0) throw new InvalidArgumentError("a number of seconds above 0");
  return n;
}

function sandbox(value: string): SandboxChoice {
  if (["auto", "local", "bwrap"].includes(value) || /^docker:.+/.test(value) || /^ssh:\/\/.+/.test(value)) return value as SandboxChoice;
  throw new InvalidArgumentError("one of auto, local, bwrap, docker:IMAGE, ssh://user@host[:port]/dir");
}

export function execCommand(): Command {
  return new Command("exec")
    .description("run a shell command in the workspace's sandbox; exits with its status")
    .argument("<command...>", "the command (several words are joined by spaces; quote shell syntax)")
    .option("-r, --root <dir>", "the workspace directory (default: the current directory)")
    .option("--sandbox <kind>", "auto, local, bwrap, docker:IMAGE, ssh://user@host[:port]/dir (default auto: bubblewrap when it works here)", sandbox)
    .option("-i, --identity <file>", "with ssh://: the private key (default: ~/.ssh/id_ed25519, id_ecdsa or id_rsa, and ssh-agent)")
    .option("--known-hosts <file>", "with ssh://: the known_hosts file that must list the server (default ~/.ssh/known_hosts)")
    .option("--unsafe-local", "without bubblewrap, run as a plain local process (no isolation)")
    .option("-t, --timeout <seconds>", "kill the command after this long (exit status 124)", seconds)
    .option("--cwd <dir>", "working directory inside the workspace")
    .option("--json", "print {output, exitCode, truncated} instead of streaming")
    .action(async (words: string[], flags: ExecFlags) => {
      try {
        const ssh = { ...(flags.identity === undefined ? {} : { identity: flags.identity }), ...(flags.knownHosts === undefined ? {} : { knownHosts: flags.knownHosts }) };
        const options = { sandbox: flags.sandbox, unsafeLocal: flags.unsafeLocal === true, memories: false, ssh };
        if ((await embeddedShell(options)) === "none") fail("unavailable", "bubblewrap is not available here; --unsafe-local runs commands unisolated");
        const ws = await openEmbeddedWorkspace(flags.root ?? process.cwd(), options).catch((error: unknown) =>
          isStrataError(error) ? fail(error.code, error.message) : fail("unavailable", error instanceof Error ? error.message : String(error)),
        );
        try {
          const box = ws.backend;
          if (!isSandbox(box)) return fail("unsupported", "This workspace runs no commands");
          const cwd = flags.cwd === undefined ? undefined : flags.cwd.startsWith("/") ? flags.cwd : `${box.root === "/" ? "" : box.root}/${flags.cwd}`;
          const result = unwrap(
            await box.execute(words.join(" "), {
              timeout: flags.timeout,
              cwd,
              ...(flags.json ? {} : { onOutput: (chunk: string) => void process.stdout.write(chunk) }),
            }),
          );
          if (flags.json) printJson(result);
          else if (result.truncated) process.stderr.write("strata: the output was cut at the sandbox's limit\n");
          process.exitCode = result.exitCode ?? 128;
        } finally {
          await ws.close?.();
        }
      } catch (error) {
        process.exitCode = report(error, flags.json === true);
      }
    });
}
