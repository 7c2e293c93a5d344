import { StrataError } from "../core/errors.js";
import { timeoutSeconds } from "../core/limits.js";
import { StreamError, StreamFailed } from "./errors.js";
import type { Payload, ResultOf } from "./payloads.js";

/**
 * A FIFO of payloads bound to one sandbox, with CUDA-style events: work runs
 * one item at a time in submission order; `recordEvent()` marks a point in the
 * queue, `waitEvent()` makes later work wait for a point in another stream.
 *
 * A payload that fails returns a ToolExecutionFailure (`{ error: { code,
 * message, path? } }`) like any result and the stream goes on. A dispatch
 * that *throws* (sandbox closed, unsupported payload, a bug) stops the
 * stream: that future rejects with the error and
 * every queued future, event and later submission rejects with StreamFailed,
 * so nothing waits forever on work that will never run.
 */

/** What a stream sends payloads to; a SandboxHandle is one. */
export interface Dispatcher {
  readonly id: string;
  dispatch<P extends Payload>(payload: P): Promise<ResultOf<P["type"]>>;
}

/** The result of a submitted payload: awaitable, and inspectable without waiting. */
export class Future<T> implements PromiseLike<T> {
  #state: "pending" | "fulfilled" | "rejected" = "pending";
  #value: T | undefined;
  #error: unknown;
  readonly #promise: Promise<T>;

  constructor(executor: (resolve: (value: T) => void, reject: (error: unknown) => void) => void) {
    this.#promise = new Promise<T>((resolve, reject) => {
      executor(
        (value) => {
          if (this.#state !== "pending") return;
          this.#state = "fulfilled";
          this.#value = value;
          resolve(value);
        },
        (error) => {
          if (this.#state !== "pending") return;
          this.#state = "rejected";
          this.#error = error;
          reject(error);
        },
      );
    });
    // When a stream fails, futures nobody awaited reject; that must not crash the process.
    this.#promise.catch(() => {});
  }

  /** True once the payload ran (or the stream gave up on it). */
  done(): boolean {
    return this.#state !== "pending";
  }

