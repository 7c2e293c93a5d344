/**
 * `--sandbox ssh://user@host[:port]/dir`: the SshSandbox options a URL names,
 * with the credentials an ssh user expects to be used. The key: `identity`
 * when given, else the first unencrypted default key (~/.ssh/id_ed25519,
 * id_ecdsa, id_rsa); the agent at SSH_AUTH_SOCK is tried too. The server must
 * be known: `knownHosts` when given, else ~/.ssh/known_hosts (plain or hashed
 * entries, `[host]:port` for another port), as `ssh` checks it; an unknown
 * server is refused before any credential is sent.
 */
import { existsSync, readFileSync } from "node:fs";
import { homedir, userInfo } from "node:os";
import nodePath from "node:path";
import { StrataError } from "../core/errors.js";
import type { SshSandboxOptions } from "../sandboxes/ssh.js";

export interface SshCredentials {
  /** A private key file (OpenSSH or PEM), unencrypted; an encrypted key belongs in the agent. */
  identity?: string;
  /** An OpenSSH known_hosts file that must list the server's key. Default ~/.ssh/known_hosts. */
  knownHosts?: string;
}

const DEFAULT_KEYS = ["id_ed25519", "id_ecdsa", "id_rsa"];

function invalid(message: string): never {
  throw new StrataError("invalid_argument", message);
}

/** user, host, port and the remote directory of `ssh://[user@]host[:port]/dir` (the user defaults to this one, as ssh's does). */
export function parseSshUrl(url: string): Pick<SshSandboxOptions, "username" | "host" | "port" | "workspace"> {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return invalid("--sandbox ssh://user@host[:port]/dir: that URL cannot be read");
  }
  if (parsed.protocol !== "ssh:" || parsed.hostname === "") invalid("--sandbox ssh://user@host[:port]/dir: give the host");
  if (parsed.password !== "") invalid("--sandbox ssh://: no password in the URL; log in with a key (--identity or ssh-agent)");
  if (parsed.search !== "" || parsed.hash !== "") invalid("--sandbox ssh://user@host[:port]/dir takes no ?query or #fragment");
  const workspace = decodeURIComponent(parsed.pathname);
  if (workspace === "" || workspace === "/") invalid("--sandbox ssh://user@host[:port]/dir: name the remote directory (an absolute path)");
  return {
    username: parsed.username === "" ? userInfo().username : decodeURIComponent(parsed.username),
    host: parsed.hostname.replace(/^\[(.*)\]$/, "$1"),
    port: parsed.port === "" ? 22 : Number(parsed.port),
    workspace,
  };
}

/** Whether ssh2 can use the key without a passphrase (an encrypted one must come from the agent). */
async function usableKey(key: Buffer): Promise<boolean> {
  const { default: ssh2 } = await import("ssh2");
  return !(ssh2.utils.parseKey(key) instanceof Error);
}

/** The options SshSandbox.connect takes for `url`, credentials found the way ssh finds them. Errors name files by their base name. */
export async function sshSandboxOptions(url: string, credentials: SshCredentials = {}, env: NodeJS.ProcessEnv = process.env, home = homedir()): Promise<SshSandboxOptions> {
  const target = parseSshUrl(url);
  let privateKey: Buffer | undefined;
  if (credentials.identity !== undefined) {
    const name = nodePath.basename(credentials.identity);
    try {
      privateKey = readFileSync(credentials.identity);
    } catch {
      return invalid(`The identity file '${name}' cannot be read`);
    }
    if (!(await usableKey(privateKey))) invalid(`The identity file '${name}' is not a private key, or is encrypted (add an encrypted key to ssh-agent instead)`);
  } else {
    for (const name of DEFAULT_KEYS) {
      const file = nodePath.join(home, ".ssh", name);
      if (!existsSync(file)) continue;
      try {
        const key = readFileSync(file);
        if (await usableKey(key)) {
          privateKey = key;
          break;
        }
      } catch {
        // An unreadable default key is skipped, as ssh skips it.
      }
    }
  }
  const agent = env.SSH_AUTH_SOCK || undefined;
  if (!privateKey && !agent) invalid("--sandbox ssh://: no key to log in with: --identity FILE, an unencrypted ~/.ssh/id_ed25519 (or id_ecdsa, id_rsa), or an ssh-agent (SSH_AUTH_SOCK)");
  const knownHosts = credentials.knownHosts ?? nodePath.join(home, ".ssh", "known_hosts");
  if (!existsSync(knownHosts)) {
    const where = credentials.knownHosts === undefined ? "~/.ssh/known_hosts" : `'${nodePath.basename(knownHosts)}'`;
    const port = target.port === 22 ? "" : `-p ${target.port} `;
    invalid(`--sandbox ssh://: the server's key must be known, and ${where} does not exist (ssh-keyscan ${port}${target.host} >> ~/.ssh/known_hosts, after checking the key; or --known-hosts FILE)`);
  }
  return { ...target, knownHosts, ...(privateKey ? { privateKey } : {}), ...(agent ? { agent } : {}) };
}
