/**
 * BubblewrapSandbox's warm path: one long-lived supervisor, a POSIX `sh`
 * loop started once inside the sandbox's bwrap namespaces and cgroups, and a
 * resident shell per slot forked from it, which starts each command on
 * request, so a command pays a fork of a small shell and one exec, not a
 * bwrap start and not a Node spawn.
 *
 * A slot is a set of files in a control directory this process owns,
 * mounted read-only at /dev/.strata: `s<slot>` (the command, its working
 * directory and environment, as a script Node writes), `o<slot>`, `e<slot>`
 * and `i<slot>` (FIFOs for stdout, stderr and stdin, which Node opens
 * without blocking and reads through libuv, as it reads a child's pipes),
 * `g<slot>` (the requests: a FIFO only this process can write) and
 * `cg/s<slot>`, a pids cgroup of its own under the sandbox's.
 *
 * The protocol. The first time a slot is used, Node asks the supervisor on
 * its stdin for the slot's resident (`n <slot>`); the supervisor forks it
 * and reports its pid (`h <slot> <pid>`). This process finds that pid's host
 * pid among the members of the supervisor's own cgroup, writes it to the
 * slot's `tasks` (once per slot: a move of another process waits for an RCU
 * grace period, up to ~10 ms on a busy machine), and from then on writes the
 * slot's requests to `g<slot>` (`r i` or `r -`: with stdin or without). The
 * resident reports each command accepted (`a <slot>`) and ended (`x <slot>
 * <status>`) on the supervisor's stdout, the event channel.
 *
 * Every `tasks` file is root's, so nothing in the sandbox can move itself
 * into another cgroup (into a slot of another command still running, to
 * outlive its own), and everything a command starts stays in its slot (a
 * `setsid` or double-forked escapee included: cgroup membership is
 * inherited and only a write to a cgroup's `tasks` or `cgroup.procs`
 * changes it). When the command's shell ends, or its timeout, abort or
 * output cap fires, this process kills every process in that cgroup but the
 * resident from the host, so nothing the command started survives it, as
 * with a bwrap per command. A slot whose resident is gone, or whose command's
 * status was lost, is killed whole and not used again. The environment is
 * applied in the command's own process, right before its exec, so a
 * caller's LD_PRELOAD reaches the command alone, never a resident.
 *
 * The supervisor's crash (or its fork failing under a fork bomb, which ends
 * a non-interactive shell) ends its bwrap and everything in it: commands it
 * had not accepted are run again on a new supervisor, transparently; those
 * it had accepted answer exit 137 with a note.
 */
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { chownSync, closeSync, constants as fsConstants, ftruncateSync, mkdirSync, openSync, readFileSync, rmSync, writeSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import { Socket } from "node:net";
import nodePath from "node:path";
import { randomBytes } from "node:crypto";
import { StrataError } from "../core/errors.js";
import type { ExecuteResponse } from "../core/types.js";
import { SANDBOX_DEFAULTS } from "./defaults.js";
import { LAUNCHER_ENV, supportDir, writePrivateFile } from "./bubblewrap-host.js";
import { feedStdin, type ProcessRun } from "./process.js";
import { OutputCollector, TIMEOUT_EXIT_CODE, timeoutMessage } from "./output.js";
import { shellQuote } from "./shell.js";
import { removeCgroup } from "./cgroups.js";

/** Where the control directory appears inside the sandbox (not in `ls /`). */
export const CONTROL_INSIDE = "/dev/.strata";
/** Slots made at once (three FIFOs and a script each); more are made when every one is busy. */
const SLOT_BATCH = 16;
/** How long the output FIFOs may stay open after the command's namespace ended (only a holder outside it). */
const PIPE_DEADLINE_MS = 1_000;
/** How often a running command's slot is checked for a resident gone or a status lost (two checks in a row decide). */
const WATCH_EVERY_MS = 1_000;
/** How long a resident may leave a request untaken before its slot is killed (a resident stopped by a command of the sandbox). */
const ACCEPT_TIMEOUT_MS = 5_000;
/** How long a supervisor may take to say it is ready. */
const START_TIMEOUT_MS = 10_000;

/**
 * The supervisor. $1: CPU seconds per command, or "-". fd 3 is the event
 * channel (the supervisor's stdout); stdout itself goes to /dev/null so
 * nothing else can write into the protocol. On `n <slot>` it forks the
 * slot's resident and reports its pid. The resident reads its requests from
 * its gate FIFO, which only the host writes, and only once the resident is in
 * its slot's cgroup; for each it
 * opens the slot's stdin FIFO and reports acceptance, opens the output
 * FIFOs, forks the command, waits, closes its copies of the FIFOs and
 * reports the status. The command's own subshell takes its stdio through
 * `exec` (an asynchronous command's stdin would otherwise be /dev/null)
 * without fd 3 or the gate, sources the slot's script and execs the command.
 */
const SUPERVISOR_SCRIPT = `exec 3>&1 >/dev/null
c=${CONTROL_INSIDE}; t=$1
echo ready >&3
while read -r op k; do
  [ "$op" = n ] || continue
  (
    exec 7<"$c/g$k" </dev/null
    while read -r op p <&7; do
      [ "$op" = r ] || continue
      if [ "$p" = i ]; then exec 4<"$c/i$k"; else exec 4</dev/null; fi
      echo "a $k" >&3
      exec 5>"$c/o$k" 6>"$c/e$k"
      (
        exec <&4 >&5 2>&6 3>&- 4<&- 5>&- 6>&- 7<&-
        [ "$t" = - ] || ulimit -t "$t"
        . "$c/s$k"
        exec /bin/sh -c "$cmd"
      ) &
      wait $!
      s=$?
      exec 4<&- 5>&- 6>&-
      echo "x $k $s" >&3
    done
  ) &
  echo "h $k $!" >&3
done`;

/** What the warm path cannot carry, so the command takes the cold path: a name `sh` cannot export, an argument over Linux's limit. */
export function warmable(command: string, env: Record<string, string>): boolean {
  if (Buffer.byteLength(command) > 128 * 1024) return false;
  for (const [name, value] of Object.entries(env)) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name) || Buffer.byteLength(name) + Buffer.byteLength(value) + 1 > 128 * 1024) return false;
  }
  return true;
}

