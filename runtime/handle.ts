import { timeoutSeconds } from "../core/limits.js";
import type { Sandbox } from "../core/protocol.js";
import { BackendSandboxClosed, HandleError } from "./errors.js";
import type { Payload, ResultOf } from "./payloads.js";
import type { SandboxProvider, SandboxSpec } from "./provider.js";
import { Stream } from "./stream.js";

export interface SandboxHandleOptions {
  spec?: SandboxSpec;
  /** How a later process finds this sandbox again (a container id, an ssh:// URL); see PersistentSandboxRegistry. */
  remoteId?: string;
  /** The provider created the sandbox, so closing it destroys it; recorded with the remoteId. Default false. */
  created?: boolean;
  /** Frees what the sandbox holds. Called exactly once, on the handle's first close. */
  teardown: () => Promise<void>;
  /** Lets go of the sandbox without destroying it (disconnect, keep the container); for `detach`. */
  release?: () => Promise<void>;
}

/** What `handle.use()` returns: one reference, given back when the `await using` scope ends. */
export interface SandboxLease extends AsyncDisposable {
  readonly handle: SandboxHandle;
  readonly sandbox: Sandbox;
}

type State = "open" | "closed" | "detached";

/**
 * A refcounted hold on one opened sandbox (OpenRath's BackendSandbox).
 *
 * `provider.open()` returns a handle with no references. Each owner calls
 * `acquire()` and later `release()`; the release that drops the count to zero
 * closes the sandbox through its provider. `await using lease = handle.use()`
 * does both. Counting is synchronous, so concurrent releases cannot both see
 * zero, and the teardown runs once however many callers close or release.
 * After close, every use (acquire, release, dispatch, sandbox) throws
 * BackendSandboxClosed: a late release is a bug to surface, not a second close.
 */
export class SandboxHandle<S extends Sandbox = Sandbox> {
  readonly spec: SandboxSpec;
  readonly remoteId: string | undefined;
  /**
   * The provider created what close destroys (a container, an SSH workspace);
   * PersistentSandboxRegistry records it, so a later reattach destroys only
   * what was created, never a sandbox named by hand.
   */
  readonly created: boolean;
  #sandbox: S;
  #refcount = 0;
  #state: State = "open";
  #closing: Promise<void> | undefined;
  #lifetime: ReturnType<typeof setTimeout> | undefined;
  readonly #teardown: () => Promise<void>;
  readonly #release: (() => Promise<void>) | undefined;

  constructor(
    readonly provider: SandboxProvider,
    sandbox: S,
    options: SandboxHandleOptions,
  ) {
    this.#sandbox = sandbox;
    this.spec = options.spec ?? {};
    this.remoteId = options.remoteId;
    this.created = options.created === true;
    this.#teardown = options.teardown;
    this.#release = options.release;
  }

  /** The sandbox's id (also usable after close, for messages). */
  get id(): string {
    return this.#sandbox.id;
  }

  get refcount(): number {
    return this.#refcount;
  }

  get closed(): boolean {
    return this.#state !== "open";
  }

  /** The sandbox itself, for native API calls (`execute`, `read`, …). Throws once the handle is closed. */
  get sandbox(): S {
    this.#assertOpen();
    return this.#sandbox;
  }

  /** Adds one reference. */
  acquire(): this {
    this.#assertOpen();
    this.#refcount += 1;
    return this;
  }

  /** Drops one reference; the last one closes the sandbox (and this resolves once it is closed). */
  async release(): Promise<void> {
    this.#assertOpen("was released after it closed");
    if (this.#refcount === 0) throw new HandleError(`Sandbox '${this.id}' was released more often than it was acquired`);
    this.#refcount -= 1;
    if (this.#refcount > 0) return;
    // Closed from this instant, so an acquire racing the provider's close fails instead of holding a dying sandbox.
    this.#state = "closed";
    await this.provider.close(this);
  }

  /** `await using lease = handle.use()`: acquires now, releases when the scope ends. */
  use(): SandboxLease {
    this.acquire();
    let returned = false;
    return {
      handle: this,
      sandbox: this.#sandbox,
      [Symbol.asyncDispose]: async () => {
        if (returned) return;
        returned = true;
        await this.release();
      },
    };
  }

  /** Runs a payload through the provider. */
  async dispatch<P extends Payload>(payload: P): Promise<ResultOf<P["type"]>> {
    this.#assertOpen();
    return this.provider.dispatch(this, payload);
  }

  /** A FIFO stream of payloads bound to this sandbox. */
  stream(): Stream {
    this.#assertOpen();
    return new Stream(this);
  }

  /**
   * Closes now, whatever the reference count (what `provider.close` and the
   * spec's lifetime timeout call). Idempotent: every caller gets the one teardown.
   */
  close(): Promise<void> {
    if (!this.#closing) {
      this.#state = this.#state === "open" ? "closed" : this.#state;
      this.#clearLifetime();
      this.#closing = this.#teardown();
    }
    return this.#closing;
  }

  /**
   * Lets go of the sandbox without destroying it, so another process can
   * reattach (see PersistentSandboxRegistry). The handle is closed afterwards.
   */
  detach(): Promise<void> {
    if (!this.#closing) {
      this.#state = "detached";
      this.#clearLifetime();
      this.#closing = this.#release ? this.#release() : Promise.resolve();
    }
    return this.#closing;
  }

  /** Closes the sandbox after `seconds`, whatever its references (the spec's timeout). */
  closeAfter(seconds: number, onError: (error: unknown) => void): void {
    try {
      timeoutSeconds(seconds, "lifetime timeout");
    } catch (error) {
      throw new HandleError((error as Error).message, { cause: error });
    }
    this.#clearLifetime();
    this.#lifetime = setTimeout(() => {
      this.provider.close(this).catch(onError);
    }, seconds * 1000);
    // A lifetime limit must not keep the process alive on its own.
    this.#lifetime.unref?.();
  }

  #clearLifetime(): void {
    if (this.#lifetime !== undefined) clearTimeout(this.#lifetime);
    this.#lifetime = undefined;
  }

  #assertOpen(what?: string): void {
    if (this.#state === "open") return;
    throw new BackendSandboxClosed(this.id, what ?? (this.#state === "detached" ? "was detached" : "is closed"));
  }
}
