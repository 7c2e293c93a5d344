import { readFileSync } from "node:fs";
import { z } from "zod";
import { StrataError } from "../core/errors.js";
import type { Sandbox } from "../core/protocol.js";
import type { IsolationLevel, NetworkAccess } from "../sandboxes/base.js";
import { BackendSandboxClosed, BackendUnavailable, InvalidSpec, ProviderError, UnsupportedBackendTool } from "./errors.js";
import { SandboxHandle } from "./handle.js";
import { dispatchPayload, PAYLOAD_TYPES, TimeoutSchema, type Payload, type PayloadType, type ResultOf } from "./payloads.js";

/**
 * What opens sandboxes (OpenRath's `Backend`): a provider says what it can
 * do (`capabilities`, `supportedCalls`), opens sandboxes behind refcounted
 * handles, closes them, and runs typed payloads against them.
 */
export interface SandboxProvider {
  /** The name it is registered under. */
  readonly name: string;
  /** Cheap: no network, no subprocess, nothing started. */
  isAvailable(): boolean;
  capabilities(): Capabilities;
  supportedCalls(): ReadonlySet<PayloadType>;
  /** Opens a sandbox; the handle starts with no references. */
  open(spec?: SandboxSpec): Promise<SandboxHandle>;
  /** Closes the sandbox now, whatever its references; must go through `handle.close()`, which tears down once. */
  close(handle: SandboxHandle): Promise<void>;
  /**
   * Runs a payload. A closed handle throws BackendSandboxClosed and a payload
   * type the provider lacks UnsupportedBackendTool; every failure of the
   * payload itself comes back as a ToolExecutionFailure.
   */
  dispatch<P extends Payload>(handle: SandboxHandle, payload: P): Promise<ResultOf<P["type"]>>;
  /**
   * Opens a handle on a sandbox a handle (maybe in another process) left
   * running; see `handle.remoteId`. Closing it destroys the sandbox only when
   * `options.created` says this provider created it (as `handle.created` did).
   */
  reattach?(remoteId: string, spec?: SandboxSpec, options?: ReattachOptions): Promise<SandboxHandle>;
}

export interface ReattachOptions {
  /**
   * The provider created this sandbox (the container, the SSH workspace), as
   * recorded from `handle.created`; only then does close destroy it. Never
   * guessed from the spec or the remoteId: default false, so a sandbox named
   * by hand is only ever let go of.
   */
  created?: boolean;
}

// ---------------------------------------------------------------- capabilities

/** How far a sandbox is kept from the host: the sandboxes' own type (each sandbox's `isolation`). */
export type { IsolationLevel };

/** Measured by bench/runtime.ts: wall time of open → first execute → close. */
export interface ColdStart {
  p50Ms: number;
  p95Ms: number;
  runs: number;
  measuredAt: string;
  machine: string;
  /** What else the figure depends on (image, network, …). */
  setup?: string;
}

export interface Capabilities {
  isolation: IsolationLevel;
  /** Runs shell commands (command.run). */
  commands: boolean;
  /** Reads, writes and lists files (files.*). */
  files: boolean;
  /** Runs programs in an interpreter (code.run), where one is installed. */
  codeRun: boolean;
  /** Delivers command output as it arrives (ExecuteOptions.onOutput). */
  streaming: boolean;
  /** Measured figures from runtime/cold-start.json, or "not measured"; never an estimate. */
  coldStart: ColdStart | "not measured";
}

let coldStarts: Record<string, ColdStart> | undefined;

/** The figure bench/runtime.ts stored in runtime/cold-start.json for a provider, if it measured one. */
export function measuredColdStart(provider: string): ColdStart | "not measured" {
  if (coldStarts === undefined) {
    try {
      const file = JSON.parse(readFileSync(new URL("./cold-start.json", import.meta.url), "utf8")) as { providers?: Record<string, ColdStart> };
      coldStarts = file.providers ?? {};
    } catch {
      coldStarts = {};
    }
  }
  return Object.hasOwn(coldStarts, provider) ? coldStarts[provider]! : "not measured";
}

// ---------------------------------------------------------------- spec

const envName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "environment variable names are letters, digits and '_'");

export const SandboxSpecSchema = z
  .object({
    /** Image to start from (providers without images ignore it). */
    image: z.string().min(1).optional(),
    /** Command the sandbox's main process runs (providers without one ignore it). */
    entrypoint: z.array(z.string()).min(1).optional(),
    /** Environment of every command run through the handle's payloads. */
    env: z.record(envName, z.string()).optional(),
    /** Host variables every command receives, by name (the sandboxes' `passEnv`); secret-looking names also need `allowSecretEnv`. */
    passEnv: z.array(envName).optional(),
    /** The secret-looking names of `passEnv` meant to pass (the sandboxes' `allowSecretEnv`). */
    allowSecretEnv: z.array(envName).optional(),
    /** Lifetime in seconds: after it the sandbox is closed, whatever its references. */
    timeout: TimeoutSchema.optional(),
    /** The workspace: a host directory (local, bubblewrap), a directory in the container (docker) or on the remote host (ssh). */
    workspace: z.string().min(1).optional(),
    /**
     * The sandboxes' `network` (NetworkAccess): false, no network; true, the
     * environment's. Default: the provider's (none for bubblewrap and docker;
     * local and ssh always have the network and refuse false).
     */
    network: (z.boolean() satisfies z.ZodType<NetworkAccess>).optional(),
  })
  .strict();

