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

runConformance({
  name: "SshSandbox",
  create: () => SshSandbox.connect({ ...options, workspace: `${root}/${randomUUID()}` }),
  root: (sandbox) => sandbox.workspace,
  destroy: (sandbox) => sandbox.close(),
  close: (sandbox) => sandbox.close(),
  capabilities: { execute: true, mergedStderr: true },
});
