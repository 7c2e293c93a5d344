/**
 * The Docker daemon, test images and SSH server the sandbox tests use, read
 * from the environment scripts/services/30-docker.sh and 40-sshd.sh write to
 * .services/env. A missing variable fails the test file (never a skip) and
 * says which script to run.
 */
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { DockerSandbox, type DockerSandboxOptions } from "../../sandboxes/docker.js";
import { SshSandbox, type SshSandboxOptions } from "../../sandboxes/ssh.js";
import { requireService } from "./runtime-services.js";

export interface DockerService {
  /** The daemon's unix socket. */
  socket: string;
  images: { busybox: string; gnu: string };
}

/**
 * A DockerSandbox's execs for the work asked, less the kill execs that may follow a command by killGraceMs (more
 * likely on a loaded machine): round-trip counts stay exact however late the kill comes.
 */
export const workExecs = (stats: DockerSandbox["stats"]): number => stats.execs - stats.kills;
/** workExecs plus the requests on reused sessions. */
export const workTrips = (stats: DockerSandbox["stats"]): number => workExecs(stats) + stats.sessionRequests;

export function dockerService(): DockerService {
  return {
    socket: requireService("STRATA_DOCKER_HOST", "30-docker.sh"),
    images: {
      busybox: requireService("STRATA_DOCKER_IMAGE_BUSYBOX", "30-docker.sh"),
      gnu: requireService("STRATA_DOCKER_IMAGE_GNU", "30-docker.sh"),
    },
  };
}

/** Labels every test container carries, so 30-docker.sh can clear what a crashed run left. */
export const TEST_LABELS = { "strata.test": "1" };

/**
 * One container per image for a whole test file; each test gets a fresh,
 * empty workspace directory in it (attach with a new workspace), which is
 * far faster than a container per test.
 */
export class SharedContainer {
  private base: Promise<DockerSandbox> | undefined;

  constructor(
    readonly image: string,
    private readonly options: DockerSandboxOptions = {},
  ) {}

  /** The container's own sandbox (workspace /workspace); created on first use. */
  container(): Promise<DockerSandbox> {
    this.base ??= DockerSandbox.create({ image: this.image, docker: dockerService().socket, labels: TEST_LABELS, ...this.options });
    return this.base;
  }

  /** A sandbox on a fresh, empty workspace in the shared container. */
  async fresh(options: DockerSandboxOptions = {}): Promise<DockerSandbox> {
    const base = await this.container();
    return DockerSandbox.attach(base.id, { docker: dockerService().socket, workspace: `/workspace/${randomUUID()}`, ...this.options, ...options });
  }

  /** Removes the container. */
  async dispose(): Promise<void> {
    const base = this.base;
    this.base = undefined;
    if (base) await (await base).close();
  }
}

export interface SshService {
  options: Pick<SshSandboxOptions, "host" | "port" | "username" | "privateKey" | "hostKey">;
  /** The remote user's home: test workspaces go below it. */
  home: string;
}

export function sshService(): SshService {
  const host = requireService("STRATA_SSH_HOST", "40-sshd.sh");
  const port = Number(requireService("STRATA_SSH_PORT", "40-sshd.sh"));
  const username = requireService("STRATA_SSH_USER", "40-sshd.sh");
  const privateKey = readFileSync(requireService("STRATA_SSH_KEY", "40-sshd.sh"));
  const hostKey = readFileSync(requireService("STRATA_SSH_HOST_KEY", "40-sshd.sh"), "utf8");
  return { options: { host, port, username, privateKey, hostKey }, home: `/home/${username}` };
}

/**
 * SSH sandboxes on fresh workspaces, all under one remote directory per test
 * file; `cleanUp` closes every one and removes the directory.
 */
export class SshWorkspaces {
  readonly service = sshService();
  readonly root: string;
  private readonly open: SshSandbox[] = [];

  constructor(name: string) {
    this.root = `${this.service.home}/${name}-${randomUUID()}`;
  }

  /** A sandbox on a fresh, empty workspace under `root`. */
  async fresh(extra: Partial<SshSandboxOptions> = {}): Promise<SshSandbox> {
    return this.track(await SshSandbox.connect({ ...this.service.options, workspace: `${this.root}/${randomUUID()}`, ...extra }));
  }

  /** Closes `sandbox` with the others at the end. */
  track(sandbox: SshSandbox): SshSandbox {
    this.open.push(sandbox);
    return sandbox;
  }

  async cleanUp(): Promise<void> {
    await Promise.all(this.open.map((sandbox) => sandbox.close()));
    const cleaner = await SshSandbox.connect({ ...this.service.options, workspace: this.service.home });
    await cleaner.execute(`rm -rf -- '${this.root}'`);
    await cleaner.close();
  }
}

/** The error `promise` rejects with; fails the test when it resolves. */
export async function rejection(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  throw new Error("expected a rejection");
}
