/**
 * Runs one host process for a sandbox's `execute`: its own process group (so
 * a timeout kills the whole tree), stdout and stderr combined in arrival
 * order, output capped, stdin fed from bytes. Shared by LocalSandbox and
 * BubblewrapSandbox; Node's execFile kills only the direct child and buffers
 * without a head-keeping cap, hence this small runner.
 */
import type { Writable } from "node:stream";
import { constants } from "node:os";
import { StrataError, errors } from "../core/errors.js";
import { timeoutSeconds } from "../core/limits.js";
import { baseName } from "../core/paths.js";
import type { ExecuteResponse } from "../core/types.js";
import { SANDBOX_DEFAULTS } from "./defaults.js";
import { OutputCollector, TIMEOUT_EXIT_CODE, timeoutMessage } from "./output.js";
import { childProcess } from "../stores/lazy-builtins.js";

/** Linux's limit on one argv string (MAX_ARG_STRLEN). */
const MAX_ARG_BYTES = 128 * 1024;

export interface ProcessRun {
  file: string;
  args: readonly string[];
  /** Host working directory of the process. */
  cwd: string;
  env: Record<string, string>;
  stdin?: string | Uint8Array | ReadableStream<Uint8Array>;
  /** Seconds; undefined for no limit. */
  timeout?: number;
  maxOutputBytes: number;
  /** Output past this many bytes kills the command: a producer of endless output is stopped, not drained forever. */
  killAfterBytes: number;
  onOutput?: (chunk: string) => void;
  onData?: (chunk: Uint8Array, stream: "stdout" | "stderr") => void;
  signal?: AbortSignal;
}

/** Validates a timeout in seconds (a sandbox's default or one call's) against core's table, so a timer never fires early. */
export function checkTimeout(timeout: number | undefined): void {
  if (timeout !== undefined) timeoutSeconds(timeout);
}

/** How long the output pipes may stay open after the command's group was killed (a holder that left the group). */
const PIPE_DEADLINE_MS = 1_000;

export function runProcess(run: ProcessRun): Promise<ExecuteResponse> {
  for (const arg of run.args) {
    if (Buffer.byteLength(arg) > MAX_ARG_BYTES) {
      return Promise.reject(errors.invalidArgument(`the command is longer than ${MAX_ARG_BYTES} bytes; put it in a file and run that`));
    }
  }
  if (run.signal?.aborted) return Promise.reject(run.signal.reason);
  return new Promise((resolve, reject) => {
    const child = childProcess().spawn(run.file, run.args, { cwd: run.cwd, env: run.env, detached: true, stdio: ["pipe", "pipe", "pipe"] });
    const output = new OutputCollector(run.maxOutputBytes, run.onOutput, run.onData);
    let timedOut = false;
    let overflowed = false;
    let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
    let openStreams = 2;
    let settled = false;
    // First of all: a spawn that fails (EMFILE, ENOENT) emits this, and an 'error' with no listener would end the process.
    child.on("error", (error: NodeJS.ErrnoException) => {
      finish(() =>
        reject(
          error.code === "ENOENT"
            ? new StrataError("unavailable", `Cannot start '${baseName(run.file)}': it is not installed`, { cause: error })
            : new StrataError("io_error", `Cannot start '${baseName(run.file)}': ${error.code ?? "error"}`, { cause: error }),
        ),
      );
    });

    const killGroup = () => {
      try {
        if (child.pid !== undefined) process.kill(-child.pid, "SIGKILL");
      } catch {
        // Already gone.
      }
    };
    const timer = run.timeout === undefined ? undefined : setTimeout(() => {
      timedOut = true;
      killGroup();
    }, run.timeout * 1000);
    let graceTimer: NodeJS.Timeout | undefined;
    const onAbort = () => {
      killGroup();
      finish(() => reject(run.signal!.reason));
    };
    run.signal?.addEventListener("abort", onAbort, { once: true });

    const finish = (settle: () => void) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      clearTimeout(graceTimer);
      run.signal?.removeEventListener("abort", onAbort);
      child.stdout?.destroy();
      child.stderr?.destroy();
      settle();
    };
    const maybeDone = () => {
      if (!exit || openStreams > 0) return;
      finish(() => {
        let text = output.text();
        let exitCode = exit!.code ?? (exit!.signal ? 128 + (constants.signals[exit!.signal] ?? 0) : null);
        if (timedOut) {
          text += timeoutMessage(run.timeout!);
          exitCode = TIMEOUT_EXIT_CODE;
        } else if (overflowed) {
          text += `\n[Command killed: it wrote more than ${run.killAfterBytes} bytes of output]`;
        }
        resolve({ output: text, exitCode, truncated: output.truncated });
      });
    };
    const collect = (source: "stdout" | "stderr") => (chunk: Buffer) => {
      output.push(chunk, source);
      if (!overflowed && output.totalBytes > run.killAfterBytes) {
        overflowed = true;
        killGroup();
      }
    };
    const streamClosed = () => {
      openStreams--;
      maybeDone();
    };
    // Without pipes (a spawn that failed) there is nothing to read: the 'error' listener above settles.
    if (!child.stdout || !child.stderr) return;
    child.stdout.on("data", collect("stdout")).on("close", streamClosed);
    child.stderr.on("data", collect("stderr")).on("close", streamClosed);
    child.on("exit", (code, signal) => {
      exit = { code, signal };
      // A background child may still hold the output pipes open; past the grace period its group is
      // killed. The pipes then close on their own and what is already in them is still read: a loaded
      // machine can stall the event loop past the grace period before a fast command's output is read,
      // and giving up at once answered an empty output. Only a holder outside the group (setsid) is cut
      // off, at the deadline.
      graceTimer = setTimeout(() => {
        killGroup();
        graceTimer = setTimeout(() => {
          openStreams = 0;
          maybeDone();
        }, PIPE_DEADLINE_MS);
      }, SANDBOX_DEFAULTS.killGraceMs);
      maybeDone();
    });

    // The command may exit without reading its input; a broken pipe is not an error.
    child.stdin.on("error", () => undefined);
    feedStdin(run.stdin, child.stdin);
  });
}

/**
 * Feeds a command's stdin from bytes, text or a stream written as it comes,
 * waiting whenever the command is not reading (backpressure), and ends it
 * when the input ends. A stream that fails, or yields something that is not
 * bytes, ends the input there.
 */
export function feedStdin(stdin: ProcessRun["stdin"], target: Writable): void {
  if (!(stdin instanceof ReadableStream)) {
    if (stdin !== undefined && stdin.length > 0) target.end(stdin);
    else target.end();
    return;
  }
  void (async () => {
    try {
      for await (const chunk of stdin as unknown as AsyncIterable<unknown>) {
        if (!(chunk instanceof Uint8Array) || target.destroyed) break;
        if (!target.write(chunk)) await drained(target);
      }
    } catch {
      // A writer that aborts its stream ends the input, as closing it would.
    }
    if (!target.destroyed) target.end();
  })();
}

/** Settles when `target` can take more, or will never take any. */
function drained(target: Writable): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      target.off("drain", done).off("close", done).off("error", done);
      resolve();
    };
    target.on("drain", done).on("close", done).on("error", done);
  });
}
