/**
 * DockerSandbox against the real test daemon (scripts/services/30-docker.sh),
 * on both test images: BusyBox and GNU userlands. One container per image;
 * each test works in a fresh workspace directory inside it.
 */
import { randomUUID } from "node:crypto";
import Docker from "dockerode";
import { afterAll, describe, expect, it } from "vitest";
import { unwrap } from "../core/base.js";
import { isStrataError } from "../core/errors.js";
import { toSeedProtocol } from "../core/seed.js";
import { DockerSandbox } from "../sandboxes/docker.js";
import { dockerService, rejection, SharedContainer, TEST_LABELS, workExecs, workTrips } from "./support/sandbox-services.js";
import { expectOnePathSpace } from "./support/path-space.js";
import { abortAtEveryMoment } from "./support/aborts.js";

const { socket, images } = dockerService();
const bytes = (text: string) => new TextEncoder().encode(text);
const text = (data: Uint8Array | null) => new TextDecoder().decode(data ?? new Uint8Array());

/** The rejection of a promise (fails the test when it resolves). */
/** Lines of `ps` inside the container that mention `marker`, polled until none is left or `seconds` pass. */
async function processesInside(sandbox: DockerSandbox, marker: string, seconds = 3): Promise<string[]> {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const { output } = await toSeedProtocol(sandbox).execute("ps -o pid,stat,args");
    const found = output.split("\n").filter((line) => line.includes(marker));
    if (found.length === 0 || Date.now() > deadline) return found;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

for (const [flavour, image] of Object.entries(images)) {
  describe(`DockerSandbox (${flavour})`, () => {
    const shared = new SharedContainer(image);
    afterAll(() => shared.dispose());

    describe("execute", () => {
      it("runs a command in the workspace and reports output, exit code and truncation", async () => {
        const native = await shared.fresh();
        const sandbox = toSeedProtocol(native);
        expect(await sandbox.execute("echo hello; pwd")).toEqual({ output: `hello\n${native.workspace}\n`, exitCode: 0, truncated: false });
      });

      it("reports exit codes: explicit, failing command, missing command, killed by a signal", async () => {
        const sandbox = toSeedProtocol(await shared.fresh());
        expect((await sandbox.execute("exit 3")).exitCode).toBe(3);
        expect((await sandbox.execute("false")).exitCode).toBe(1);
        const missing = await sandbox.execute("no-such-command-here");
        expect(missing.exitCode).toBe(127);
        expect(missing.output).toMatch(/not found/);
        expect((await sandbox.execute("kill -9 $$")).exitCode).toBe(137);
      });

      it("combines stdout and stderr in the order they were written", async () => {
        const sandbox = toSeedProtocol(await shared.fresh());
        const result = await sandbox.execute("for i in 1 2 3 4 5; do echo out$i; echo err$i >&2; done");
        expect(result.output).toBe("out1\nerr1\nout2\nerr2\nout3\nerr3\nout4\nerr4\nout5\nerr5\n");
      });

      it("feeds stdin, text or bytes, and gives end-of-file after it", async () => {
        const sandbox = toSeedProtocol(await shared.fresh());
        expect((await sandbox.execute("cat; echo end", { stdin: "line one\nline two\n" })).output).toBe("line one\nline two\nend\n");
        const big = new Uint8Array(3 * 1024 * 1024).fill(120);
        expect((await sandbox.execute("wc -c", { stdin: big })).output.trim()).toBe(String(big.length));
        // Without stdin the command reads end-of-file at once instead of hanging.
        expect((await sandbox.execute("cat; echo none", { timeout: 10 })).output).toBe("none\n");
      });

      it("passes environment variables exactly, the call's over the sandbox's", async () => {
        const base = await shared.fresh();
        const sandbox = toSeedProtocol(await DockerSandbox.attach(base.id, { docker: socket, workspace: base.workspace, env: { A: "from-sandbox", B: "kept" } }));
        const value = `spaces  'quotes' "double" $HOME \`tick\`\nnew line`;
        const result = await sandbox.execute('printf "%s|%s|%s" "$A" "$B" "$ODD"', { env: { A: "from-call", ODD: value } });
        expect(result.output).toBe(`from-call|kept|${value}`);
        await expect(sandbox.execute("true", { env: { "BAD NAME": "x" } })).rejects.toMatchObject({ code: "invalid_argument" });
      });

      it("runs in a virtual cwd; a missing or hostile cwd is a typed error", async () => {
        const native = await shared.fresh();
        const sandbox = toSeedProtocol(native);
        await sandbox.execute("mkdir -p sub/deeper");
        // A cwd is a path in the sandbox's one path space: the workspace's absolute paths, or relative to it.
        expect((await sandbox.execute("pwd", { cwd: `${native.workspace}/sub/deeper` })).output).toBe(`${native.workspace}/sub/deeper\n`);
        expect((await sandbox.execute("pwd", { cwd: "sub/deeper" })).output).toBe(`${native.workspace}/sub/deeper\n`);
        const missing = await rejection(sandbox.execute("pwd", { cwd: `${native.workspace}/nope` }));
        expect(isStrataError(missing, "file_not_found")).toBe(true);
        // The message names the path as the caller gave it, the one the command would have seen.
        expect((missing as Error).message).toBe(`File '${native.workspace}/nope' not found`);
        await expect(sandbox.execute("pwd", { cwd: "/../etc" })).rejects.toMatchObject({ code: "invalid_path" });
        await expect(sandbox.execute("pwd", { cwd: "/etc" })).rejects.toMatchObject({ code: "invalid_path" });
      });

      it("kills the whole process tree at the timeout (exit 124), even a child that left the group", async () => {
        const native = await shared.fresh();
        const sandbox = toSeedProtocol(native);
        const marker = `47${Math.floor(Math.random() * 1e6)}`;
        const started = Date.now();
        const result = await sandbox.execute(`sleep ${marker}1 & setsid sleep ${marker}2 & echo started; sleep ${marker}3`, { timeout: 1 });
        expect(Date.now() - started).toBeLessThan(4000);
        expect(result.exitCode).toBe(124);
        expect(result.output).toMatch(/^started\n\n\[Command timed out after 1 s/);
        expect(await processesInside(native, marker)).toEqual([]);
        expect((await sandbox.execute("echo still-usable")).output).toBe("still-usable\n");
      });

      it("does not wait for a background child that keeps the output open", async () => {
        const native = await shared.fresh();
        const sandbox = toSeedProtocol(native);
        const marker = `58${Math.floor(Math.random() * 1e6)}`;
        const started = Date.now();
        const result = await sandbox.execute(`sleep ${marker} & echo back`);
        // The child sleeps for weeks: any bound proves the answer did not wait for it; a loaded CI machine needs room.
        expect(Date.now() - started).toBeLessThan(5000);
        expect(result).toEqual({ output: "back\n", exitCode: 0, truncated: false });
        expect(await processesInside(native, marker)).toEqual([]);
      });

      it("leaves alone a background process whose output goes elsewhere", async () => {
        const native = await shared.fresh();
        const sandbox = toSeedProtocol(native);
        const marker = `69${Math.floor(Math.random() * 1e6)}`;
        expect((await sandbox.execute(`sleep ${marker} >/dev/null 2>&1 & echo started`)).output).toBe("started\n");
        const [survivor, ...others] = await processesInside(native, marker, 0);
        expect(others).toEqual([]);
        await sandbox.execute(`kill ${survivor!.trim().split(/\s+/)[0]}`);
      });

      it("caps output at the sandbox's limit or the call's, keeping the head", async () => {
        const base = await shared.fresh();
        const sandbox = toSeedProtocol(await DockerSandbox.attach(base.id, { docker: socket, workspace: base.workspace, maxOutputBytes: 1000 }));
        const capped = await sandbox.execute("echo first; head -c 5000 /dev/zero | tr '\\0' y; echo; echo last");
        expect(capped.truncated).toBe(true);
        expect(capped.output).toBe(`first\n${"y".repeat(994)}`);
        expect(capped.exitCode).toBe(0);
        const wider = await sandbox.execute("head -c 3000 /dev/zero | tr '\\0' z", { maxOutputBytes: 4000 });
        expect(wider).toEqual({ output: "z".repeat(3000), exitCode: 0, truncated: false });
      });

      it("stops a command that writes endlessly, past 64 times the limit", async () => {
        const base = await shared.fresh();
        const native = await DockerSandbox.attach(base.id, { docker: socket, workspace: base.workspace, maxOutputBytes: 1024 });
        const sandbox = toSeedProtocol(native);
        const result = await sandbox.execute("yes", { timeout: 60 });
        expect(result.truncated).toBe(true);
        expect(result.output).toMatch(/\[Command killed: it wrote more than 65536 bytes of output\]$/);
        expect(await processesInside(native, " yes")).toEqual([]);
      });

      it("rejects with the abort reason and kills the command when aborted", async () => {
        const native = await shared.fresh();
        const sandbox = toSeedProtocol(native);
        const marker = `81${Math.floor(Math.random() * 1e6)}`;
        const controller = new AbortController();
        setTimeout(() => controller.abort(new Error("stop it")), 300);
        await expect(sandbox.execute(`sleep ${marker}`, { signal: controller.signal })).rejects.toThrow("stop it");
        expect(await processesInside(native, marker)).toEqual([]);
      });

      it("an abort at any moment of a command's start leaves nothing of it running, later either", async () => {
        const native = await shared.fresh();
        const marker = `83${Math.floor(Math.random() * 1e6)}`;
        await abortAtEveryMoment(toSeedProtocol(native), marker, [0, 0, 5, 10, 15, 20, 30, 45, 60, 80]);
        expect(await processesInside(native, marker)).toEqual([]);
      });

      it("has no network, a read-only system and a private writable /tmp", async () => {
        const sandbox = toSeedProtocol(await shared.fresh());
        expect((await sandbox.execute("ls /sys/class/net")).output).toBe("lo\n");
        const result = await sandbox.execute("touch /etc/x 2>/dev/null || echo etc-read-only; touch /tmp/x && echo tmp-ok");
        expect(result.output).toBe("etc-read-only\ntmp-ok\n");
      });
    });

    describe("execute through a reused session (work done as root)", () => {
      /** PIDs of the user's session supervisors (their argv names them), seen from a command. */
      const SUPERVISORS = `for p in /proc/[0-9]*; do case "$({ tr '\\0' ' ' < $p/cmdline; } 2>/dev/null)" in "/bin/sh -c NL="*" strata-session "*) echo \${p#/proc/};; esac; done`;

      it("runs back-to-back commands in one exec, and each still gets its own process group, cwd and environment", async () => {
        const native = await shared.fresh({ permissions: false, user: "0:0" });
        await native.execute("true");
        const before = { ...native.stats };
        const answers = [];
        for (let i = 0; i < 5; i++) answers.push(await native.execute('echo "$X $(pwd)"; read -r _ _ _ _ g _ </proc/$$/stat; echo $g', { env: { X: `n${i}` }, cwd: i % 2 ? native.workspace : undefined }));
        expect(workExecs(native.stats)).toBe(workExecs(before));
        expect(native.stats.sessionRequests - before.sessionRequests).toBe(5);
        const groups = new Set<string>();
        answers.forEach((answer, i) => {
          if ("error" in answer) throw new Error(answer.error?.message);
          const [line, group] = answer.output.trim().split("\n");
          expect(line).toBe(`n${i} ${native.workspace}`);
          groups.add(group!.trim());
        });
        expect(groups.size).toBe(5);
      });

      it("answers a command that kills its session's shell, and the next command runs on a new one", async () => {
        const native = await shared.fresh({ permissions: false, user: "0:0" });
        const sandbox = toSeedProtocol(native);
        await sandbox.execute("true");
        const result = await sandbox.execute(`for p in $(${SUPERVISORS}); do kill -9 $p 2>/dev/null; done; echo after; exit 4`);
        expect(result).toEqual({ output: "after\n", exitCode: 4, truncated: false });
        // Idle sessions killed from outside are replaced too.
        await sandbox.execute("true");
        const other = await DockerSandbox.attach(native.id, { docker: socket, workspace: native.workspace, permissions: false, user: "0:0" });
        await other.execute(`for p in $(${SUPERVISORS}); do kill -9 $p 2>/dev/null; done`);
        expect(await sandbox.execute("echo next")).toEqual({ output: "next\n", exitCode: 0, truncated: false });
        await other.close();
      });

      it("times out a command, kills its group, and the session serves the next command", async () => {
        const native = await shared.fresh({ permissions: false, user: "0:0" });
        const sandbox = toSeedProtocol(native);
        const marker = `91${Math.floor(Math.random() * 1e6)}`;
        const result = await sandbox.execute(`echo started; sleep ${marker}`, { timeout: 1 });
        expect(result.exitCode).toBe(124);
        expect(result.output).toMatch(/^started\n\n\[Command timed out after 1 s/);
        expect(await processesInside(native, marker)).toEqual([]);
        expect(await sandbox.execute("echo fine", { stdin: "ignored" })).toEqual({ output: "fine\n", exitCode: 0, truncated: false });
        // A command killed with stdin unread does not leave its bytes to be read as the next request.
        const killed = await sandbox.execute(`sleep ${marker}`, { stdin: "echo injected\n".repeat(10_000), timeout: 1 });
        expect(killed.exitCode).toBe(124);
        expect(await sandbox.execute("echo clean")).toEqual({ output: "clean\n", exitCode: 0, truncated: false });
      });

      it("ends a command whose background child holds the output, and leaves the child's output out of the next command", async () => {
        const native = await shared.fresh({ permissions: false, user: "0:0" });
        const sandbox = toSeedProtocol(native);
        const marker = `92${Math.floor(Math.random() * 1e6)}`;
        // The child speaks 1.5 s in: after the first command's answer even on a loaded machine, and during the second.
        const first = await sandbox.execute(`(sleep 1.5; echo late; sleep ${marker}) & echo now`);
        expect(first).toEqual({ output: "now\n", exitCode: 0, truncated: false });
        expect((await sandbox.execute("sleep 3; echo second")).output).toBe("second\n");
        expect(await processesInside(native, marker)).toEqual([]);
      });

      it("runs concurrent commands side by side, each answered with its own output", async () => {
        const native = await shared.fresh({ permissions: false, user: "0:0" });
        const started = Date.now();
        const answers = await Promise.all(
          Array.from({ length: 12 }, (_, i) => native.execute(`sleep 1; head -c ${1000 + i} /dev/zero | tr '\\0' ${String.fromCharCode(97 + i)}; exit ${i}`)),
        );
        expect(Date.now() - started).toBeLessThan(8000);
        answers.forEach((answer, i) => {
          if ("error" in answer) throw new Error(answer.error?.message);
          expect(answer).toEqual({ output: String.fromCharCode(97 + i).repeat(1000 + i), exitCode: i, truncated: false });
        });
      });

      it("a leftover of an unprivileged user's commands cannot inject requests into any session (root's also runs that user's commands)", async () => {
        const native = await shared.fresh();
        await native.execute("true");
        // A leftover tries every session shell it can find, as the reviewer's attack on a session of the user did.
        const attack = await native.execute(
          `(sleep 1; for p in $(${SUPERVISORS}); do printf '%s\\n' 'Lecho INJECTED > /tmp/inj; echo() { command echo FORGED; }' > /proc/$p/fd/0 && echo "wrote $p" >> /tmp/wrote; done) >/dev/null 2>&1 </dev/null & echo started`,
        );
        expect(attack.output).toBe("started\n");
        await new Promise((resolve) => setTimeout(resolve, 2000));
        expect(await native.execute("cat /tmp/inj /tmp/wrote 2>/dev/null; echo real output")).toMatchObject({ output: "real output\n" });
        // No session runs as the user: the user's commands run on root's, dropped per request, or take an exec each.
        const users = await native.execute(`for p in $(${SUPERVISORS}); do stat -c %u /proc/$p; done | sort -u`);
        expect(users).toMatchObject({ output: expect.stringMatching(/^(0\n)?$/) });
      });
    });

    describe("files", () => {
      it("edits in one round trip a file it read or wrote, and never applies an edit to a stale copy", async () => {
        const native = await shared.fresh({ permissions: false });
        const path = `${native.workspace}/notes.txt`;
        expect((await native.write(path, "alpha\nbeta\n")).error).toBeUndefined();
        const trips = () => workTrips(native.stats);
        let before = trips();
        expect(await native.edit(path, "alpha", "ALPHA")).toMatchObject({ occurrences: 1 });
        expect(trips() - before).toBe(1);
        // Another writer changes the file behind this sandbox's back: the swap refuses the stale copy, the edit fetches.
        const other = await DockerSandbox.attach(native.id, { docker: socket, workspace: native.workspace, permissions: false });
        expect((await other.write(path, "ALPHA\nbeta\ngamma\n", { overwrite: true })).error).toBeUndefined();
        before = trips();
        expect(await native.edit(path, "beta", "BETA")).toMatchObject({ occurrences: 1 });
        expect(trips() - before).toBe(3);
        expect((await other.readRaw(path)).data?.content).toBe("ALPHA\nBETA\ngamma\n");
        // A stale copy where the text is gone does not answer for the file: the file as it is does.
        expect((await other.write(path, "delta\n", { overwrite: true })).error).toBeUndefined();
        await native.read(path);
        expect((await other.write(path, "delta epsilon\n", { overwrite: true })).error).toBeUndefined();
        expect(await native.edit(path, "epsilon", "E")).toMatchObject({ occurrences: 1 });
        expect((await other.readRaw(path)).data?.content).toBe("delta E\n");
        await other.close();
      });

      it("deletes a file in one round trip under the secrets rules, and checks a directory's tree from the same trip", async () => {
        const native = await shared.fresh();
        const ws = native.workspace;
        const trips = () => workTrips(native.stats);
        await native.uploadFiles([
          [`${ws}/d/plain.txt`, bytes("x")],
          [`${ws}/d/sub dir/line\nbreak.txt`, bytes("y")],
          [`${ws}/locked/keep.txt`, bytes("k")],
          [`${ws}/target/t.txt`, bytes("t")],
        ]);
        // The rules refuse to write a secret; a command may.
        expect((await native.execute(`mkdir ${ws}/locked/deep && echo S=1 > ${ws}/locked/deep/.env && ln -s target ${ws}/link && ln -s nowhere ${ws}/dangling`)).exitCode).toBe(0);
        let before = trips();
        expect(await native.delete(`${ws}/d/plain.txt`)).toEqual({ path: `${ws}/d/plain.txt`, filesUpdate: null });
        expect(trips() - before).toBe(1);
        expect((await native.delete(`${ws}/d/plain.txt`)).error?.code).toBe("file_not_found");
        // A link goes as a link, in one trip, whatever it points at; the directory it names stays.
        before = trips();
        expect((await native.delete(`${ws}/link`)).error).toBeUndefined();
        expect((await native.delete(`${ws}/dangling`)).error).toBeUndefined();
        expect(trips() - before).toBe(2);
        expect((await native.ls(`${ws}/target`)).entries?.map((e) => e.path)).toEqual([`${ws}/target/t.txt`]);
        // A directory holding a secret: refused as a whole, nothing removed; the listing came with the first trip.
        before = trips();
        expect((await native.delete(`${ws}/locked`)).error?.code).toBe("permission_denied");
        expect(trips() - before).toBe(1);
        expect((await native.execute(`ls -A ${ws}/locked ${ws}/locked/deep`)).output).toContain(".env");
        // A directory without one (a name with a newline inside): one trip, find met no name a rule could refuse.
        before = trips();
        expect((await native.delete(`${ws}/d`)).error).toBeUndefined();
        expect(trips() - before).toBe(1);
        expect((await native.ls(ws)).entries?.map((e) => e.path)).toEqual([`${ws}/locked/`, `${ws}/target/`]);
        // A subdirectory the user cannot enter (it may hide a secret): find cannot see it all, so the tree comes back to be checked
        // and a second trip deletes (which cannot remove what the user cannot reach).
        expect((await native.execute(`mkdir -p ${ws}/t2/closed && touch ${ws}/t2/a.txt ${ws}/t2/closed/.env && chmod 0 ${ws}/t2/closed`)).exitCode).toBe(0);
        before = trips();
        expect((await native.delete(`${ws}/t2`)).error?.code).toBe("permission_denied");
        expect(trips() - before).toBe(2);
        await native.execute(`chmod 700 ${ws}/t2/closed`);
        expect((await native.execute(`ls -A ${ws}/t2/closed`)).output).toBe(".env\n");
      });

      it("deletes a directory in two trips where a rule that could refuse it ends in `**`: listed, checked, then deleted", async () => {
        const native = await shared.fresh({ permissions: { rules: [{ action: "deny", operations: "delete", paths: "**/keep/**" }] } });
        const ws = native.workspace;
        const trips = () => workTrips(native.stats);
        await native.uploadFiles([
          [`${ws}/a/one.txt`, bytes("1")],
          [`${ws}/b/keep/two.txt`, bytes("2")],
        ]);
        let before = trips();
        expect((await native.delete(`${ws}/a`)).error).toBeUndefined();
        expect(trips() - before).toBe(2);
        before = trips();
        expect((await native.delete(`${ws}/b`)).error?.code).toBe("permission_denied");
        expect(trips() - before).toBe(1);
        expect((await native.execute(`ls ${ws}/b/keep`)).output).toBe("two.txt\n");
      });

      it("lists and globs with find's -printf where it has one, as stat would: links followed by ls, odd names, empty results", async () => {
        const native = await shared.fresh({ permissions: false });
        const ws = native.workspace;
        await native.uploadFiles([
          [`${ws}/a/one.txt`, bytes("1")],
          [`${ws}/a/sp ace.txt`, bytes("22")],
          [`${ws}/a/new\nline.txt`, bytes("333")],
          [`${ws}/a/sub/two.txt`, bytes("4444")],
        ]);
        expect((await native.execute(`cd ${ws}/a && ln -s one.txt l-file && ln -s sub l-dir && ln -s nowhere l-none && mkdir empty`)).exitCode).toBe(0);
        for (let round = 0; round < 2; round++) {
          // The first round may probe find; the second uses what the sandbox learned.
          const listed = (await native.ls(`${ws}/a`)).entries!;
          expect(listed.map((e) => [e.path, e.is_dir, e.size])).toEqual([
            [`${ws}/a/empty/`, true, undefined],
            [`${ws}/a/l-dir/`, true, undefined],
            [`${ws}/a/l-file`, false, 1],
            [`${ws}/a/l-none`, false, undefined],
            [`${ws}/a/new\nline.txt`, false, 3],
            [`${ws}/a/one.txt`, false, 1],
            [`${ws}/a/sp ace.txt`, false, 2],
            [`${ws}/a/sub/`, true, undefined],
          ]);
          expect(listed.find((e) => e.path.endsWith("one.txt"))?.modified_at).toMatch(/^\d{4}-\d\d-\d\dT/);
          const globbed = (await native.glob("**/*.txt", { path: `${ws}/a` })).entries!;
          expect(globbed.map((e) => [e.path, e.size])).toEqual([
            [`${ws}/a/new\nline.txt`, 3],
            [`${ws}/a/one.txt`, 1],
            [`${ws}/a/sp ace.txt`, 2],
            [`${ws}/a/sub/two.txt`, 4],
          ]);
          expect((await native.glob("**/*.md", { path: `${ws}/a` })).entries).toEqual([]);
          expect((await native.ls(`${ws}/a/empty`)).entries).toEqual([]);
        }
      });

      it("greps and reads exactly on the quick paths: binary files, text that is not UTF-8, a literal U+FFFD, odd names, CRLF, big files", async () => {
        const native = await shared.fresh({ permissions: false });
        const ws = native.workspace;
        const latin1 = Uint8Array.from([...bytes("needle here\nvalue "), 0xe9, 0xff, 0x0a]);
        const big = `${"z".repeat(1024 * 1024)}\nneedle at the end\n`;
        await native.uploadFiles([
          [`${ws}/t/nul.bin`, Uint8Array.from([...bytes("needle\n"), 0, 1, 2, 0x0a])],
          [`${ws}/t/latin1.txt`, latin1],
          [`${ws}/t/fffd.txt`, bytes("needle \uFFFD replacement\n")],
          [`${ws}/t/sp ace/new\nline.txt`, bytes("x\nneedle in an odd name\n")],
          [`${ws}/t/crlf.txt`, bytes("needle\r\nno\r\nneedle\r")],
          [`${ws}/t/big.txt`, bytes(big)],
          [`${ws}/t/plain.txt`, bytes("needle\n")],
        ]);
        for (let round = 0; round < 2; round++) {
          // The first round probes the sandbox's tools; the second uses what it learned.
          expect((await native.grep("needle", { path: `${ws}/t` })).matches).toEqual([
            { path: `${ws}/t/big.txt`, line: 2, text: "needle at the end" },
            { path: `${ws}/t/crlf.txt`, line: 1, text: "needle" },
            { path: `${ws}/t/crlf.txt`, line: 3, text: "needle\r" },
            { path: `${ws}/t/fffd.txt`, line: 1, text: "needle \uFFFD replacement" },
            { path: `${ws}/t/plain.txt`, line: 1, text: "needle" },
            { path: `${ws}/t/sp ace/new\nline.txt`, line: 2, text: "needle in an odd name" },
          ]);
          expect((await native.grep("absent", { path: `${ws}/t` })).matches).toEqual([]);
          expect((await native.grep("needle", { path: `${ws}/t/nowhere` })).matches).toEqual([]);
          expect(await native.read(`${ws}/t/fffd.txt`)).toMatchObject({ encoding: "utf-8", content: "needle \uFFFD replacement" });
          expect(await native.read(`${ws}/t/latin1.txt`)).toMatchObject({ encoding: "binary", content: latin1 });
          expect(await native.read(`${ws}/t/nul.bin`)).toMatchObject({ encoding: "binary", size: 11 });
          expect(await native.read(`${ws}/t/crlf.txt`)).toMatchObject({ encoding: "utf-8", content: "needle\nno\nneedle\r", totalLines: 3 });
          expect(await native.read(`${ws}/t/big.txt`, { offset: 1, limit: 1 })).toMatchObject({ content: "needle at the end", totalLines: 2 });
          expect((await native.read(`${ws}/t/sp ace/new\nline.txt`)).error).toBeUndefined();
          expect((await native.read(`${ws}/t/missing.txt`)).error?.code).toBe("file_not_found");
          expect((await native.read(`${ws}/t`)).error?.code).toBe("is_directory");
        }
      });

      it("greps in one request when the answer is UTF-8: NUL early, late or doubled at the end, odd names, CRLF, big files", async () => {
        const native = await shared.fresh({ permissions: false });
        const ws = native.workspace;
        await native.uploadFiles([
          [`${ws}/g/nul.bin`, Uint8Array.from([...bytes("needle\n"), 0, 1, 2, 0x0a])],
          [`${ws}/g/nul-first.bin`, Uint8Array.from([0, ...bytes("needle\n")])],
          [`${ws}/g/nul-late.bin`, Uint8Array.from([...bytes(`needle\n${"x".repeat(200_000)}`), 0, ...bytes("tail\n")])],
          [`${ws}/g/nul-end.bin`, Uint8Array.from([...bytes("needle"), 0, 0])],
          [`${ws}/g/sp ace/new\nline.txt`, bytes("x\nneedle in an odd name\n")],
          [`${ws}/g/crlf.txt`, bytes("needle\r\nno\r\nneedle\r")],
          [`${ws}/g/big.txt`, bytes(`${"z".repeat(1024 * 1024)}\nneedle at the end\n`)],
          [`${ws}/g/ü.txt`, bytes("ü needle 🚀")],
          [`${ws}/g/none.txt`, bytes("hay\n")],
          [`${ws}/g/ctl\u0001name.txt`, bytes("needle")],
        ]);
        // Internal names (a write's temporary file, a lock) are never searched; a link below the root is not followed.
        const prepared = await native.execute("mkdir -p g/.strata-tmp-abc && echo needle > g/.strata-tmp-abc/d.txt && echo needle > g/.strata-lock-x && ln -s crlf.txt g/link.txt");
        expect(prepared).toMatchObject({ exitCode: 0 });
        const expected = [
          { path: `${ws}/g/big.txt`, line: 2, text: "needle at the end" },
          { path: `${ws}/g/crlf.txt`, line: 1, text: "needle" },
          { path: `${ws}/g/crlf.txt`, line: 3, text: "needle\r" },
          { path: `${ws}/g/ctl\u0001name.txt`, line: 1, text: "needle" },
          { path: `${ws}/g/sp ace/new\nline.txt`, line: 2, text: "needle in an odd name" },
          { path: `${ws}/g/ü.txt`, line: 1, text: "ü needle 🚀" },
        ];
        expect((await native.grep("needle", { path: `${ws}/g` })).matches).toEqual(expected); // probes the sandbox's tools
        const before = workTrips(native.stats);
        expect((await native.grep("needle", { path: `${ws}/g` })).matches).toEqual(expected);
        expect(workTrips(native.stats) - before).toBe(1);
        expect((await native.grep("needle", { path: `${ws}/g/crlf.txt` })).matches).toEqual(expected.slice(1, 3));
        expect((await native.grep("needle", { path: `${ws}/g/link.txt` })).matches).toEqual([
          { path: `${ws}/g/link.txt`, line: 1, text: "needle" },
          { path: `${ws}/g/link.txt`, line: 3, text: "needle\r" },
        ]);
        expect((await native.grep("needle", { path: `${ws}/g`, glob: "**/*.bin" })).matches).toEqual([]);
      });

      it("keeps the quota in the upload's own request: a file that would not fit is refused, a smaller one after it still lands", async () => {
        const native = await shared.fresh({ quota: { maxBytes: 64 * 1024, maxFiles: 3 } });
        const ws = native.workspace;
        const before = { ...native.stats };
        const size = (n: number) => new Uint8Array(n).fill(120);
        const { files } = unwrap(
          await native.uploadFiles([
            [`${ws}/a`, size(40 * 1024)],
            [`${ws}/b`, size(40 * 1024)],
            [`${ws}/c`, size(10)],
            [`${ws}/d`, size(10)],
            [`${ws}/e`, size(10)],
          ]),
        );
        expect(workTrips(native.stats) - workTrips(before)).toBe(1);
        // The workspace is measured first (its own blocks count); each file counts as new: b passes the bytes, e the files.
        expect(files.map((f) => f.error?.code ?? null)).toEqual([null, "quota_exceeded", null, null, "quota_exceeded"]);
        expect((await toSeedProtocol(native).execute("ls; wc -c < a; wc -c < c")).output).toBe("a\nc\nd\n40960\n10\n");
        // The next upload measures what is there now: an overwrite of a still counts as a new file.
        expect(unwrap(await native.uploadFiles([[`${ws}/a`, size(1)]])).files[0]!.error?.code).toBe("quota_exceeded");
        await toSeedProtocol(native).execute("rm d");
        expect(unwrap(await native.uploadFiles([[`${ws}/a`, size(1)]])).files[0]!.error).toBeNull();
      });

      it("keeps the quota across uploads started together: they take turns, so none measures before another lands", async () => {
        const native = await shared.fresh({ quota: { maxFiles: 2003 } });
        const ws = native.workspace;
        // A workspace that takes a moment to measure widens the window between one upload's measure and its write.
        await toSeedProtocol(native).execute("mkdir m && cd m && i=0; while [ $i -lt 2000 ]; do : > f$i; i=$((i + 1)); done");
        // Idle sessions for every upload, so they could start together rather than as each new exec comes up.
        await Promise.all(Array.from({ length: 8 }, () => toSeedProtocol(native).execute("sleep 0.3")));
        const answers = await Promise.all(Array.from({ length: 8 }, (_, i) => native.uploadFiles([[`${ws}/f${i}`, new Uint8Array(10).fill(120)]])));
        const accepted = answers.filter((a) => unwrap(a).files[0]!.error === null).length;
        const count = Number((await toSeedProtocol(native).execute("find . -type f | wc -l")).output.trim());
        expect({ accepted, count }).toEqual({ accepted: 3, count: 2003 });
      });

      it("uploads 1000 files in one request and downloads them in one more, never through the archive API", async () => {
        const native = await shared.fresh({ quota: false });
        const sandbox = toSeedProtocol(native);
        const files = Array.from({ length: 1000 }, (_, i) => [`${native.workspace}/batch/d${i % 10}/file-${i}.txt`, bytes(`content ${i}\n`)] as const);
        const before = { ...native.stats };
        const responses = await sandbox.uploadFiles(files);
        expect(workTrips(native.stats) - workTrips(before)).toBe(1);
        expect(responses).toEqual(files.map(([path]) => ({ path, error: null })));
        expect((await sandbox.execute("find batch -type f | wc -l")).output.trim()).toBe("1000");
        const trips = workTrips(native.stats);
        const downloaded = await sandbox.downloadFiles(files.map(([path]) => path));
        expect(workTrips(native.stats) - trips).toBe(1);
        expect(downloaded.every((r, i) => r.error === null && text(r.content) === `content ${i}\n`)).toBe(true);
        expect(native.stats.putArchives + native.stats.getArchives).toBe(0);
      });

      it("answers a mixed batch per item, in order, and never replaces a directory", async () => {
        const native = await shared.fresh();
        const sandbox = toSeedProtocol(native);
        const ws = native.workspace;
        await sandbox.uploadFiles([
          [`${ws}/dir/inside.txt`, bytes("keep me")],
          [`${ws}/plain.txt`, bytes("a file")],
        ]);
        const responses = await sandbox.uploadFiles([
          [`${ws}/ok-1.txt`, bytes("one")],
          [`${ws}/dir`, bytes("would clobber a directory")],
          [`${ws}/../escape.txt`, bytes("no")],
          [`${ws}/plain.txt/child.txt`, bytes("under a file")],
          [ws, bytes("the workspace itself")],
          ["/outside.txt", bytes("outside the workspace")],
          [`${ws}/ok-2.txt`, bytes("two")],
        ]);
        expect(responses).toEqual([
          { path: `${ws}/ok-1.txt`, error: null },
          { path: `${ws}/dir`, error: "is_directory" },
          { path: `${ws}/../escape.txt`, error: "invalid_path" },
          { path: `${ws}/plain.txt/child.txt`, error: "invalid_path" },
          { path: ws, error: "is_directory" },
          { path: "/outside.txt", error: "invalid_path" },
          { path: `${ws}/ok-2.txt`, error: null },
        ]);
        const back = await sandbox.downloadFiles([`${ws}/dir/inside.txt`, `${ws}/plain.txt`, `${ws}/ok-1.txt`, `${ws}/ok-2.txt`]);
        expect(back.map((r) => text(r.content))).toEqual(["keep me", "a file", "one", "two"]);
      });

      it("round-trips every byte value and overwrites on upload", async () => {
        const native = await shared.fresh();
        const sandbox = toSeedProtocol(native);
        const path = `${native.workspace}/bin.dat`;
        const all = Uint8Array.from({ length: 256 * 4 }, (_, i) => i % 256);
        await sandbox.uploadFiles([[path, bytes("old")]]);
        expect(await sandbox.uploadFiles([[path, all]])).toEqual([{ path, error: null }]);
        const [back] = await sandbox.downloadFiles([path]);
        expect(back!.content).toEqual(all);
        expect((await sandbox.execute("wc -c < bin.dat")).output.trim()).toBe("1024");
      });

      it("downloads: missing, directory, under a file, hostile path, and follows a symlink", async () => {
        const native = await shared.fresh();
        const sandbox = toSeedProtocol(native);
        const ws = native.workspace;
        await sandbox.uploadFiles([[`${ws}/real/target.txt`, bytes("through the link")]]);
        await sandbox.execute("ln -s real/target.txt link.txt && ln -s real linkdir");
        const responses = await sandbox.downloadFiles([
          `${ws}/missing.txt`,
          `${ws}/real`,
          `${ws}/real/target.txt/x`,
          `${ws}/a/../b`,
          `${ws}/link.txt`,
          `${ws}/linkdir/target.txt`,
        ]);
        expect(responses.map((r) => [r.path, r.error])).toEqual([
          [`${ws}/missing.txt`, "file_not_found"],
          [`${ws}/real`, "is_directory"],
          [`${ws}/real/target.txt/x`, "file_not_found"],
          [`${ws}/a/../b`, "invalid_path"],
          [`${ws}/link.txt`, null],
          [`${ws}/linkdir/target.txt`, null],
        ]);
        expect(text(responses[4]!.content)).toBe("through the link");
        expect(text(responses[5]!.content)).toBe("through the link");
        // One path at a time gets the same answers.
        for (const [i, response] of responses.entries()) {
          if (i === 3) continue;
          const [single] = await sandbox.downloadFiles([response.path]);
          expect(single).toEqual(response);
        }
      });

      it("serves the derived file operations from the same workspace", async () => {
        const native = await shared.fresh();
        const sandbox = toSeedProtocol(native);
        const ws = native.workspace;
        expect(await sandbox.write(`${ws}/notes/a.md`, "alpha\nbeta\n")).toMatchObject({ path: `${ws}/notes/a.md` });
        expect((await sandbox.execute("cat notes/a.md")).output).toBe("alpha\nbeta\n");
        expect((await sandbox.execute(`cat ${ws}/notes/a.md`)).output).toBe("alpha\nbeta\n");
        expect(await sandbox.edit(`${ws}/notes/a.md`, "beta", "gamma")).toMatchObject({ occurrences: 1 });
        expect((await sandbox.grep("gamma")).matches).toEqual([{ path: `${ws}/notes/a.md`, line: 2, text: "gamma" }]);
        expect(await sandbox.lsInfo(ws)).toEqual([{ path: `${ws}/notes/`, is_dir: true }]);
      });

      it("shares one path space between files and commands: the seeds' example, and invalid_path outside /workspace", async () => {
        // A container of its own, on the default workspace, as the seeds' example has it.
        const native = await DockerSandbox.create({ image, docker: socket, labels: TEST_LABELS });
        try {
          await expectOnePathSpace(native);
        } finally {
          await native.close();
        }
      });
    });

    describe("lifecycle", () => {
      it("reattaches to the container by id and sees the same files", async () => {
        const first = await shared.fresh();
        await toSeedProtocol(first).uploadFiles([[`${first.workspace}/kept.txt`, bytes("still here")]]);
        const again = await DockerSandbox.attach(first.id, { docker: socket, workspace: first.workspace });
        expect(again.id).toBe(first.id);
        expect(again.workspace).toBe(first.workspace);
        expect(text((await toSeedProtocol(again).downloadFiles([`${again.workspace}/kept.txt`]))[0]!.content)).toBe("still here");
        await first.close();
        // Closing an attached sandbox leaves the container running for the others.
        expect((await toSeedProtocol(again).execute("cat kept.txt")).output).toBe("still here");
      });

      it("fails every operation with sandbox_closed after close, and close is idempotent", async () => {
        const native = await shared.fresh();
        const sandbox = toSeedProtocol(native);
        await native.close();
        await native.close();
        await expect(sandbox.execute("echo hi")).rejects.toMatchObject({ code: "sandbox_closed" });
        // Transfers answer per item, as they always do.
        const path = `${native.workspace}/a`;
        expect(await sandbox.uploadFiles([[path, bytes("x")]])).toEqual([{ path, error: "permission_denied" }]);
        expect(await sandbox.downloadFiles([path])).toEqual([{ path, content: null, error: "permission_denied" }]);
        await expect(sandbox.lsInfo(native.workspace)).rejects.toMatchObject({ code: "sandbox_closed" });
      });

      it("creates a container with the limits asked for and removes it (and its volume) on close", async () => {
        const sandbox = await DockerSandbox.create({ image, docker: socket, labels: TEST_LABELS, memoryMb: 300, cpus: 0.5, maxProcesses: 99 });
        const docker = new Docker({ socketPath: socket });
        const info = await docker.getContainer(sandbox.id).inspect();
        expect(info.HostConfig).toMatchObject({ Memory: 300 * 1024 * 1024, NanoCpus: 5e8, PidsLimit: 99, NetworkMode: "none", ReadonlyRootfs: true });
        expect(info.Config.Labels).toMatchObject({ "strata.sandbox": "docker", "strata.test": "1" });
        const volumes = info.Mounts.filter((mount) => mount.Destination === "/workspace").map((mount) => mount.Name);
        expect(volumes).toHaveLength(1);
        await sandbox.close();
        await expect(docker.getContainer(sandbox.id).inspect()).rejects.toMatchObject({ statusCode: 404 });
        await expect(docker.getVolume(volumes[0]!).inspect()).rejects.toMatchObject({ statusCode: 404 });
      });
    });
  });
}

describe("DockerSandbox errors", () => {
  it("reports a missing image as unavailable", async () => {
    const error = await rejection(DockerSandbox.create({ image: `strata-test/missing-${randomUUID()}`, docker: socket, labels: TEST_LABELS }));
    expect(isStrataError(error, "unavailable")).toBe(true);
    expect((error as Error).message).toMatch(/image .* is not present/);
  });

  it("reports an unreachable daemon as unavailable, without naming the socket", async () => {
    const nowhere = `/tmp/strata-no-daemon-${randomUUID()}.sock`;
    const error = await rejection(DockerSandbox.create({ image: images.busybox, docker: nowhere }));
    expect(isStrataError(error, "unavailable")).toBe(true);
    expect((error as Error).message).not.toContain(nowhere);
  });

  it("reports a container that is gone as unavailable", async () => {
    await expect(DockerSandbox.attach(`strata-missing-${randomUUID()}`, { docker: socket })).rejects.toMatchObject({ code: "unavailable" });
    const native = await DockerSandbox.create({ image: images.busybox, docker: socket, labels: TEST_LABELS });
    const sandbox = toSeedProtocol(native);
    await new Docker({ socketPath: socket }).getContainer(native.id).remove({ force: true, v: true });
    await expect(sandbox.execute("echo hi")).rejects.toMatchObject({ code: "unavailable" });
    await native.close();
  });
});
