import { randomUUID } from "node:crypto";
import { existsSync, readFileSync, statSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import { homedir } from "node:os";
import { join } from "node:path";
import { findOnPath } from "../backends/executable.js";
import { unwrap } from "../core/base.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";
import { DockerSandbox } from "../sandboxes/docker.js";
import { shellQuote } from "../sandboxes/shell.js";
import { LocalSandbox } from "../sandboxes/local.js";
import { SshSandbox } from "../sandboxes/ssh.js";
import { BackendUnavailable, InvalidSpec, ProviderError } from "./errors.js";
import { measuredColdStart, SandboxProviderBase, type Capabilities, type OpenedSandbox, type SandboxSpec } from "./provider.js";
import type { ProviderRegistry } from "./registry.js";

/**
 * The four built-in providers. Each `isAvailable` only looks at the
 * environment and the filesystem (no network, no subprocess); `open` is where
 * a provider may find out more and fail with BackendUnavailable (`unavailable`).
 *
 * How the spec applies:
 * - `env` reaches every payload dispatched through the handle (all four), and
 *   also direct `sandbox.execute` calls on bubblewrap and docker sandboxes;
 * - `passEnv` / `allowSecretEnv` are the sandboxes' options (all four): host
 *   variables passed by name, secret-looking ones only when also allowed;
 * - `workspace` is the workspace: a host directory (local, bubblewrap;
 *   created if missing and kept at close), a directory in the container
 *   (docker) or on the remote host (ssh);
 * - `network` is the sandboxes' option: bubblewrap and docker have none
 *   unless it is true (docker: the default bridge); local and ssh always
 *   have the network, so they refuse `network: false` (InvalidSpec) rather
 *   than pretend;
 * - `image` is the docker image (default: env STRATA_DOCKER_IMAGE); the
 *   others have none and ignore it, as OpenRath's local backend does;
 * - `entrypoint` is ignored: every sandbox's main process is its own
 *   keep-alive (docker) or there is none (local, bubblewrap, ssh);
 * - `timeout` is the lifetime, enforced by the handle for all four.
 */

/** The spec's host-variable pass-through, as every sandbox takes it. */
function passEnv(spec: SandboxSpec): { passEnv?: string[]; allowSecretEnv?: string[] } {
  return { passEnv: spec.passEnv, allowSecretEnv: spec.allowSecretEnv };
}

function capabilities(name: string, isolation: Capabilities["isolation"]): Capabilities {
  return { isolation, commands: true, files: true, codeRun: true, streaming: true, coldStart: measuredColdStart(name) };
}

/** Host processes in a workspace directory: no isolation, always available. */
export class LocalProvider extends SandboxProviderBase {
  static isAvailable(): boolean {
    return true;
  }

  unavailableReason(): string | undefined {
    return undefined;
  }

  capabilities(): Capabilities {
    return capabilities(this.name, "process");
  }

  protected async create(spec: SandboxSpec): Promise<OpenedSandbox> {
    refuseNoNetwork(this.name, spec);
    if (spec.workspace !== undefined) await makeWorkspace(spec.workspace);
    return { sandbox: new LocalSandbox({ workspace: spec.workspace, ...passEnv(spec) }) };
  }
}

/** Each command in fresh Linux namespaces (bwrap), the workspace the only writable place. */
export class BubblewrapProvider extends SandboxProviderBase {
  static isAvailable(): boolean {
    // Unlike findOnPath's default, an entry that cannot be examined (EACCES, ENOTDIR) throws, as this check always has.
    return findOnPath("bwrap", { accept: (candidate) => statSync(candidate, { throwIfNoEntry: false })?.isFile() === true }) !== undefined;
  }

  unavailableReason(): string | undefined {
    return BubblewrapProvider.isAvailable() ? undefined : "bwrap is not on PATH (apt-get install bubblewrap)";
  }

  capabilities(): Capabilities {
    return capabilities(this.name, "namespace");
  }

  protected async create(spec: SandboxSpec): Promise<OpenedSandbox> {
    // bwrap being installed is not enough (user namespaces may be off): one probe run says, once per process.
    const reason = await BubblewrapSandbox.unavailableReason();
    if (reason !== undefined) throw new BackendUnavailable(this.name, reason);
    if (spec.workspace !== undefined) await makeWorkspace(spec.workspace);
    return { sandbox: new BubblewrapSandbox({ workspace: spec.workspace, network: spec.network, env: spec.env, ...passEnv(spec) }) };
  }
}

/**
 * A container per sandbox on a Docker daemon: STRATA_DOCKER_HOST, else
 * DOCKER_HOST, else /var/run/docker.sock. Containers outlive the process, so
 * a handle's `remoteId` (the container id) can be recorded and reattached;
 * `detach()` leaves the container running, `close()` removes it (also when
 * reattached: detach is the way to keep it).
 */
export class DockerProvider extends SandboxProviderBase {
  static isAvailable(): boolean {
    return DockerProvider.unavailableReason() === undefined;
  }

  static unavailableReason(): string | undefined {
    const host = dockerHost();
    if (host.socketPath === undefined) return undefined; // a TCP daemon: only a connection would tell
    return existsSync(host.socketPath) ? undefined : "no Docker daemon socket (set STRATA_DOCKER_HOST or DOCKER_HOST, or start dockerd)";
  }

  unavailableReason(): string | undefined {
    return DockerProvider.unavailableReason();
  }

  capabilities(): Capabilities {
    return capabilities(this.name, "container");
  }

  protected async create(spec: SandboxSpec): Promise<OpenedSandbox> {
    const image = spec.image ?? process.env.STRATA_DOCKER_IMAGE;
    if (!image) throw new InvalidSpec("The docker provider needs an image: set spec.image or STRATA_DOCKER_IMAGE");
    // The lifetime is also enforced inside the container, so it holds if this process dies first.
    const sandbox = await DockerSandbox.create({
      ...this.#options(spec),
      image,
      network: spec.network,
      labels: { "strata.provider": this.name },
      lifetimeSeconds: spec.timeout,
    });
    return { sandbox, remoteId: sandbox.id };
  }

  protected override async attach(remoteId: string, spec: SandboxSpec, created: boolean): Promise<OpenedSandbox> {
    // A container this provider did not record as created is someone else's: close lets go of it.
    const sandbox = await DockerSandbox.attach(remoteId, { ...this.#options(spec), removeOnClose: created });
    return { sandbox, remoteId: sandbox.id, created };
  }

  #options(spec: SandboxSpec) {
    const host = dockerHost();
    // Without a socket path Dockerode reads DOCKER_HOST itself (tcp://…).
    return { docker: host.socketPath, workspace: spec.workspace, env: spec.env, ...passEnv(spec) };
  }
}

/**
 * A workspace directory on a machine reached over SSH, configured by the
 * environment: STRATA_SSH_HOST, STRATA_SSH_PORT (default 22), STRATA_SSH_USER,
 * STRATA_SSH_KEY (path of the private key), STRATA_SSH_HOST_KEY (path of the
 * server's public key; any other server key is refused; without it the key
 * must be in STRATA_SSH_KNOWN_HOSTS, default ~/.ssh/known_hosts) and
 * STRATA_SSH_ROOT (where workspaces are made, default /tmp).
 *
 * Without `workspace` each sandbox gets a fresh private directory under the
 * root, removed at close. The `remoteId` is an ssh:// URL (user, host, port,
 * workspace), so another process can reattach; `detach()` only ends the
 * connection, `close()` also removes a workspace the provider made.
 */
export class SshProvider extends SandboxProviderBase {
  static isAvailable(): boolean {
    return SshProvider.unavailableReason() === undefined;
  }

  static unavailableReason(): string | undefined {
    const missing = ["STRATA_SSH_HOST", "STRATA_SSH_USER", "STRATA_SSH_KEY"].filter((name) => !process.env[name]);
    if (missing.length > 0) return `${missing.join(", ")} not set`;
    return existsSync(process.env.STRATA_SSH_KEY!) ? undefined : "the key file named by STRATA_SSH_KEY does not exist";
  }

  unavailableReason(): string | undefined {
    return SshProvider.unavailableReason();
  }

  capabilities(): Capabilities {
    return capabilities(this.name, "remote");
  }

  protected async create(spec: SandboxSpec): Promise<OpenedSandbox> {
    refuseNoNetwork(this.name, spec);
    // A named workspace may hold anything: only a fresh directory under the root is the provider's to remove.
    const owned = spec.workspace === undefined;
    const root = process.env.STRATA_SSH_ROOT || "/tmp";
    const workspace = spec.workspace ?? `${root.replace(/\/+$/, "")}/strata-${randomUUID()}`;
    const target = { host: process.env.STRATA_SSH_HOST!, port: Number(process.env.STRATA_SSH_PORT || 22), username: process.env.STRATA_SSH_USER!, workspace };
    return this.#connect(target, spec, owned);
  }

  protected override async attach(remoteId: string, spec: SandboxSpec, created: boolean): Promise<OpenedSandbox> {
    // Ownership comes only from the record's `created` flag: a spec without workspace proves nothing.
    refuseNoNetwork(this.name, spec);
    return this.#connect(parseSshUrl(remoteId), spec, created);
  }

  async #connect(target: SshTarget, spec: SandboxSpec, owned: boolean): Promise<OpenedSandbox> {
    const hostKeyFile = process.env.STRATA_SSH_HOST_KEY;
    const sandbox = await SshSandbox.connect({
      ...target,
      privateKey: readConfigFile("STRATA_SSH_KEY", process.env.STRATA_SSH_KEY!),
      hostKey: hostKeyFile ? readConfigFile("STRATA_SSH_HOST_KEY", hostKeyFile).toString("utf8").trim() : undefined,
      knownHosts: hostKeyFile ? undefined : process.env.STRATA_SSH_KNOWN_HOSTS || join(homedir(), ".ssh", "known_hosts"),
      env: spec.env,
      ...passEnv(spec),
    });
    if (owned) {
      // Others on the machine have no business in it.
      const chmod = await sandbox.execute(`chmod 700 ${shellQuote(target.workspace)}`);
      if (chmod.error || chmod.exitCode !== 0) {
        await sandbox.close();
        // The sandbox's own failure (a dropped connection, say) passes through as the StrataError it is.
        if (chmod.error) unwrap(chmod);
        throw new ProviderError("permission_denied", "Cannot make the remote workspace private");
      }
    }
    return {
      sandbox,
      remoteId: sshUrl(target),
      created: owned,
      teardown: async () => {
        try {
          // A failure to reach the sandbox surfaces from close; rm's own exit status does not.
          if (owned && !sandbox.closed) unwrap(await sandbox.execute(`cd / && rm -rf -- ${shellQuote(target.workspace)}`, { timeout: 60 }));
        } finally {
          await sandbox.close();
        }
      },
      detach: () => sandbox.close(),
    };
  }
}

interface SshTarget {
  host: string;
  port: number;
  username: string;
  workspace: string;
}

/** `ssh://user@host:port/absolute/workspace` (the path percent-encoded). */
function sshUrl(target: SshTarget): string {
  const host = target.host.includes(":") ? `[${target.host}]` : target.host;
  return `ssh://${encodeURIComponent(target.username)}@${host}:${target.port}${encodeURI(target.workspace)}`;
}

function parseSshUrl(remoteId: string): SshTarget {
  let url: URL;
  try {
    url = new URL(remoteId);
  } catch {
    throw new ProviderError("invalid_argument", "An ssh sandbox's remoteId must be an ssh://user@host:port/workspace URL");
  }
  if (url.protocol !== "ssh:" || !url.username || !url.hostname || url.pathname.length < 2) {
    throw new ProviderError("invalid_argument", "An ssh sandbox's remoteId must be an ssh://user@host:port/workspace URL");
  }
  return {
    host: url.hostname.replace(/^\[(.*)\]$/, "$1"),
    port: Number(url.port || 22),
    username: decodeURIComponent(url.username),
    workspace: decodeURI(url.pathname),
  };
}

/** Registers local, bubblewrap, docker and ssh in `registry`. */
export function registerBuiltinProviders(registry: ProviderRegistry): void {
  registry.register("local", LocalProvider);
  registry.register("bubblewrap", BubblewrapProvider);
  registry.register("docker", DockerProvider);
  registry.register("ssh", SshProvider);
}

// ---------------------------------------------------------------- environment

/** Creates a host workspace directory; a failure is a ProviderError naming the errno code, not the host path. */
async function makeWorkspace(dir: string): Promise<void> {
  try {
    await mkdir(dir, { recursive: true });
  } catch (error) {
    throw hostFileError("create the workspace directory", error);
  }
}

/** local and ssh cannot take the network away from their commands: a spec asking for none is refused, not ignored. */
function refuseNoNetwork(provider: string, spec: SandboxSpec): void {
  if (spec.network === false) {
    throw new InvalidSpec(`The ${provider} provider cannot cut its sandboxes off the network (network: false); use bubblewrap or docker`);
  }
}

/** Reads a file the environment names (a key); a failure names the variable, not the host path. */
function readConfigFile(variable: string, path: string): Buffer {
  try {
    return readFileSync(path);
  } catch (error) {
    throw hostFileError(`read the file named by ${variable}`, error);
  }
}

function hostFileError(what: string, error: unknown): ProviderError {
  const errno = (error as NodeJS.ErrnoException | undefined)?.code;
  const code =
    errno === "ENOENT" ? "file_not_found"
    : errno === "EACCES" || errno === "EPERM" ? "permission_denied"
    : errno === "ENOTDIR" || errno === "EEXIST" ? "invalid_argument" // a file where a directory is wanted
    : "io_error";
  return new ProviderError(code, `Could not ${what} (${errno ?? "unknown error"})`, { cause: error });
}

function dockerHost(): { socketPath?: string } {
  const value = process.env.STRATA_DOCKER_HOST || process.env.DOCKER_HOST || "/var/run/docker.sock";
  if (value.startsWith("unix://")) return { socketPath: value.slice("unix://".length) };
  if (value.startsWith("/")) return { socketPath: value };
  return {};
}
