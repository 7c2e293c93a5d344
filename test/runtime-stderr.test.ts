import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { codeRun, commandRun, dispatchPayload, providers, type SandboxHandle, type SandboxSpec } from "../runtime/index.js";
import { providerMissing, requireService } from "./support/runtime-services.js";

/**
 * command.run and code.run hand stdout and stderr back apart through a file
 * in the sandbox. Whatever a command printed must never outlive the call:
 * not after a timeout kill, not after an error, on every built-in provider.
 */

const targets: Array<{ provider: string; script: string; spec: () => SandboxSpec }> = [
  { provider: "local", script: "05-runtime.sh", spec: () => ({}) },
  { provider: "bubblewrap", script: "05-runtime.sh", spec: () => ({}) },
  { provider: "docker", script: "30-docker.sh", spec: () => ({ image: requireService("STRATA_DOCKER_IMAGE_BUSYBOX", "30-docker.sh") }) },
  { provider: "ssh", script: "40-sshd.sh", spec: () => ({}) },
];

describe.each(targets)("stderr capture on the $provider provider", ({ provider: name, script, spec }) => {
  let handle: SandboxHandle;
  /** A directory of the workspace given to mktemp as TMPDIR, so anything it leaves is seen. */
  let tmp: string;
  const listTmp = async () => {
    const ls = await handle.dispatch(commandRun({ cmd: "ls -A t" }));
    expect(ls).toMatchObject({ type: "command_result", exitCode: 0 });
    return ls.type === "command_result" ? ls.stdout : "";
  };

  beforeAll(async () => {
    const provider = providers.get(name);
    if (!provider.isAvailable()) providerMissing(name, (provider as { unavailableReason?: () => string | undefined }).unavailableReason?.(), script);
    handle = await provider.open(spec());
    const made = await handle.dispatch(commandRun({ cmd: "mkdir t && cd t && pwd" }));
    if (made.type !== "command_result" || made.exitCode !== 0) throw new Error(`cannot prepare the workspace: ${JSON.stringify(made)}`);
    tmp = made.stdout.trim();
  });
  afterAll(async () => {
    if (handle && !handle.closed) await handle.provider.close(handle);
  });

  it("a timed-out command.run leaves nothing of what it printed", async () => {
    const run = await handle.dispatch(commandRun({ cmd: "echo secret-out; echo secret-err >&2; sleep 30", timeout: 1, env: { TMPDIR: tmp } }));
    expect(run).toMatchObject({ error: { code: "timeout" } });
    expect(await listTmp()).toBe("");
  });

  it("a timed-out code.run leaves nothing of what it printed", async () => {
    // code.run takes its env from the spec: dispatch it as the handle does, with TMPDIR in that env.
    const run = await dispatchPayload(handle.sandbox, codeRun({ code: "echo secret-err >&2; sleep 30", language: "sh", timeout: 1 }), { env: { TMPDIR: tmp } });
    expect(run).toMatchObject({ error: { code: "timeout" } });
    expect(await listTmp()).toBe("");
  });

  it("a command that fails or runs normally still gets stdout and stderr apart, and leaves nothing", async () => {
    const run = await handle.dispatch(commandRun({ cmd: "echo out; echo err >&2; exit 3", env: { TMPDIR: tmp } }));
    expect(run).toMatchObject({ type: "command_result", stdout: "out\n", stderr: "err\n", exitCode: 3 });
    expect(await listTmp()).toBe("");
  });

  it("the command sees none of the wrapper's descriptors", async () => {
    const run = await handle.dispatch(commandRun({ cmd: "echo leaked >&3 && echo wrote-3; cat <&4 && echo read-4; echo done", env: { TMPDIR: tmp } }));
    expect(run).toMatchObject({ type: "command_result", stdout: "done\n", exitCode: 0 });
  });

  it("a background child holding stderr does not keep the call waiting", async () => {
    const started = performance.now();
    const run = await handle.dispatch(commandRun({ cmd: "sleep 20 & echo started", timeout: 15 }));
    expect(run).toMatchObject({ type: "command_result", stdout: "started\n", exitCode: 0 });
    expect(performance.now() - started).toBeLessThan(10_000);
  });
});