export type SandboxSpec = z.input<typeof SandboxSpecSchema>;

export function parseSpec(spec: unknown): SandboxSpec {
  const parsed = SandboxSpecSchema.safeParse(spec ?? {});
  if (!parsed.success) throw new InvalidSpec(`Invalid sandbox spec: ${z.prettifyError(parsed.error)}`);
  return parsed.data;
}

// ---------------------------------------------------------------- base class

/** A sandbox a provider can close: every native `Sandbox` has `close()`. */
export type ClosableSandbox = Sandbox;

/** What a provider's `create`/`attach` hands to the base class. */
export interface OpenedSandbox {
  sandbox: ClosableSandbox;
  remoteId?: string;
  /** Closes and frees everything (e.g. also a remote workspace the provider made). Default: `sandbox.close()`. */
  teardown?: () => Promise<void>;
  /** Lets go without destroying anything, for `handle.detach()` (e.g. ends a connection). Default: nothing. */
  detach?: () => Promise<void>;
  /** The provider made what `teardown` destroys; see `SandboxHandle.created`. Default: true from `create`, the reattach option from `attach`. */
  created?: boolean;
}

/**
 * Everything but creating the sandbox: handles, lifetime timeouts, payload
 * checks and dispatch. A provider implements `create` (and `attach` if its
 * sandboxes can outlive the process) and says when it is available.
 */
export abstract class SandboxProviderBase implements SandboxProvider {
  readonly #open = new Set<SandboxHandle>();

  constructor(readonly name: string) {}

  /** Why the provider cannot run here, or undefined when it can. Cheap: no network, nothing started. */
  abstract unavailableReason(): string | undefined;
  abstract capabilities(): Capabilities;
  protected abstract create(spec: SandboxSpec): Promise<OpenedSandbox>;

  /**
   * Reattaches to a sandbox by `remoteId`; providers whose sandboxes die with
   * their process leave it undefined. `created` is the recorded ownership:
   * without it, teardown must not destroy the sandbox.
   */
  protected attach?(remoteId: string, spec: SandboxSpec, created: boolean): Promise<OpenedSandbox>;

  isAvailable(): boolean {
    return this.unavailableReason() === undefined;
  }

  supportedCalls(): ReadonlySet<PayloadType> {
    return new Set(PAYLOAD_TYPES);
  }

  /** Sandboxes opened by this provider and not yet closed. */
  get sandboxCount(): number {
    return this.#open.size;
  }

  async open(spec: SandboxSpec = {}): Promise<SandboxHandle> {
    const parsed = parseSpec(spec);
    this.#assertAvailable();
    return this.#adopt(await this.create(parsed), parsed, true);
  }

  async reattach(remoteId: string, spec: SandboxSpec = {}, options: ReattachOptions = {}): Promise<SandboxHandle> {
    if (!this.attach) throw new ProviderError("unsupported", `Sandbox provider '${this.name}' cannot reattach to sandboxes`);
    if (options.created !== undefined && typeof options.created !== "boolean") throw new ProviderError("invalid_argument", "options.created must be a boolean");
    const parsed = parseSpec(spec);
    this.#assertAvailable();
    const created = options.created === true;
    return this.#adopt(await this.attach(remoteId, parsed, created), parsed, created);
  }

  async close(handle: SandboxHandle): Promise<void> {
    this.#assertOwn(handle);
    return handle.close();
  }

  async dispatch<P extends Payload>(handle: SandboxHandle, payload: P): Promise<ResultOf<P["type"]>> {
    this.#assertOwn(handle);
    if (handle.closed) throw new BackendSandboxClosed(handle.id);
    const type = (payload as { type?: unknown } | null)?.type;
    const supported = this.supportedCalls();
    if (typeof type !== "string" || !supported.has(type as PayloadType)) {
      throw new UnsupportedBackendTool(String(type), this.name, [...supported]);
    }
    // dispatchPayload validates the payload: a bad one is an invalid_argument failure, not a throw.
    return dispatchPayload(handle.sandbox, payload, { env: handle.spec.env });
  }

  #adopt(opened: OpenedSandbox, spec: SandboxSpec, created: boolean): SandboxHandle {
    const { sandbox } = opened;
    const handle: SandboxHandle = new SandboxHandle(this, sandbox, {
      spec,
      remoteId: opened.remoteId,
      created: opened.created ?? created,
      teardown: async () => {
        this.#open.delete(handle);
        await (opened.teardown ? opened.teardown() : sandbox.close());
      },
      release: async () => {
        this.#open.delete(handle);
        await opened.detach?.();
      },
    });
    this.#open.add(handle);
    if (spec.timeout !== undefined) {
      handle.closeAfter(spec.timeout, (error) => {
        const why = error instanceof StrataError ? error.message : "teardown failed";
        process.emitWarning(`Closing sandbox '${handle.id}' at the end of its lifetime failed: ${why}`);
      });
    }
    return handle;
  }

  #assertAvailable(): void {
    const reason = this.unavailableReason();
    if (reason !== undefined) throw new BackendUnavailable(this.name, reason);
  }

  #assertOwn(handle: SandboxHandle): void {
    if (handle.provider !== this) {
      throw new ProviderError("invalid_argument", `Sandbox '${handle.id}' was opened by provider '${handle.provider.name}', not '${this.name}'`);
    }
  }
}