/** The slot script: the working directory, the whole environment, the command (all single-quoted). */
export function slotScript(command: string, cwd: string, env: Record<string, string>): string {
  const lines = [`cd -- ${shellQuote(cwd)} || exit 1`, "unset OLDPWD"];
  for (const [name, value] of Object.entries(env)) lines.push(`export ${name}=${shellQuote(value)}`);
  lines.push(`cmd=${shellQuote(command)}`, "");
  return lines.join("\n");
}

export interface SupervisorStart {
  /** Sandbox id, for names. */
  id: string;
  /** bwrap's namespace and mount arguments (the sandbox's own), before the control directory and masks. */
  args: string[];
  /** Extra bwrap arguments after the control directory's mount (the masks). */
  masks: string[];
  /** cgroup directories the launcher joins. */
  cgroups: string[];
  /** The sandbox's pids cgroup: each supervisor makes its slots' cgroups under it. */
  pidsCgroup: string;
  /** argv in front of bwrap's arguments: setpriv, prlimit (without --cpu), bwrap. */
  launcher: string[];
  /** The launcher script (BubblewrapSandbox's). */
  launcherScript: string;
  cpuSeconds: number | undefined;
  /** The host user commands run as (files they must open are handed to it), or undefined when this process is not root. */
  user: { uid: number; gid: number } | undefined;
}

/** One command for a supervisor: the slot script plus runProcess's I/O options. */
export interface WarmRun extends Pick<ProcessRun, "stdin" | "timeout" | "maxOutputBytes" | "killAfterBytes" | "onOutput" | "onData" | "signal"> {
  script: string;
}

/** A supervisor ended before it accepted the command: run it again elsewhere. */
export class NotAccepted extends Error {}

interface Pending {
  accepted: boolean;
  /** Called once it is accepted: its stdin FIFO is open at both ends, so input may flow (and end). */
  accept: () => void;
  ended: (status: number) => void;
  gone: () => void;
}