  /** The result once done; throws its error if it failed, or if it is still pending. */
  result(): T {
    if (this.#state === "fulfilled") return this.#value as T;
    if (this.#state === "rejected") throw this.#error;
    throw new StreamError("conflict", "The future is still pending; await it instead");
  }

  then<R1 = T, R2 = never>(
    onFulfilled?: ((value: T) => R1 | PromiseLike<R1>) | null,
    onRejected?: ((reason: unknown) => R2 | PromiseLike<R2>) | null,
  ): Promise<R1 | R2> {
    return this.#promise.then(onFulfilled, onRejected);
  }
}

/** A point in a stream's queue; completes when everything submitted before it has run. */
export class StreamEvent {
  #time: number | undefined;
  #failed = false;
  readonly #done: Promise<void>;
  #signal!: () => void;
  #fail!: (error: unknown) => void;

  constructor() {
    this.#done = new Promise<void>((resolve, reject) => {
      this.#signal = () => {
        this.#time = performance.now();
        resolve();
      };
      this.#fail = (error) => {
        this.#failed = true;
        reject(error);
      };
    });
    this.#done.catch(() => {});
  }

  /** True once the stream reached the event. */
  query(): boolean {
    return this.#time !== undefined;
  }

  /** `performance.now()` at completion, or undefined while pending. */
  get time(): number | undefined {
    return this.#time;
  }

  /** Resolves when the event completes; rejects if its stream failed first, or after `timeoutSeconds`. */
  wait(seconds?: number): Promise<void> {
    if (seconds === undefined) return this.#done;
    try {
      checkSeconds(seconds);
    } catch (error) {
      return Promise.reject(error);
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new StreamError("timeout", `Event not reached within ${seconds} s`)), seconds * 1000);
    });
    return Promise.race([this.#done, timedOut]).finally(() => clearTimeout(timer));
  }

  /** Alias of `wait()`, as in CUDA. */
  synchronize(): Promise<void> {
    return this.wait();
  }

  /** Milliseconds from this event to `end`; both must have completed. */
  elapsedTime(end: StreamEvent): number {
    if (this.#time === undefined || end.#time === undefined) {
      throw new StreamError("invalid_argument", "elapsedTime needs both events to have completed");
    }
    return end.#time - this.#time;
  }

  /** @internal */ static complete(event: StreamEvent): void {
    if (!event.#failed) event.#signal();
  }

  /** @internal */ static fail(event: StreamEvent, error: unknown): void {
    if (event.#time === undefined) event.#fail(error);
  }
}

type Operation =
  | { kind: "call"; payload: Payload; resolve: (value: unknown) => void; reject: (error: unknown) => void }
  | { kind: "record"; event: StreamEvent }
  | { kind: "wait"; event: StreamEvent; timeoutSeconds: number | undefined };

export class Stream implements AsyncDisposable {
  readonly #queue: Operation[] = [];
  #running = false;
  /** A payload or a wait is in progress (events complete instantly and do not count). */
  #busy = false;
  #failure: StreamFailed | undefined;
  #closed = false;

  constructor(readonly target: Dispatcher) {}

  /** Queues a payload; the future settles with its result after everything queued before it. */
  submit<P extends Payload>(payload: P): Future<ResultOf<P["type"]>> {
    return new Future<ResultOf<P["type"]>>((resolve, reject) => {
      const refused = this.#refusal();
      if (refused) return reject(refused);
      this.#enqueue({ kind: "call", payload, resolve: resolve as (value: unknown) => void, reject });
    });
  }

  /** Marks the current end of the queue. */
  recordEvent(): StreamEvent {
    const event = new StreamEvent();
    const refused = this.#refusal();
    if (refused) StreamEvent.fail(event, refused);
    else this.#enqueue({ kind: "record", event });
    return event;
  }

  /**
   * Work submitted after this call waits until `event` (usually from another
   * stream) completes. If the event fails or is not reached within
   * `timeoutSeconds`, this stream fails rather than run work out of order.
   */
  waitEvent(event: StreamEvent, seconds?: number): void {
    // Checked now, so a bad duration is the caller's error and does not fail the stream later.
    if (seconds !== undefined) checkSeconds(seconds);
    if (this.#refusal()) return;
    this.#enqueue({ kind: "wait", event, timeoutSeconds: seconds });
  }

  /** Work submitted after this call waits for everything submitted to `other` so far. */
  waitStream(other: Stream, seconds?: number): void {
    if (seconds !== undefined) checkSeconds(seconds);
    this.waitEvent(other.recordEvent(), seconds);
  }

  /** Resolves when everything submitted so far has run; rejects if the stream failed. */
  synchronize(): Promise<void> {
    return this.recordEvent().wait();
  }

  /** True when nothing is queued or running. */
  query(): boolean {
    return !this.#busy && this.#queue.length === 0;
  }

  /** Why the stream stopped, if it did. */
  get failure(): StreamFailed | undefined {
    return this.#failure;
  }

  /** Runs what is queued, then refuses new work. Never throws: failures reach the futures. */
  async close(): Promise<void> {
    const drained = this.#failure ? undefined : this.recordEvent();
    this.#closed = true;
    await drained?.wait().catch(() => {});
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  #refusal(): StreamFailed | undefined {
    if (this.#failure) return this.#failure;
    if (this.#closed) return new StreamFailed(`The stream on sandbox '${this.target.id}' is closed`);
    return undefined;
  }

  #enqueue(operation: Operation): void {
    this.#queue.push(operation);
    if (this.#running) return;
    this.#running = true;
    // Started in a microtask, so work never runs inside the caller's submit().
    queueMicrotask(() => void this.#work());
  }

  async #work(): Promise<void> {
    try {
      for (let operation = this.#queue.shift(); operation; operation = this.#queue.shift()) {
        this.#busy = operation.kind !== "record";
        await this.#perform(operation);
        this.#busy = false;
      }
    } catch (error) {
      this.#stop(error);
    } finally {
      this.#busy = false;
      this.#running = false;
    }
  }

  async #perform(operation: Operation): Promise<void> {
    switch (operation.kind) {
      case "call": {
        let result: unknown;
        try {
          result = await this.target.dispatch(operation.payload);
        } catch (error) {
          operation.reject(error);
          throw error;
        }
        operation.resolve(result);
        return;
      }
      case "record":
        StreamEvent.complete(operation.event);
        return;
      case "wait":
        await operation.event.wait(operation.timeoutSeconds);
        return;
    }
  }

  /** Fails the stream: everything still queued rejects now. */
  #stop(error: unknown): void {
    const why = error instanceof StrataError ? error.message : "the worker failed";
    this.#failure = new StreamFailed(`The stream on sandbox '${this.target.id}' stopped: ${why}`, { cause: error });
    for (const operation of this.#queue.splice(0)) {
      if (operation.kind === "call") operation.reject(this.#failure);
      // A queued wait holds another stream's event: that one is not ours to fail.
      else if (operation.kind === "record") StreamEvent.fail(operation.event, this.#failure);
    }
  }
}

/** Core's rule for a duration (what a timer can hold), failing with a StreamError. */
function checkSeconds(seconds: number): number {
  try {
    return timeoutSeconds(seconds);
  } catch (error) {
    throw new StreamError("invalid_argument", (error as Error).message, { cause: error });
  }
}
