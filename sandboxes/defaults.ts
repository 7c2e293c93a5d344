/**
 * The sandboxes' defaults, in one place, and the one check of the options
 * they govern. Every sandbox's constructor runs `sandboxLimits` (through
 * BaseSandbox), and the factories that start something first (Docker's
 * `create`, SSH's `connect`) run it before they do, so a bad value is
 * `invalid_argument` before any container or connection exists.
 *
 * Every duration carries its unit in its name (`timeoutSeconds`,
 * `killGraceMs`), and so does every size (`memoryMb`, `maxOutputBytes`).
 */
import { errors } from "../core/errors.js";
import { type Quota, byteCount, timeoutSeconds, validateQuota } from "../core/limits.js";

/** What every sandbox uses unless its options say otherwise. Frozen: read it, never change it. */
export const SANDBOX_DEFAULTS = Object.freeze({
  /** Seconds a command may run when neither its call nor the sandbox's `timeout` says. */
  timeoutSeconds: 300,
  /**
   * Milliseconds a background child may keep a finished command's output
   * open before the command's process group is killed (every sandbox).
   */
  killGraceMs: 100,
  /** Memory of the sandbox's processes together, in MiB (bubblewrap, docker). */
  memoryMb: 1024,
  /** Processes (and threads) the sandbox may hold at once (bubblewrap, docker). */
  maxProcesses: 256,
  /** Output bytes kept per command; past 64 times the sandbox's cap, the command is killed. */
  maxOutputBytes: 1024 * 1024,
  /** The workspace quota: 1 GiB and 100,000 files. */
  quota: Object.freeze({ maxBytes: 1024 * 1024 * 1024, maxFiles: 100_000 }),
});

/** The options `sandboxLimits` checks; each sandbox's options name them the same way. */
export interface SandboxLimitOptions {
  timeout?: number;
  maxOutputBytes?: number;
  memoryMb?: number;
  maxProcesses?: number;
  quota?: Quota | false;
}

/** The options `sandboxLimits` checks, with the defaults filled in. */
export interface SandboxLimits {
  timeoutSeconds: number;
  maxOutputBytes: number;
  memoryMb: number;
  maxProcesses: number;
  /** undefined: no quota (`quota: false`). */
  quota: Quota | undefined;
}

/**
 * Checks a sandbox's limit options with core's rules (limits.ts) and fills
 * in SANDBOX_DEFAULTS: `timeout` a duration in seconds, `maxOutputBytes` a
 * byte count, `memoryMb` and `maxProcesses` positive integers, `quota` an
 * object (a given field replaces its default) or false for none.
 */
export function sandboxLimits(options: SandboxLimitOptions = {}): SandboxLimits {
  if (typeof options !== "object" || options === null) throw errors.invalidArgument("sandbox options must be an object");
  const quota = options.quota;
  if (quota !== undefined && quota !== false && (typeof quota !== "object" || quota === null)) {
    throw errors.invalidArgument("quota must be an object { maxBytes?, maxFiles? } or false");
  }
  return {
    timeoutSeconds: options.timeout === undefined ? SANDBOX_DEFAULTS.timeoutSeconds : timeoutSeconds(options.timeout, "timeout"),
    maxOutputBytes: options.maxOutputBytes === undefined ? SANDBOX_DEFAULTS.maxOutputBytes : byteCount(options.maxOutputBytes, "maxOutputBytes"),
    memoryMb: positiveInteger(options.memoryMb, "memoryMb") ?? SANDBOX_DEFAULTS.memoryMb,
    maxProcesses: positiveInteger(options.maxProcesses, "maxProcesses") ?? SANDBOX_DEFAULTS.maxProcesses,
    quota: quota === false ? undefined : validateQuota({ ...SANDBOX_DEFAULTS.quota, ...quota }),
  };
}

/** A positive integer option (a count, a size in whole units), or undefined when not given. */
export function positiveInteger(value: unknown, name: string): number | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value <= 0) {
    throw errors.invalidArgument(`${name} must be a positive integer, got ${typeof value === "number" ? String(value) : typeof value}`);
  }
  return value;
}
