import { errors, toErrorInfo } from "../core/errors.js";
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

/**
 * `spawn` over a sandbox's own `execute`: stdin is a stream the command reads
 * as it is written, stdout and stderr arrive as raw bytes per stream (through
 * `onData`), `kill` aborts the run (the whole process group dies), and
 * `wait` answers the exit code. The combined output `execute` also collects
 * is capped at 0 bytes: the streams are the output.
 */
export function spawnFromExecute(run: (options: ExecuteOptions) => Promise<ExecuteResponse>, signal?: AbortSignal): Result<SpawnedProcess> {
  const stdin = new TransformStream<Uint8Array, Uint8Array>();
  let stdout!: ReadableStreamDefaultController<Uint8Array>;
  let stderr!: ReadableStreamDefaultController<Uint8Array>;
  const killer = new AbortController();
  const combined = signal ? AbortSignal.any([signal, killer.signal]) : killer.signal;
  const out = new ReadableStream<Uint8Array>({ start: (c) => void (stdout = c) });
  const err = new ReadableStream<Uint8Array>({ start: (c) => void (stderr = c) });
  const finished: Promise<Result<{ exitCode: number | null }>> = run({
    stdin: stdin.readable,
    signal: combined,
    maxOutputBytes: 0,
    onData: (chunk, source) => (source === "stderr" ? stderr : stdout).enqueue(chunk.slice()),
  }).then(
    (response) => ({ exitCode: response.exitCode }),
    (error: unknown) => ({ error: toErrorInfo(error) }),
  );
  void finished.then(() => {
    for (const stream of [stdout, stderr]) {
      try {
        stream.close();
      } catch {
        // Already closed by a cancelled reader.
      }
    }
    void stdin.writable.abort().catch(() => undefined);
  });
  return {
    stdin: stdin.writable,
    stdout: out,
    stderr: err,
    wait: () => finished,
    kill: async () => {
      killer.abort(errors.aborted("The command"));
      await finished;
    },
  };
}
