/**
 * Aborts shared by the remote sandboxes' tests (Docker, SSH): a command
 * aborted at any moment of its start, from before it is sent to after it
 * runs, must leave nothing of it running, then or later.
 */
import { expect } from "vitest";
import type { SandboxBackendProtocol } from "../../core/seed.js";

/** Aborts `sleep <marker>` after each delay; resolves 1.5 s after the last, when any start still on its way has happened. */
export async function abortAtEveryMoment(sandbox: SandboxBackendProtocol, marker: string, delays: readonly number[]): Promise<void> {
  await sandbox.execute("true");
  for (const delay of delays) {
    const controller = new AbortController();
    setTimeout(() => controller.abort(new Error("stop it")), delay);
    await expect(sandbox.execute(`sleep ${marker}`, { signal: controller.signal })).rejects.toThrow("stop it");
  }
  await new Promise((resolve) => setTimeout(resolve, 1500));
}
