/**
 * Secrets inside the sandbox: on Bubblewrap and Docker what the rules deny
 * for reading is hidden from commands too, whatever a command tries; and no
 * sandbox hands a command a host variable it was not told to pass.
 */
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import type { Sandbox } from "../core/protocol.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";
import type { DockerSandbox } from "../sandboxes/docker.js";
import { LocalSandbox } from "../sandboxes/local.js";
import type { SshSandbox } from "../sandboxes/ssh.js";
import { SharedContainer, SshWorkspaces, dockerService } from "./support/sandbox-services.js";

const SECRET = "TOPSECRET-4242";
/** Files a command must not read, and where they lie: top level, in a matched directory, in a subdirectory, deep. */
const SECRET_FILES = [".env", ".ssh/id_rsa", "sub/.env.local", "sub/deep/.aws/credentials", "certs/server.pem"];

/** Every hostile way in that a command could try, as [what, command]. */
const ATTEMPTS: Array<[string, string]> = [
  ["cat", "cat .env .ssh/id_rsa sub/.env.local sub/deep/.aws/credentials certs/server.pem"],
  ["a glob in a matched directory", "cat .ssh/*"],
  ["a symlink the command makes", "ln -s .env l1 && ln -s /workspace/.ssh/id_rsa l2 && cat l1 l2"],
  ["a hard link", "ln .env h1; cat h1"],
  ["find", "find . -type f -exec cat {} +"],
  ["grep -r", "grep -r TOPSECRET . /workspace"],
  ["a rename", "mv .env moved; cat moved; mv .ssh ssh2; cat ssh2/id_rsa"],
  ["a copy", "cp -r . /tmp/copy; cat /tmp/copy/.env /tmp/copy/.ssh/id_rsa"],
  ["a chmod", "chmod 644 .env; chmod 755 .ssh; cat .env .ssh/id_rsa"],
  ["tar", "tar cf - . | tar tvf - >/dev/null; tar cf - . | cat"],
  // The host's walk cannot list a directory whose read bit a command took (as a non-root host): it is hidden whole.
  ["an unlistable directory", "chmod 300 sub; cat sub/.env.local; chmod 755 sub"],
];

/** Runs every attempt; none may print the secret. Plain files stay readable. */
async function expectHidden(sandbox: Sandbox): Promise<void> {
  for (const [what, command] of ATTEMPTS) {
    const answer = await sandbox.execute(command);
    expect(answer.error, what).toBeUndefined();
    expect(answer.output, what).not.toContain(SECRET);
  }
  const spawned = await sandbox.spawn("cat .env .ssh/id_rsa; cat plain.txt");
  const out = await new Response(spawned.stdout!).text();
  await spawned.wait!();
  expect(out).not.toContain(SECRET);
  expect(out).toContain("plain");
  expect((await sandbox.execute("cat plain.txt")).output).toBe("plain\n");
}

/** A secret created after the sandbox started (by a command) is hidden from the next command. */
async function expectLateSecretHidden(sandbox: Sandbox): Promise<void> {
  expect((await sandbox.execute(`mkdir -p late/.ssh && printf '${SECRET}' > late/.env.new && printf '${SECRET}' > late/.ssh/id_ed25519`)).exitCode).toBe(0);
  const answer = await sandbox.execute("cat late/.env.new late/.ssh/id_ed25519; find late -type f -exec cat {} +");
  expect(answer.output).not.toContain(SECRET);
}

describe("Bubblewrap hides denied files from commands", () => {
  const dirs: string[] = [];
  const open: Sandbox[] = [];
  afterAll(async () => {
    await Promise.all(open.map((s) => s.close()));
    dirs.forEach((dir) => rmSync(dir, { recursive: true, force: true }));
  });
  const workspace = () => {
    const dir = mkdtempSync(join(tmpdir(), "strata-secrets-"));
    dirs.push(dir);
    for (const file of SECRET_FILES) {
      mkdirSync(join(dir, file, ".."), { recursive: true });
      writeFileSync(join(dir, file), SECRET);
    }
    writeFileSync(join(dir, "plain.txt"), "plain\n");
    return dir;
  };
  const make = (options: ConstructorParameters<typeof BubblewrapSandbox>[0]) => {
    const sandbox = new BubblewrapSandbox(options);
    open.push(sandbox);
    return sandbox;
  };

  it("whatever the command tries (cat, symlinks, hard links, find, grep, rename, copy, chmod, tar, spawn)", async () => {
    const dir = workspace();
    await expectHidden(make({ workspace: dir }));
    // Hidden, not changed: the files on the host are intact.
    for (const file of SECRET_FILES) expect(readFileSync(join(dir, file), "utf8")).toBe(SECRET);
  });

  it("a secret that appears after the sandbox started, and one a host process writes between commands", async () => {
    const dir = workspace();
    const sandbox = make({ workspace: dir });
    await expectLateSecretHidden(sandbox);
    writeFileSync(join(dir, "sub", ".env.host"), SECRET);
    expect((await sandbox.execute("cat sub/.env.host")).output).not.toContain(SECRET);
    // Directories unchanged for 2 s are remembered between commands: a secret added to one later is still found.
    await new Promise((resolve) => setTimeout(resolve, 2_100));
    expect((await sandbox.execute("cat plain.txt")).output).toBe("plain\n");
    writeFileSync(join(dir, "sub", "deep", "id_rsa"), SECRET);
    mkdirSync(join(dir, "sub", "deep", "more"));
    writeFileSync(join(dir, "sub", "deep", "more", "key.pem"), SECRET);
    expect((await sandbox.execute("cat sub/deep/id_rsa sub/deep/more/key.pem")).output).not.toContain(SECRET);
  });

  it("what a custom rule denies for reading, and nothing when rules are off (the control)", async () => {
    const dir = workspace();
    writeFileSync(join(dir, "private.txt"), SECRET);
    const custom = make({ workspace: dir, permissions: { rules: [{ action: "deny", operations: "read", paths: "private.txt" }] } });
    expect((await custom.execute("cat private.txt")).output).not.toContain(SECRET);
    // The custom rules replace the preset: .env is readable to this one.
    expect((await custom.execute("cat .env")).output).toBe(SECRET);
    const off = make({ workspace: dir, permissions: false });
    expect((await off.execute("cat .env .ssh/id_rsa")).output).toBe(SECRET + SECRET);
  });
});