export class Supervisor {
  private readonly child: ChildProcess;
  private readonly control: string;
  /** This supervisor's cgroup on the host (under the sandbox's pids cgroup), parent of its slots'. */
  private readonly cgroup: string;
  private readonly pending = new Map<number, Pending>();
  private readonly free: number[] = [];
  /** Each slot's script file, open for rewriting. */
  private readonly scripts: number[] = [];
  /** Each slot's gate FIFO, open read-write (so the resident's open never waits, and a write never fails for want of a reader). */
  private readonly gates: number[] = [];
  /** Each slot's resident shell, by host pid, once it is in the slot's cgroup. */
  private readonly residents: (number | undefined)[] = [];
  /** Slots whose resident was asked for and has not reported yet: called with its host pid, or undefined. */
  private readonly hatching = new Map<number, (host: number | undefined) => void>();
  private slots = 0;
  private growing: Promise<void> | undefined;
  /** The first slot's resident being made: the first command waits for it rather than make a second. */
  private preparing: Promise<void> | undefined;
  private lines = "";
  /** Resolves true once the supervisor said it is ready, false if it cannot be (then the cold path serves). */
  readonly ready: Promise<boolean>;
  private readyAnswer: ((ok: boolean) => void) | undefined;
  private argsFile: string | undefined;
  private closing: Promise<void> | undefined;
  dead = false;
  private retired = false;

