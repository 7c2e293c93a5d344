/**
 * A command's output, as every sandbox collects it: the kept head and the
 * count of the rest (OutputCollector), the timeout's exit code and message,
 * and `executeStream`'s async iterable over `execute`. Kept apart from
 * BaseSandbox so the process runners (process.ts, remote-command.ts) need
 * nothing of the class.
 */
import type { ExecuteOptions, ExecuteResponse, Result } from "../core/types.js";
import { SANDBOX_DEFAULTS } from "./defaults.js";

/** Exit code of a command killed by its timeout (as GNU `timeout` reports it). */
export const TIMEOUT_EXIT_CODE = 124;

/** The message appended to a command's output when its timeout killed it. */
export function timeoutMessage(seconds: number): string {
  return `\n[Command timed out after ${seconds} s; its process group was killed]`;
}

/**
 * Collects a command's output: keeps the first `maxBytes` bytes, counts the
 * rest, decodes UTF-8 per source stream (a character split across chunks
 * stays whole) and forwards decoded text to `onOutput` as it arrives.
 */
export class OutputCollector {
  private readonly parts: string[] = [];
  private readonly decoders = new Map<string, TextDecoder>();
  private kept = 0;
  /** Bytes received in total, kept or not. */
  totalBytes = 0;

  constructor(
    readonly maxBytes: number = SANDBOX_DEFAULTS.maxOutputBytes,
    private readonly onOutput?: (chunk: string) => void,
    private readonly onData?: (chunk: Uint8Array, stream: "stdout" | "stderr") => void,
  ) {}

  /** A caller's callback that throws loses its own chunk, never the command or the process (its error is dropped). */
  private deliver(callback: () => void): void {
    try {
      callback();
    } catch {
      // The caller's bug; the output is still collected.
    }
  }

  get truncated(): boolean {
    return this.totalBytes > this.kept;
  }

  push(chunk: Uint8Array, source: "stdout" | "stderr" = "stdout"): void {
    this.deliver(() => this.onData?.(chunk, source));
    this.totalBytes += chunk.length;
    const room = this.maxBytes - this.kept;
    if (room <= 0) return;
    const head = chunk.length > room ? chunk.subarray(0, room) : chunk;
    this.kept += head.length;
    let decoder = this.decoders.get(source);
    if (!decoder) this.decoders.set(source, (decoder = new TextDecoder("utf-8")));
    const text = decoder.decode(head, { stream: true });
    if (text === "") return;
    this.parts.push(text);
    this.deliver(() => this.onOutput?.(text));
  }

  /** The kept output; a character cut by the byte limit is dropped rather than garbled. */
  text(): string {
    if (!this.truncated) {
      for (const decoder of this.decoders.values()) {
        const rest = decoder.decode();
        if (rest !== "") this.parts.push(rest);
      }
    }
    return this.parts.join("");
  }
}

/** Output of `executeStream`: iterate for chunks as they arrive; `result` is the whole response. */
export interface ExecuteStream extends AsyncIterable<string> {
  readonly result: Promise<Result<ExecuteResponse>>;
}

/**
 * `execute` as an async iterable of output chunks as they arrive, with the
 * final response in `result` (BaseSandbox.executeStream). Leaving the loop
 * early stops the command.
 */
export function streamExecute(
  execute: (command: string, options: ExecuteOptions) => Promise<Result<ExecuteResponse>>,
  command: string,
  options: Omit<ExecuteOptions, "onOutput">,
): ExecuteStream {
  const chunks: string[] = [];
  let wake: (() => void) | undefined;
  let done = false;
  const stop = new AbortController();
  const signal = options.signal ? AbortSignal.any([options.signal, stop.signal]) : stop.signal;
  const result = execute(command, {
    ...options,
    signal,
    onOutput: (chunk) => {
      chunks.push(chunk);
      wake?.();
    },
  });
  const settle = () => {
    done = true;
    wake?.();
  };
  void result.then(settle);
  return {
    result,
    async *[Symbol.asyncIterator]() {
      try {
        for (;;) {
          while (chunks.length > 0) yield chunks.shift()!;
          if (done) return;
          await new Promise<void>((resolve) => (wake = resolve));
          wake = undefined;
        }
      } finally {
        if (!done) stop.abort(new DOMException("The output stream was closed before the command ended", "AbortError"));
      }
    },
  };
}
