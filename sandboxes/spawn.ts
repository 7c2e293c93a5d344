import { errors, toErrorInfo, type ErrorInfo } from "../core/errors.js";
import type { ExecuteOptions, ExecuteResponse, Result, SpawnOptions, SpawnedProcess } from "../core/types.js";

/** Checks spawn's options: the ones `execute` shares are checked again by it; these must not be smuggled in. */
export function checkSpawn(options: unknown): SpawnOptions {
  if (options === undefined) return {};
  if (typeof options !== "object" || options === null || Array.isArray(options)) {
    throw errors.invalidArgument(`spawn options must be an object such as { timeout: 30 }, got ${options === null ? "null" : typeof options}`);
  }
  const { timeout, env, cwd, signal } = options as SpawnOptions;
  return { timeout, env, cwd, signal };
}

/** Output bytes a spawned command may have waiting unread before it is stopped (a reader that never reads). */
export const MAX_UNREAD_BYTES = 64 * 1024 * 1024;

/**
 * `spawn` over a sandbox's own `execute`: stdin is a stream the command reads
 * as it is written (with backpressure), stdout and stderr arrive as raw bytes
 * per stream (through `onData`), `kill` aborts the run (the whole process
 * group dies), and `wait` answers the exit code. The combined output
 * `execute` also collects is capped at 0 bytes: the streams are the output.
 * Output is never cut while it is read; a command whose output nobody reads
 * is stopped once MAX_UNREAD_BYTES wait, and `wait` says why. After the
 * command ends, writing to stdin fails.
 */
export function spawnFromExecute(
  run: (options: ExecuteOptions) => Promise<ExecuteResponse>,
  signal: AbortSignal | undefined,
  toCaller: (error: ErrorInfo) => ErrorInfo = (error) => error,
): Result<SpawnedProcess> {
  let input!: TransformStreamDefaultController<Uint8Array>;
  const stdin = new TransformStream<Uint8Array, Uint8Array>({ start: (controller) => void (input = controller) });
  const killer = new AbortController();
  const combined = signal ? AbortSignal.any([signal, killer.signal]) : killer.signal;
  const output = (name: string) => {
    let controller!: ReadableStreamDefaultController<Uint8Array>;
    let open = true;
    const stream = new ReadableStream<Uint8Array>(
      {
        start: (c) => void (controller = c),
        cancel: () => void (open = false),
      },
      { highWaterMark: MAX_UNREAD_BYTES, size: (chunk) => chunk.byteLength },
    );
    return {
      stream,
      push(chunk: Uint8Array) {
        if (!open) return; // cancelled by its reader: the rest is dropped
        controller.enqueue(chunk.slice());
        if ((controller.desiredSize ?? 0) < 0) killer.abort(errors.tooLarge(name, MAX_UNREAD_BYTES - (controller.desiredSize ?? 0), MAX_UNREAD_BYTES));
      },
      close() {
        if (!open) return;
        open = false;
        controller.close();
      },
    };
  };
  const stdout = output("stdout (unread)");
  const stderr = output("stderr (unread)");
  const finished: Promise<Result<{ exitCode: number | null }>> = run({
    stdin: stdin.readable,
    signal: combined,
    maxOutputBytes: 0,
    onData: (chunk, source) => (source === "stderr" ? stderr : stdout).push(chunk),
  }).then(
    (response) => ({ exitCode: response.exitCode }),
    (error: unknown) => ({ error: toCaller(toErrorInfo(killer.signal.aborted && error === combined.reason ? killer.signal.reason : error)) }),
  );
  void finished.then(() => {
    stdout.close();
    stderr.close();
    // Writes after the end fail instead of vanishing.
    try {
      input.error(errors.invalidArgument("The command has ended; its stdin is closed"));
    } catch {
      // Already closed by its writer.
    }
  });
  return {
    stdin: stdin.writable,
    stdout: stdout.stream,
    stderr: stderr.stream,
    wait: () => finished,
    kill: async () => {
      killer.abort(errors.aborted("The command"));
      await finished;
    },
  };
}
