/**
 * The unprivileged user's commands as requests on a ROOT exec session,
 * dropped to the user per request (setpriv, or BusyBox's nsenter -S), on the real test daemon: the
 * command sees what an exec as that user sees; it holds none of the
 * session's descriptors and cannot reach root's through /proc; a leftover
 * spamming forged framing into everything it can open cannot end or forge a
 * later command's answer; the caller's text is never evaluated by root;
 * concurrent commands each get their own answer; an image that cannot drop
 * (neither util-linux's setpriv, which has --reuid, nor nsenter) keeps an
 * exec per command.
 */
import Docker from "dockerode";
import { afterAll, describe, expect, it } from "vitest";
import { toSeedProtocol } from "../core/seed.js";
import { DockerSandbox } from "../sandboxes/docker.js";
import { SharedContainer, TEST_LABELS, dockerService, workExecs } from "./support/sandbox-services.js";

const { socket, images } = dockerService();
const docker = new Docker({ socketPath: socket });
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** PIDs of the session supervisors (their argv names them; a command of any user can read another's cmdline). */
const SUPERVISORS = `for p in /proc/[0-9]*; do case "$({ tr '\\0' ' ' < $p/cmdline; } 2>/dev/null)" in "/bin/sh -c NL="*" strata-session "*) echo \${p#/proc/};; esac; done`;

/** Whether the sandbox drops to its user on a root session (setpriv --reuid, or nsenter -S): a warm command takes no exec. */
async function canDrop(sandbox: DockerSandbox): Promise<boolean> {
  await sandbox.execute("true");
  const before = workExecs(sandbox.stats);
  await sandbox.execute("true");
  return workExecs(sandbox.stats) === before;
}

/** A raw exec as `user` through dockerode, its stdout as text: what the sandbox's command must look like. */
async function rawExec(container: Docker.Container, user: string, script: string): Promise<string> {
  const exec = await container.exec({ Cmd: ["/bin/sh", "-c", script], User: user, WorkingDir: "/workspace", AttachStdout: true, AttachStderr: true });
  const stream = await exec.start({ hijack: true, stdin: false });
  const chunks: Buffer[] = [];
  const { Writable } = await import("node:stream");
  docker.modem.demuxStream(stream, new Writable({ write: (chunk: Buffer, _e, done) => (chunks.push(chunk), done()) }), new Writable({ write: (_c, _e, done) => done() }));
  await new Promise((resolve) => stream.on("end", resolve).on("close", resolve));
  return Buffer.concat(chunks).toString("utf8");
}

for (const [flavour, image] of Object.entries(images)) {
  describe(`DockerSandbox: the user's commands on a root session (${flavour})`, () => {
    const shared = new SharedContainer(image);
    afterAll(() => shared.dispose());

    it("runs them as an exec of the user would: ids, groups, capabilities, HOME, environment, descriptors", async () => {
      const native = await shared.fresh();
      const drops = await canDrop(native);
      const probe = "id; echo HOME=$HOME; grep -E '^(Uid|Gid|Groups|Cap|NoNewPrivs)' /proc/self/status; env | grep -v -e ^STRATA_EXEC_ID= -e ^PWD= -e ^OLDPWD= -e ^SHLVL= | sort";
      const before = { ...native.stats };
      const answer = await toSeedProtocol(native).execute(probe);
      const viaExec = await rawExec(native.container, native.user, `cd ${native.workspace} && ${probe}`);
      expect(answer.exitCode).toBe(0);
      expect(answer.output).toBe(viaExec);
      expect(answer.output).toContain("Uid:\t65534\t65534\t65534\t65534");
      expect(answer.output).toContain("CapEff:\t0000000000000000");
      // The command's descriptors: its stdin, its output pipe twice, and what ls opens; nothing of the session's.
      const fds = await toSeedProtocol(native).execute("ls /proc/self/fd | tr '\\n' ' '");
      expect(fds.output).toBe("0 1 2 3 ");
      // Reopened by name, as scripts do: the pipes are the user's, as runc makes an exec's.
      const reopened = "echo out > /dev/stdout; echo err > /dev/stderr; cat /dev/stdin; stat -L -c %u /proc/self/fd/0 /proc/self/fd/1";
      expect((await toSeedProtocol(native).execute(reopened, { stdin: "in\n" })).output).toBe("out\nerr\nin\n65534\n65534\n");
      const kinds = await toSeedProtocol(native).execute("for f in 0 1 2; do readlink /proc/self/fd/$f; done", { stdin: "x" });
      const [stdin, out, err] = kinds.output.trim().split("\n");
      expect(stdin).toMatch(/^pipe:/);
      expect(out).toMatch(/^pipe:/);
      expect(err).toBe(out);
      if (drops) {
        // Root's work and the user's on sessions: no exec after the first session opened.
        expect(workExecs(native.stats) - workExecs(before)).toBeLessThanOrEqual(1);
        expect(native.stats.sessionRequests - before.sessionRequests).toBeGreaterThanOrEqual(1);
      }
    });

    it("drops a bare uid:gid with no passwd entry to its ids and its group alone; the command cannot signal or read root's processes", async () => {
      const native = await DockerSandbox.create({ image, docker: socket, labels: TEST_LABELS, user: "4321:1234" });
      try {
        const sandbox = toSeedProtocol(native);
        expect(await canDrop(native)).toBe(true);
        const before = { ...native.stats };
        const probe = "id -u; id -G; id; echo HOME=$HOME; grep -E '^(Uid|Gid|Groups|Cap)' /proc/self/status";
        const answer = await sandbox.execute(probe);
        expect(workExecs(native.stats) - workExecs(before)).toBe(0);
        expect(answer.output).toBe(await rawExec(native.container, "4321:1234", `cd ${native.workspace} && ${probe}`));
        expect(answer.output).toMatch(/^4321\n1234\n/);
        expect(answer.output).toContain("Groups:\t1234 \n");
        expect(answer.output).toContain("CapEff:\t0000000000000000\n");
        // Root's processes in reach: the request's shell waiting for the command (its parent) and the supervisors.
        const reach = await sandbox.execute(
          `n=0; for p in $PPID $(${SUPERVISORS}); do n=$((n+1)); grep '^Uid:' /proc/$p/status | tr '\\t' ' '; kill -0 $p 2>/dev/null && echo "signalled $p"; ` +
            `kill -TERM $p 2>/dev/null && echo "terminated $p"; cat /proc/$p/environ >/dev/null 2>&1 && echo "read $p"; ls /proc/$p/fd >/dev/null 2>&1 && echo "listed $p"; done; echo "seen $n"`,
        );
        const lines = reach.output.trim().split("\n");
        expect(lines.filter((line) => !line.startsWith("seen") && line !== "Uid: 0 0 0 0")).toEqual([]);
        expect(Number(lines.at(-1)!.split(" ")[1])).toBeGreaterThanOrEqual(2);
        // Every process of the command's session is the user's: no root-owned process stands between root's shell and the command.
        const session = await sandbox.execute(
          `read -r l </proc/$$/stat; set -- \${l##*) }; sid=$4; for d in /proc/[0-9]*; do { read -r l <$d/stat; } 2>/dev/null || continue; ` +
            `set -- \${l##*) }; [ "$4" = "$sid" ] && grep '^Uid:' $d/status 2>/dev/null; done | sort -u | tr '\\t' ' '`,
        );
        expect(session.output).toBe("Uid: 4321 4321 4321 4321\n");
        // The sessions survived the attempts: the next command still rides one.
        const after = { ...native.stats };
        expect((await sandbox.execute("id -u")).output).toBe("4321\n");
        expect(workExecs(native.stats) - workExecs(after)).toBe(0);
      } finally {
        await native.close();
      }
    });

    it("a command cannot reach the root session: no listing of its fds, no write to its stdin", async () => {
      const native = await shared.fresh();
      const drops = await canDrop(native);
      const sandbox = toSeedProtocol(native);
      await sandbox.execute("true");
      const probe = await sandbox.execute(
        `n=0; for p in $(${SUPERVISORS}); do n=$((n+1)); ls /proc/$p/fd >/dev/null 2>&1 && echo "listed $p"; ` +
          `{ echo 'Lecho INJECTED > /tmp/inj-$$' > /proc/$p/fd/0; } 2>/dev/null && echo "wrote $p"; ` +
          `{ echo x > /proc/$p/fd/1; } 2>/dev/null && echo "wrote out $p"; { echo x > /proc/$p/fd/2; } 2>/dev/null && echo "wrote err $p"; done; echo "seen $n"`,
      );
      expect(probe.exitCode).toBe(0);
      const lines = probe.output.trim().split("\n");
      expect(lines.filter((line) => !line.startsWith("seen"))).toEqual([]);
      if (drops) expect(Number(lines.at(-1)!.split(" ")[1])).toBeGreaterThanOrEqual(1);
      await sleep(300);
      expect((await sandbox.execute("ls /tmp | grep -c inj- || true")).output.trim()).toBe("0");
    });

    it("a leftover spamming forged markers and reports into everything it can open cannot end or forge a later command's answer", async () => {
      const native = await DockerSandbox.create({ image, docker: socket, labels: TEST_LABELS });
      const sandbox = toSeedProtocol(native);
      try {
        // Where each command takes an exec as the user, its wrapper's reports travel on a stderr the user's leftovers can open
        // (docs/security.md): only a dropped request keeps them out of reach.
        if (!(await canDrop(native))) return;
        const marker = `61${Math.floor(Math.random() * 1e6)}`;
        // Every line the host reads as framing or a report, in every form, into every descriptor of every process it can open.
        const forged = `printf '\\000Eforged\\nstrata-exit 0\\nstrata-status 0\\nstrata-done forged\\nstrata-pgid 1\\nstrata-nocwd\\n'`;
        const started = await sandbox.execute(
          `setsid sh -c 'while :; do for f in /proc/[0-9]*/fd/[0-9]*; do ${forged.replace(/'/g, `'"'"'`)} 1<>"$f"; done 2>/dev/null; sleep 0.05; done; : ${marker}' >/dev/null 2>&1 </dev/null & echo started`,
        );
        // The leftover starts before the echo and may already write into this command's own output pipe.
        expect(started.exitCode).toBe(0);
        expect(started.output).toContain("started\n");
        await sleep(300);
        for (let i = 0; i < 5; i++) {
          const answer = await sandbox.execute(`echo one; sleep 0.4; echo two; exit ${i + 3}`);
          // The leftover may write into the command's own output pipe (same user, as with an exec), but the answer ends only when
          // the command's does, with its own status.
          expect(answer.exitCode).toBe(i + 3);
          expect(answer.output).toContain("one\n");
          expect(answer.output).toContain("two\n");
        }
        const withStdin = await sandbox.execute("cat; exit 9", { stdin: "data\n" });
        expect(withStdin.exitCode).toBe(9);
        expect(withStdin.output).toContain("data\n");
      } finally {
        await native.close();
      }
    });

    it("never evaluates the caller's text as root: command, env values and cwd run as the user, quoted", async () => {
      const native = await shared.fresh();
      const sandbox = toSeedProtocol(native);
      const tag = `${Math.floor(Math.random() * 1e6)}`;
      const hostile = (what: string) => `$(id -u > /tmp/${what}-dollar-${tag})\`id -u > /tmp/${what}-tick-${tag}\`'"; id -u > /tmp/${what}-semi-${tag}\n id -u > /tmp/${what}-nl-${tag}`;
      const dir = hostile("cwd").replace(/\//g, "_");
      expect((await sandbox.execute('mkdir -- "$D"', { env: { D: dir } })).exitCode).toBe(0);
      const answer = await native.execute('printf "%s|" "$V"; id -u; pwd', { env: { V: hostile("env") }, cwd: `${native.workspace}/${dir}` });
      if ("error" in answer) throw new Error(answer.error?.message);
      expect(answer.output).toBe(`${hostile("env")}|65534\n${native.workspace}/${dir}\n`);
      // The command's own text is the user's to run: what it makes is the user's.
      await sandbox.execute(`id -u > /tmp/cmd-${tag}; echo '$(id -u > /tmp/cmd-quoted-${tag})'`);
      const made = await sandbox.execute(`ls -n /tmp | grep ${tag} | awk '{print $3, $NF}'`);
      expect(made.output).toBe(`65534 cmd-${tag}\n`);
    });

    it("the caller's environment reaches the dropped command only, never a process run as root (PATH, LD_PRELOAD)", async () => {
      const native = await shared.fresh();
      const sandbox = toSeedProtocol(native);
      const tag = `${Math.floor(Math.random() * 1e6)}`;
      // Impostors of what root runs on the way to the drop, each leaving a mark with the uid it ran as.
      await sandbox.execute(
        `mkdir -p bin && for n in setsid setpriv sh env cat readlink dd; do printf '#!/bin/sh\\nid -u > /tmp/impostor-${tag}-%s-$(id -u)\\nexec /usr/bin/%s "$@"\\n' $n $n > bin/$n; chmod +x bin/$n; done`,
      );
      const answer = await sandbox.execute("id -u; echo $V", {
        env: { PATH: `${native.workspace}/bin:/usr/bin:/bin`, LD_PRELOAD: `/nonexistent-${tag}.so`, LD_LIBRARY_PATH: native.workspace, V: "seen" },
        stdin: "x",
      });
      expect(answer.exitCode).toBe(0);
      expect(answer.output).toMatch(/65534\nseen\n$/);
      const marks = await sandbox.execute(`ls /tmp | grep impostor-${tag} || true`);
      expect(marks.output.split("\n").filter((line) => line.endsWith("-0"))).toEqual([]);
    });

    it("an environment too long for a dropped request's line takes an exec, and arrives whole either way", async () => {
      const native = await shared.fresh();
      const drops = await canDrop(native);
      await native.execute("true");
      const long = `a'b"c$(x)\n`.repeat(4000);
      for (const [value, viaExec] of [
        ["short\nwith 'quotes' and $(x)", false],
        [long, true],
      ] as const) {
        const before = { ...native.stats };
        const answer = await toSeedProtocol(native).execute('printf %s "$V" | wc -c', { env: { V: value } });
        expect(answer.output.trim()).toBe(String(Buffer.byteLength(value)));
        if (drops) expect(workExecs(native.stats) - workExecs(before)).toBe(viaExec ? 1 : 0);
      }
    });

    it("runs 12 concurrent commands of the user side by side, each answered with its own output and status", async () => {
      const native = await shared.fresh();
      const started = Date.now();
      const answers = await Promise.all(
        Array.from({ length: 12 }, (_, i) =>
          native.execute(`sleep 1; head -c ${1000 + i} /dev/zero | tr '\\0' ${String.fromCharCode(97 + i)}; cat; exit ${i}`, { stdin: `<${i}>` }),
        ),
      );
      expect(Date.now() - started).toBeLessThan(10_000);
      answers.forEach((answer, i) => {
        if ("error" in answer) throw new Error(answer.error?.message);
        expect(answer).toEqual({ output: `${String.fromCharCode(97 + i).repeat(1000 + i)}<${i}>`, exitCode: i, truncated: false });
      });
    });

    it("times out, aborts and kills the user's commands with their group and leftovers, and reports a missing or forbidden cwd", async () => {
      const native = await shared.fresh();
      const sandbox = toSeedProtocol(native);
      const marker = `62${Math.floor(Math.random() * 1e6)}`;
      const timedOut = await sandbox.execute(`(sleep ${marker} &) ; echo started; sleep ${marker}`, { timeout: 1 });
      expect(timedOut.exitCode).toBe(124);
      expect(timedOut.output).toMatch(/^started\n/);
      const killed = await sandbox.execute(`sleep ${marker}`, { stdin: "echo injected\n".repeat(10_000), timeout: 1 });
      expect(killed.exitCode).toBe(124);
      expect(await sandbox.execute("echo clean")).toEqual({ output: "clean\n", exitCode: 0, truncated: false });
      const controller = new AbortController();
      setTimeout(() => controller.abort(new Error("stop it")), 300);
      await expect(sandbox.execute(`sleep ${marker}`, { signal: controller.signal })).rejects.toThrow("stop it");
      await sleep(500);
      expect((await sandbox.execute(`ps -o args | grep -c "^sleep ${marker}" || true`)).output.trim()).toBe("0");
      await expect(sandbox.execute("pwd", { cwd: `${native.workspace}/missing` })).rejects.toMatchObject({ code: "file_not_found" });
      // A directory root made that the user may not enter: refused as an exec would refuse it, not entered as root.
      const root = await DockerSandbox.attach(native.id, { docker: socket, workspace: native.workspace, user: "0:0", permissions: false });
      await toSeedProtocol(root).execute("mkdir -p closed && chmod 700 closed && chown 0:0 closed");
      await root.close();
      await expect(sandbox.execute("pwd", { cwd: `${native.workspace}/closed` })).rejects.toMatchObject({ code: "file_not_found" });
      // A command that itself exits 200 (the status the cwd check uses) keeps it.
      expect((await sandbox.execute("exit 200")).exitCode).toBe(200);
    });

    it("uploads a small batch on a session and a big one through an exec, both as the user, byte for byte", async () => {
      const native = await shared.fresh({ quota: false });
      const drops = await canDrop(native);
      const ws = native.workspace;
      const small = Uint8Array.from({ length: 4096 }, (_, i) => (i * 7) % 256);
      const big = Uint8Array.from({ length: 1536 * 1024 }, (_, i) => (i * 13) % 256);
      let before = { ...native.stats };
      expect(await toSeedProtocol(native).uploadFiles([[`${ws}/s/a.bin`, small], [`${ws}/s/b.bin`, small.subarray(1)]])).toEqual([
        { path: `${ws}/s/a.bin`, error: null },
        { path: `${ws}/s/b.bin`, error: null },
      ]);
      if (drops) expect(workExecs(native.stats) - workExecs(before)).toBe(0);
      before = { ...native.stats };
      expect((await toSeedProtocol(native).uploadFiles([[`${ws}/big.bin`, big]]))[0]!.error).toBeNull();
      expect(workExecs(native.stats) - workExecs(before)).toBe(1);
      const back = await toSeedProtocol(native).downloadFiles([`${ws}/s/a.bin`, `${ws}/s/b.bin`, `${ws}/big.bin`]);
      expect(back.map((r) => Buffer.from(r.content!).equals(Buffer.from(r.path.endsWith("big.bin") ? big : r.path.endsWith("a.bin") ? small : small.subarray(1))))).toEqual([true, true, true]);
      expect((await toSeedProtocol(native).execute("stat -c %u s/a.bin big.bin")).output).toBe("65534\n65534\n");
      // The session is in step after the bytes: the next command and upload answer as they should.
      expect((await toSeedProtocol(native).execute("echo next")).output).toBe("next\n");
    });

    // BusyBox's shell runs its applets (nsenter among them) whatever the files say, so only the GNU image can lose its way to drop.
    it.skipIf(flavour !== "gnu")("keeps an exec per command where the image cannot drop to the user", async () => {
      // The image without its setpriv and nsenter (moved away by root in a container of its own; an image may lack both).
      const root = await DockerSandbox.create({ image, docker: socket, labels: TEST_LABELS, user: "0:0", readOnlyRoot: false, permissions: false });
      try {
        const away = "for t in setpriv nsenter; do p=$(command -v $t) && mv $p $p.away; done; command -v setpriv nsenter || echo gone";
        expect((await toSeedProtocol(root).execute(away)).output).toBe("gone\n");
        const native = await DockerSandbox.attach(root.id, { docker: socket, workspace: "/workspace" });
        try {
          const sandbox = toSeedProtocol(native);
          expect(await sandbox.execute("id -u; echo $HOME")).toEqual({ output: "65534\n/nonexistent\n", exitCode: 0, truncated: false });
          const before = { ...native.stats };
          for (let i = 0; i < 3; i++) expect((await sandbox.execute(`exit ${i}`)).exitCode).toBe(i);
          expect(workExecs(native.stats) - workExecs(before)).toBe(3);
          expect((await sandbox.execute("sleep 5", { timeout: 1 })).exitCode).toBe(124);
          expect(await sandbox.read(`${native.workspace}/none`)).toMatch(/not found/);
        } finally {
          await native.close();
        }
      } finally {
        await root.close();
      }
    });
  });
}