  constructor(private readonly start: SupervisorStart) {
    const name = `${start.id}-${randomBytes(6).toString("hex")}`;
    this.control = nodePath.join(supportDir(), `ctl-${name}`);
    const group = start.user?.gid;
    mkdirSync(this.control, { mode: group === undefined ? 0o700 : 0o750 });
    mkdirSync(nodePath.join(this.control, "cg"));
    if (group !== undefined) chownSync(this.control, 0, group);
    this.cgroup = nodePath.join(start.pidsCgroup, `warm-${randomBytes(6).toString("hex")}`);
    mkdirSync(this.cgroup);
    const args = [...start.args, "--ro-bind", this.control, CONTROL_INSIDE, "--bind", this.cgroup, `${CONTROL_INSIDE}/cg`, ...start.masks];
    this.argsFile = writePrivateFile(`args-${name}`, args.map((arg) => `${arg}\0`).join(""));
    this.ready = new Promise((resolve) => (this.readyAnswer = resolve));
    const bwrapArgs = ["--args", "3", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--chdir", "/"];
    this.child = spawn(
      "/bin/sh",
      [
        "-c",
        start.launcherScript,
        "strata-launcher",
        this.argsFile,
        // The supervisor lives in its own cgroup (under the sandbox's, whose limits hold): where `hatch` looks for a new resident.
        ...start.cgroups.map((dir) => (dir === start.pidsCgroup ? this.cgroup : dir)),
        "--",
        ...start.launcher,
        ...bwrapArgs,
        "/bin/sh",
        "-c",
        SUPERVISOR_SCRIPT,
        "strata-supervisor",
        start.cpuSeconds === undefined ? "-" : String(start.cpuSeconds),
      ],
      { cwd: "/", env: { ...LAUNCHER_ENV }, detached: true, stdio: ["pipe", "pipe", "ignore"] },
    );
    this.child.stdin!.on("error", () => undefined);
    this.child.stdout!.setEncoding("utf8").on("data", (chunk: string) => this.onEvents(chunk));
    this.child.on("error", () => this.onGone());
    this.child.on("close", () => this.onGone());
    const timer = setTimeout(() => this.answerReady(false), START_TIMEOUT_MS);
    void this.ready.then(() => clearTimeout(timer));
    this.grow().catch(() => this.answerReady(false));
  }

  /** No command is running on it. */
  get idle(): boolean {
    return this.pending.size === 0;
  }

  /** Stops taking commands; closes once the running ones end. */
  retire(): void {
    this.retired = true;
    if (this.idle) void this.close();
  }

  /** Kills the supervisor, its bwrap and every command in it; removes its cgroups and files. */
  close(): Promise<void> {
    this.retired = true;
    this.closing ??= (async () => {
      if (!this.dead && this.child.pid !== undefined) {
        try {
          process.kill(-this.child.pid, "SIGKILL");
        } catch {
          // Already gone.
        }
      }
      // Slots being made now would land in a directory being removed.
      await this.growing?.catch(() => undefined);
      if (this.argsFile) rmSync(this.argsFile, { force: true });
      for (const fd of [...this.scripts.splice(0), ...this.gates.splice(0)]) closeSync(fd);
      rmSync(this.control, { recursive: true, force: true, maxRetries: 3 });
      for (let n = 0; n < this.slots; n++) await this.killSlot(n, true);
      for (let n = 0; n < this.slots; n++) await removeCgroup(nodePath.join(this.cgroup, `s${n}`));
      await removeCgroup(this.cgroup);
    })();
    return this.closing;
  }

  private answerReady(ok: boolean): void {
    const answer = this.readyAnswer;
    this.readyAnswer = undefined;
    if (!answer) return;
    answer(ok);
    // The first slot's resident is made now, so the first command does not wait for its move.
    if (ok) this.preparing = this.slot().then((n) => void this.free.push(n), () => undefined).finally(() => (this.preparing = undefined));
    if (!ok) void this.close();
    // bwrap has read its arguments: the file (host paths) can go.
    else if (this.argsFile) {
      rmSync(this.argsFile, { force: true });
      this.argsFile = undefined;
    }
  }

  private onGone(): void {
    if (this.dead) return;
    this.dead = true;
    this.answerReady(false);
    for (const pending of [...this.pending.values()]) pending.gone();
    this.pending.clear();
    for (const hatched of this.hatching.values()) hatched(undefined);
    this.hatching.clear();
    void this.close();
  }

  private onEvents(chunk: string): void {
    this.lines += chunk;
    let end: number;
    while ((end = this.lines.indexOf("\n")) !== -1) {
      const [op, a, b] = this.lines.slice(0, end).split(" ");
      this.lines = this.lines.slice(end + 1);
      if (op === "ready") this.answerReady(true);
      else if (op === "h") void this.hatch(Number(a), Number(b));
      else {
        const pending = this.pending.get(Number(a));
        if (!pending) continue;
        if (op === "a") {
          pending.accepted = true;
          pending.accept();
        } else if (op === "x") pending.ended(Number(b));
      }
    }
  }

  private send(line: string): void {
    if (!this.dead) this.child.stdin!.write(`${line}\n`);
  }

  /**
   * Moves slot `n`'s new resident (`pid` inside the sandbox) into the slot's
   * cgroup. Its host pid is found among the members of the supervisor's own
   * cgroup, the only place a resident not yet moved can be (nothing in the
   * sandbox can move a process there), and only while this side waits for
   * that slot's resident: a forged report can at most move the supervisor or
   * another new resident, which ends this supervisor or that slot.
   */
  private async hatch(n: number, pid: number): Promise<void> {
    const hatched = this.hatching.get(n);
    if (!hatched) return;
    this.hatching.delete(n);
    const host = this.members("").find((candidate) => {
      try {
        // NSpid: the pid in each PID namespace, ours first and the sandbox's last (one field: bwrap, outside it).
        return /^NSpid:\s+\d+(?:\s+\d+)*\s+(\d+)$/m.exec(readFileSync(`/proc/${candidate}/status`, "utf8"))?.[1] === String(pid);
      } catch {
        return false;
      }
    });
    if (host === undefined) return hatched(undefined);
    try {
      // Asynchronous: the move waits for an RCU grace period, which must not stall the event loop.
      await writeFile(nodePath.join(this.cgroup, `s${n}`, "tasks"), String(host));
      this.residents[n] = host;
      hatched(host);
    } catch {
      hatched(undefined);
    }
  }

  /** The host pids in slot `n`'s cgroup, or with "" in the supervisor's own (empty when it has none, or is gone). */
  private members(n: number | ""): number[] {
    try {
      return readFileSync(nodePath.join(this.cgroup, n === "" ? "" : `s${n}`, "cgroup.procs"), "utf8")
        .split("\n")
        .filter((line) => line !== "")
        .map(Number);
    } catch {
      return [];
    }
  }

  /** The processes of slot `n`'s cgroup but its resident: the command's, and what it started. */
  private commandMembers(n: number): number[] {
    return this.members(n).filter((pid) => pid !== this.residents[n]);
  }

  /**
   * Kills every process in slot `n`'s cgroup but its resident (with `all`,
   * the resident too), again until none is left (a process forking
   * meanwhile is caught by the next round; a fork racing SIGKILL fails).
   * Host pids, read from the cgroup: a command cannot leave it, nor name a
   * process outside it.
   */
  private async killSlot(n: number, all = false): Promise<void> {
    for (let round = 0; round < 500; round++) {
      const members = all ? this.members(n) : this.commandMembers(n);
      if (members.length === 0) return;
      for (const pid of members) {
        try {
          process.kill(pid, "SIGKILL");
        } catch {
          // Gone meanwhile.
        }
      }
      await new Promise((resolve) => setTimeout(resolve, round < 10 ? 1 : 10));
    }
  }

  /** Makes SLOT_BATCH more slots: one `mkfifo` for their FIFOs, their scripts, their cgroups. */
  private grow(): Promise<void> {
    this.growing ??= (async () => {
      if (this.retired) throw new NotAccepted();
      const first = this.slots;
      const numbers = Array.from({ length: SLOT_BATCH }, (_, i) => first + i);
      const user = this.start.user;
      const fifos = numbers.flatMap((n) => ["i", "o", "e"].map((kind) => nodePath.join(this.control, `${kind}${n}`)));
      const gates = numbers.map((n) => nodePath.join(this.control, `g${n}`));
      await new Promise<void>((resolve, reject) =>
        execFile("mkfifo", ["-m", user === undefined ? "0600" : "0660", ...fifos], { env: { ...LAUNCHER_ENV } }, (error) =>
          error ? reject(error) : resolve(),
        ),
      );
      const scripts = numbers.map((n) => nodePath.join(this.control, `s${n}`));
      // Kept open and rewritten in place: truncating on open and closing makes ext4 flush the file (2 ms).
      for (const script of scripts) this.scripts.push(openSync(script, "w", user === undefined ? 0o600 : 0o640));
      await new Promise<void>((resolve, reject) =>
        execFile("mkfifo", ["-m", user === undefined ? "0600" : "0640", ...gates], { env: { ...LAUNCHER_ENV } }, (error) => (error ? reject(error) : resolve())),
      );
      // Readable by the sandbox user, writable by this process alone: only the host lets a command start.
      for (const gate of gates) this.gates.push(openSync(gate, fsConstants.O_RDWR | fsConstants.O_NONBLOCK));
      if (user !== undefined) for (const path of [...fifos, ...scripts, ...gates]) chownSync(path, 0, user.gid);
      for (const n of numbers) mkdirSync(nodePath.join(this.cgroup, `s${n}`));
      this.slots += SLOT_BATCH;
      this.free.push(...numbers);
    })().finally(() => (this.growing = undefined));
    return this.growing;
  }

  /**
   * A free slot whose resident is alive, its resident made first when it has
   * none yet (so only as many residents as commands ever ran at once count
   * against the sandbox's process limit). A slot whose resident is gone is
   * emptied and left unused.
   */
  private async slot(): Promise<number> {
    for (let made = 0; ; ) {
      const slot = this.free.pop();
      if (slot === undefined) {
        await this.grow();
        continue;
      }
      const resident = this.residents[slot];
      if (resident !== undefined) {
        if (this.members(slot).includes(resident)) return slot;
        void this.killSlot(slot, true);
        continue;
      }
      // A resident that cannot be made twice in a row: this supervisor is failing (a fork bomb, or closing).
      if (made++ === 2 || this.dead || this.retired) {
        this.free.push(slot);
        throw new NotAccepted();
      }
      const hatched = new Promise<number | undefined>((resolve) => {
        this.hatching.set(slot, resolve);
        setTimeout(() => {
          if (this.hatching.get(slot) !== resolve) return;
          this.hatching.delete(slot);
          resolve(undefined);
        }, START_TIMEOUT_MS).unref();
      });
      this.send(`n ${slot}`);
      if ((await hatched) !== undefined) return slot;
      void this.killSlot(slot, true);
    }
  }

  /**
   * Runs one command; answers as runProcess does. Rejects with NotAccepted
   * when the supervisor ended before the command was accepted (it never ran).
   */
  async run(job: WarmRun): Promise<ExecuteResponse> {
    if (job.signal?.aborted) throw job.signal.reason;
    let slot: number;
    try {
      if (this.preparing) await this.preparing;
      slot = await this.slot();
    } catch {
      throw new NotAccepted(); // No slot could be made (closing, or its files failed): another supervisor, or the cold path.
    }
    if (this.dead || this.retired) {
      this.free.push(slot);
      throw new NotAccepted();
    }
    const script = Buffer.from(job.script);
    writeSync(this.scripts[slot]!, script, 0, script.length, 0);
    ftruncateSync(this.scripts[slot]!, script.length);
    const open = (kind: string, flags: number) => openSync(nodePath.join(this.control, `${kind}${slot}`), flags | fsConstants.O_NONBLOCK);
    const fds: number[] = [];
    const hasStdin = job.stdin instanceof ReadableStream || (job.stdin !== undefined && job.stdin.length > 0);
    let input: Socket | undefined;
    try {
      fds.push(open("o", fsConstants.O_RDONLY), open("e", fsConstants.O_RDONLY));
      // Read-write: opening never waits for the command to open its end, and the command sees EOF once this closes.
      if (hasStdin) fds.push(open("i", fsConstants.O_RDWR));
    } catch (error) {
      for (const fd of fds) closeSync(fd);
      this.free.push(slot);
      // The system's message names the control directory's host path: only its code goes on.
      throw new StrataError("io_error", `The warm supervisor could not open a command's pipes (${(error as NodeJS.ErrnoException).code ?? "error"})`);
    }
    const sockets = fds.slice(0, 2).map((fd) => new Socket({ fd, readable: true, writable: false }));
    if (hasStdin) input = new Socket({ fd: fds[2]!, readable: false, writable: true });
    input?.on("error", () => undefined);
    return new Promise<ExecuteResponse>((resolve, reject) => {
      const output = new OutputCollector(job.maxOutputBytes, job.onOutput, job.onData);
      let timedOut = false;
      let overflowed = false;
      let status: number | undefined;
      let openStreams = 2;
      let settled = false;
      let reusable = true;
      let deadline: NodeJS.Timeout | undefined;
      let killing: Promise<void> | undefined;
      let lost = false;
      let notAccepted = false;
      const resident = this.residents[slot]!;
      // The resident reports acceptance and status, and a command can kill or stop it (a process of the same
      // user). A request the resident has not taken by the time its run is killed, or within ACCEPT_TIMEOUT_MS,
      // has its slot killed whole; once the resident is gone (on two checks in a row, so an acceptance it sent
      // before has been read) the command never started (acceptance comes before the fork) and goes to another
      // slot. A command whose output has ended (or whose kill was asked for), with no process left in its
      // slot, has lost its status.
      let suspect = false;
      let waited = 0;
      const watchdog = setInterval(() => {
        if (status !== undefined || this.dead) return;
        let broken: boolean;
        if (pending.accepted) broken = (openStreams === 0 || killing !== undefined) && this.commandMembers(slot).length === 0;
        else {
          broken = !this.members(slot).includes(resident);
          if (!broken && (killing !== undefined || (waited += WATCH_EVERY_MS) >= ACCEPT_TIMEOUT_MS)) void this.killSlot(slot, true);
        }
        if (!broken || !suspect) {
          suspect = broken;
          return;
        }
        reusable = false;
        notAccepted = !pending.accepted;
        lost = !notAccepted;
        openStreams = 0;
        pending.ended(137);
      }, WATCH_EVERY_MS).unref();
      // Until the command has ended, a process it started may still be forking: keep emptying the slot until then.
      const kill = () =>
        (killing ??= (async () => {
          while (status === undefined && !this.dead) {
            await this.killSlot(slot);
            if (status === undefined) await new Promise((resolve) => setTimeout(resolve, 5));
          }
          await this.killSlot(slot);
        })());
      const pending: Pending = {
        accepted: false,
        accept: () => {
          if (input && !settled) feedStdin(job.stdin, input);
        },
        ended: (code) => {
          status = code;
          // What the command left running goes with it; the FIFOs then close (the resident closed its
          // copies before it reported). A holder outside the cgroup (another command's process that
          // opened them) is cut off at the deadline, counted from when the cgroup is empty.
          void kill().then(() => {
            if (settled) return;
            deadline = setTimeout(() => {
              reusable = false;
              openStreams = 0;
              maybeDone();
            }, SANDBOX_DEFAULTS.killGraceMs + PIPE_DEADLINE_MS);
          });
          maybeDone();
        },
        gone: () => {
          if (!pending.accepted) return finish(() => reject(new NotAccepted()));
          status = 137;
          openStreams = 0;
          reusable = false;
          finish(() =>
            resolve({ output: `${output.text()}\n[Command killed: the sandbox's supervisor ended]`, exitCode: 137, truncated: output.truncated }),
          );
        },
      };
      const timer = job.timeout === undefined ? undefined : setTimeout(() => {
        timedOut = true;
        void kill();
      }, job.timeout * 1000);
      const onAbort = () => {
        void kill();
        finish(() => reject(job.signal!.reason));
      };
      job.signal?.addEventListener("abort", onAbort, { once: true });
      const finish = (settle: () => void) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        clearTimeout(deadline);
        job.signal?.removeEventListener("abort", onAbort);
        settle();
        // The slot is free once its command ended and its cgroup holds its resident alone. Until then
        // the FIFOs stay open here: the resident opens them before the command starts, and would wait
        // forever for an end this side had closed. Any other slot is killed whole and left unused.
        const release = async () => {
          await killing;
          clearInterval(watchdog);
          for (const socket of sockets) socket.destroy();
          input?.destroy();
          this.pending.delete(slot);
          const members = this.members(slot);
          if (reusable && !this.dead && members.length === 1 && members[0] === resident) this.free.push(slot);
          else void this.killSlot(slot, true);
          if (this.retired && this.idle) void this.close();
        };
        if (status !== undefined || this.dead) void release();
        else
          pending.ended = (code) => {
            status = code;
            void kill();
            void release();
          };
      };
      const maybeDone = () => {
        if (status === undefined || openStreams > 0) return;
        if (notAccepted && !timedOut) return finish(() => reject(new NotAccepted()));
        finish(() => {
          let text = output.text();
          let exitCode = status!;
          if (timedOut) {
            text += timeoutMessage(job.timeout!);
            exitCode = TIMEOUT_EXIT_CODE;
          } else if (overflowed) {
            text += `\n[Command killed: it wrote more than ${job.killAfterBytes} bytes of output]`;
          } else if (lost) {
            text += "\n[Command ended, but the sandbox's supervisor lost its exit code (a process of the sandbox killed or stopped the shell that waits for it)]";
          }
          resolve({ output: text, exitCode, truncated: output.truncated });
        });
      };
      sockets.forEach((socket, i) => {
        const source = i === 0 ? "stdout" : "stderr";
        socket.on("data", (chunk: Buffer) => {
          if (settled) return;
          output.push(chunk, source);
          if (!overflowed && output.totalBytes > job.killAfterBytes) {
            overflowed = true;
            void kill();
          }
        });
        socket.on("error", () => undefined);
        socket.on("close", () => {
          openStreams--;
          maybeDone();
        });
      });
      this.pending.set(slot, pending);
      // Four bytes to a FIFO this process holds open read-write: never short, never waits.
      writeSync(this.gates[slot]!, input ? "r i\n" : "r -\n");
      // Aborted while a slot was found: the listener came too late to hear it.
      if (job.signal?.aborted) onAbort();
    });
  }
}
