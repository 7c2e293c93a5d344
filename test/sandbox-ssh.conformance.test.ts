import { randomUUID } from "node:crypto";
import { afterAll } from "vitest";
import { runConformance } from "../conformance/index.js";
import { SshSandbox } from "../sandboxes/ssh.js";
import { sshService } from "./support/sandbox-services.js";

const { options, home } = sshService();
// Every test gets a fresh workspace below this directory; it goes at the end.
const root = `${home}/conformance-${randomUUID()}`;

afterAll(async () => {
  const cleaner = await SshSandbox.connect({ ...options, workspace: home });
  await cleaner.execute(`rm -rf -- '${root}'`);
  await cleaner.close();
});

// The suite writes names the default secrets preset denies (.env, …): this file tests the backend's semantics, so it opts out; test/permissions.test.ts covers the preset.
runConformance({
  name: "SshSandbox",
  create: () => SshSandbox.connect({ ...options, workspace: `${root}/${randomUUID()}`, permissions: false }),
  root: (sandbox) => sandbox.workspace,
  destroy: (sandbox) => sandbox.close(),
  close: (sandbox) => sandbox.close(),
  capabilities: { execute: true, mergedStderr: true },
});
