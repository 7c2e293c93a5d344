/**
 * One vocabulary (issue 10): the sandboxes' defaults live in
 * SANDBOX_DEFAULTS, `sandboxLimits` checks them the same way for every
 * sandbox (before a container or a connection exists), `network` is one
 * boolean, durations carry their unit, the isolation a sandbox reports is the
 * runtime's IsolationLevel, and the runtime spec names the workspace as the
 * sandboxes do. Nothing here needs a service.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { realpathSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { MAX_TIMEOUT_SECONDS } from "../core/limits.js";
import { InvalidSpec, providers } from "../runtime/index.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";
import { SANDBOX_DEFAULTS, sandboxLimits } from "../sandboxes/defaults.js";
import { DockerSandbox } from "../sandboxes/docker.js";
import { LocalSandbox } from "../sandboxes/local.js";
import { SshSandbox } from "../sandboxes/ssh.js";

const invalid = expect.objectContaining({ code: "invalid_argument" });
/** A socket no daemon listens on: a check that reached the daemon would fail with `unavailable`, not `invalid_argument`. */
const noDaemon = "/nonexistent/strata-test.sock";
const ssh = { host: "127.0.0.1", port: 1, username: "nobody", workspace: "/w", insecureAcceptAnyHostKey: true } as const;

describe("SANDBOX_DEFAULTS", () => {
  it("holds every sandbox default once, with its unit in its name, frozen", () => {
    expect(SANDBOX_DEFAULTS).toEqual({
      timeoutSeconds: 300,
      killGraceMs: 100,
      memoryMb: 1024,
      maxProcesses: 256,
      maxOutputBytes: 1024 * 1024,
      quota: { maxBytes: 1024 * 1024 * 1024, maxFiles: 100_000 },
    });
    expect(Object.isFrozen(SANDBOX_DEFAULTS)).toBe(true);
    expect(Object.isFrozen(SANDBOX_DEFAULTS.quota)).toBe(true);
  });

  it("is what a sandbox uses when its options say nothing", async () => {
    const sandbox = new LocalSandbox();
    try {
      expect(sandbox.quota).toEqual(SANDBOX_DEFAULTS.quota);
      const { killGraceMs: _, ...limits } = SANDBOX_DEFAULTS;
      expect(sandboxLimits()).toEqual({ ...limits, quota: { ...SANDBOX_DEFAULTS.quota } });
      expect(sandboxLimits({ quota: { maxFiles: 3 } }).quota).toEqual({ maxBytes: SANDBOX_DEFAULTS.quota.maxBytes, maxFiles: 3 });
      expect(sandboxLimits({ quota: false }).quota).toBeUndefined();
    } finally {
      await sandbox.close();
    }
  });
});

describe("sandboxLimits: one check for every sandbox", () => {
  const bad: Array<[string, Record<string, unknown>]> = [
    ["a zero timeout", { timeout: 0 }],
    ["a timeout no timer can honour", { timeout: MAX_TIMEOUT_SECONDS + 1 }],
    ["a negative output cap", { maxOutputBytes: -1 }],
    ["a fractional memory size", { memoryMb: 1.5 }],
    ["no processes", { maxProcesses: 0 }],
    ["a quota that is not an object", { quota: "1 GB" }],
  ];

  it.each(bad)("refuses %s", (_, options) => {
    expect(() => sandboxLimits(options as never)).toThrow(invalid);
  });

  it.each(bad)("local and bubblewrap refuse %s at construction", (_, options) => {
    expect(() => new LocalSandbox(options as never)).toThrow(invalid);
    expect(() => new BubblewrapSandbox(options as never)).toThrow(invalid);
  });

  it.each(bad)("docker and ssh refuse %s before reaching a daemon or a server", async (_, options) => {
    await expect(DockerSandbox.create({ image: "none", docker: noDaemon, ...(options as object) })).rejects.toThrow(invalid);
    await expect(DockerSandbox.attach("none", { docker: noDaemon, ...(options as object) })).rejects.toThrow(invalid);
    await expect(SshSandbox.connect({ ...ssh, ...(options as object) })).rejects.toThrow(invalid);
  });

  it("names the option at fault", () => {
    expect(() => sandboxLimits({ maxProcesses: 2.5 })).toThrow(/maxProcesses must be a positive integer/);
    expect(() => sandboxLimits({ timeout: -1 })).toThrow(/timeout must be a positive number of seconds/);
  });
});

describe("the shared option names", () => {
  it("durations carry their unit: docker's lifetimeSeconds, ssh's connectTimeoutSeconds and keepaliveIntervalSeconds", async () => {
    await expect(DockerSandbox.create({ image: "none", docker: noDaemon, lifetimeSeconds: 0 })).rejects.toThrow(/lifetimeSeconds/);
    await expect(SshSandbox.connect({ ...ssh, connectTimeoutSeconds: 0 })).rejects.toThrow(/connectTimeoutSeconds/);
    await expect(SshSandbox.connect({ ...ssh, keepaliveIntervalSeconds: MAX_TIMEOUT_SECONDS + 1 })).rejects.toThrow(/keepaliveIntervalSeconds/);
  });

  it("network is a boolean everywhere; docker names a network of its own with dockerNetwork", async () => {
    expect(() => new BubblewrapSandbox({ network: "host" as never })).toThrow(invalid);
    await expect(DockerSandbox.create({ image: "none", docker: noDaemon, network: "none" as never })).rejects.toThrow(invalid);
    await expect(DockerSandbox.create({ image: "none", docker: noDaemon, network: false, dockerNetwork: "host" })).rejects.toThrow(invalid);
    await expect(DockerSandbox.create({ image: "none", docker: noDaemon, dockerNetwork: "" })).rejects.toThrow(invalid);
    // Valid options reach the daemon, which is not there.
    await expect(DockerSandbox.create({ image: "none", docker: noDaemon, network: true, dockerNetwork: "host" })).rejects.toMatchObject({ code: "unavailable" });
  });

  it("a sandbox's isolation is the runtime's IsolationLevel for the same kind", async () => {
    const local = new LocalSandbox();
    const bwrap = new BubblewrapSandbox();
    try {
      expect(local.isolation).toBe(providers.get("local").capabilities().isolation);
      expect(bwrap.isolation).toBe(providers.get("bubblewrap").capabilities().isolation);
      expect(bwrap.isolation).toBe("namespace");
    } finally {
      await local.close();
      await bwrap.close();
    }
  });
});

describe("the runtime spec speaks the sandboxes' words", () => {
  it("`workspace` is the local sandbox's workspace; the old `workingDir` is refused", async () => {
    const dir = await mkdtemp(join(tmpdir(), "strata-vocabulary-"));
    try {
      const handle = await providers.get("local").open({ workspace: join(dir, "ws") });
      try {
        const sandbox = handle.sandbox as LocalSandbox;
        expect(sandbox.workspace).toBe(join(realpathSync(dir), "ws"));
      } finally {
        await handle.close();
      }
      await expect(providers.get("local").open({ workingDir: dir } as never)).rejects.toBeInstanceOf(InvalidSpec);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("`network` is a boolean; local, which cannot cut the network, refuses false rather than ignore it", async () => {
    await expect(providers.get("local").open({ network: false })).rejects.toBeInstanceOf(InvalidSpec);
    await expect(providers.get("local").open({ network: "host" } as never)).rejects.toBeInstanceOf(InvalidSpec);
    const handle = await providers.get("local").open({ network: true });
    await handle.close();
  });
});