describe("Docker hides denied files from commands", () => {
  const { images } = dockerService();
  for (const [name, image] of Object.entries(images)) {
    const shared = new SharedContainer(image);
    afterAll(() => shared.dispose());

    /** A fresh workspace holding the secrets, written with rules off, then the sandbox under test on it. */
    async function seeded(): Promise<DockerSandbox> {
      const seeder = await shared.fresh({ permissions: false });
      const script = SECRET_FILES.map((file) => `mkdir -p "$(dirname ${file})" && printf '${SECRET}' > ${file}`).join(" && ");
      expect((await seeder.execute(`${script} && echo plain > plain.txt`)).exitCode).toBe(0);
      await seeder.close();
      return shared.fresh({ workspace: seeder.workspace });
    }

    it(`${name}: whatever the command tries (cat, symlinks, hard links, find, grep, rename, copy, chmod, tar, spawn)`, async () => {
      const sandbox = await seeded();
      try {
        await expectHidden(sandbox);
      } finally {
        await sandbox.close();
      }
    });

    it(`${name}: a secret that appears after the sandbox started`, async () => {
      const sandbox = await seeded();
      try {
        await expectLateSecretHidden(sandbox);
      } finally {
        await sandbox.close();
      }
    });

    it(`${name}: the control: with rules off the same command reads it`, async () => {
      const sandbox = await seeded();
      const off = await shared.fresh({ workspace: sandbox.workspace, permissions: false });
      try {
        expect((await off.execute("cat plain.txt .env")).output).toBe(`plain\n${SECRET}`);
      } finally {
        await Promise.all([sandbox.close(), off.close()]);
      }
    });
  }
});

describe("no host environment unless named; secret-looking names need the opt-in", () => {
  const ssh = new SshWorkspaces("secrets-env");
  const docker = new SharedContainer(dockerService().images.busybox);
  afterAll(async () => {
    await ssh.cleanUp();
    await docker.dispose();
  });
  type Options = { passEnv?: string[]; allowSecretEnv?: string[] };
  const KINDS: Array<[string, (options: Options) => Promise<Sandbox>]> = [
    ["LocalSandbox", async (options) => new LocalSandbox(options)],
    ["BubblewrapSandbox", async (options) => new BubblewrapSandbox(options)],
    ["DockerSandbox", (options) => docker.fresh(options)],
    ["SshSandbox", (options) => ssh.fresh(options)],
  ];

  for (const [name, make] of KINDS) {
    it(`${name}`, async () => {
      process.env.STRATA_TEST_UNNAMED = "unnamed-value";
      process.env.STRATA_TEST_PLAIN = "plain-value";
      process.env.STRATA_TEST_API_TOKEN = "token-value";
      try {
        await expect(make({ passEnv: ["STRATA_TEST_API_TOKEN"] })).rejects.toThrow(
          "passEnv names 'STRATA_TEST_API_TOKEN', which looks secret (KEY, SECRET, TOKEN or PASSWORD); list it in allowSecretEnv too to pass it",
        );
        await expect(make({ passEnv: ["my_password"] })).rejects.toThrow(/looks secret/);
        const sandbox = await make({ passEnv: ["STRATA_TEST_PLAIN", "STRATA_TEST_API_TOKEN", "STRATA_TEST_NOT_SET"], allowSecretEnv: ["STRATA_TEST_API_TOKEN"] });
        try {
          const answer = await sandbox.execute('echo "[$STRATA_TEST_PLAIN][$STRATA_TEST_API_TOKEN][${STRATA_TEST_NOT_SET-unset}][$STRATA_TEST_UNNAMED]"; env');
          expect(answer.error).toBeUndefined();
          expect(answer.output!.split("\n")[0]).toBe("[plain-value][token-value][unset][]");
          expect(answer.output).not.toContain("unnamed-value");
        } finally {
          await sandbox.close();
        }
      } finally {
        delete process.env.STRATA_TEST_UNNAMED;
        delete process.env.STRATA_TEST_PLAIN;
        delete process.env.STRATA_TEST_API_TOKEN;
      }
    });
  }
});

describe("SshSandbox cannot hide files from commands", () => {
  it("its file operations deny them; its commands can read them (the docs and the execute tool say so)", async () => {
    const ssh = new SshWorkspaces("secrets-ssh");
    try {
      const sandbox: SshSandbox = await ssh.fresh();
      expect((await sandbox.execute(`printf '${SECRET}' > .env`)).exitCode).toBe(0);
      expect((await sandbox.read(".env")).error?.code).toBe("permission_denied");
      expect((await sandbox.execute("cat .env")).output).toBe(SECRET);
    } finally {
      await ssh.cleanUp();
    }
  });
});
