/**
 * What DockerSandbox and SshSandbox share in `execute`. Both reach a shell
 * through a stream (a docker exec, an ssh exec channel) that carries stdout
 * and stderr apart and cannot signal the process (Docker has no exec-kill
 * API; OpenSSH 9.2 ignores the channel "signal" request). So each command
 * runs under a small sh wrapper that
 *  - changes to the working directory, or reports `strata-nocwd`;
 *  - starts the command in a process group of its own, with stderr merged
 *    into stdout, so the combined output keeps its exact order;
 *  - reports the command's process group (`strata-pgid N`) and exit status
 *    (`strata-exit N`) on its own stderr, which carries nothing else.
 * A timeout, an abort or endless output kills that group from a second
 * command (KILL_SCRIPT), together with every process still carrying the
 * run's STRATA_EXEC_ID marker, which catches one that left the group.
 */
import { StrataError, errors } from "../core/errors.js";
import type { ExecuteResponse } from "../core/types.js";
import { SANDBOX_DEFAULTS } from "./defaults.js";
import { OutputCollector, TIMEOUT_EXIT_CODE, timeoutMessage } from "./output.js";
import { nodeCrypto } from "../stores/lazy-builtins.js";

/** Linux's limit on one argv string (MAX_ARG_STRLEN); the command travels as one. */
export const MAX_COMMAND_BYTES = 128 * 1024;
/** Name of the environment variable that marks every process of one run. */
export const MARKER_VARIABLE = "STRATA_EXEC_ID";
/**
 * A sweep's kill leaves `<STOPPED_PREFIX><marker>` behind, and the shell that
 * starts a command (WRAPPER, Docker's USER_START) checks for it before it
 * starts anything: a command whose start was still on its way when it was
 * aborted (the request sent, the process not there yet for the sweep to
 * find) does not start after the kill. /tmp: every user may create there.
 */
export const STOPPED_PREFIX = "/tmp/.strata-stopped-";
/** The check, one line of sh, for a shell whose environment carries the marker. */
export const UNLESS_STOPPED = `[ ! -e "${STOPPED_PREFIX}$${MARKER_VARIABLE}" ] || exit 137`;
/** How long the stream may stay open after a kill before the run is given up on. */
const KILL_DEADLINE_MS = 5_000;

/**
 * `sh -c WRAPPER strata <cwd> <command>`; the command's stdin is the wrapper's.
 * Both transports start the wrapper as a process-group leader (sshd and runc
 * give each session or exec a new session), so the command, a background
 * child of the wrapper, is already in a group of its own: the wrapper's.
 * Only where that is not so (or /proc is missing) is `setsid` run for it.
 */
export const WRAPPER = `${UNLESS_STOPPED}
cd -- "$1" 2>/dev/null || { echo strata-nocwd >&2; exit 1; }
exec 3<&0
if { read -r _ _ _ _ g _ </proc/$$/stat && [ "$g" = "$$" ]; } 2>/dev/null; then
  /bin/sh -c "$2" 0<&3 3<&- 2>&1 &
elif command -v setsid >/dev/null 2>&1; then
  setsid /bin/sh -c "$2" 0<&3 3<&- 2>&1 &
  g=$!
else
  /bin/sh -c "$2" 0<&3 3<&- 2>&1 &
  g=
fi
echo "strata-pgid $g" >&2
wait $! 2>/dev/null
echo "strata-exit $?" >&2`;

/**
 * A sweep kills in rounds, in case a process forks meanwhile (a command just
 * starting is three deep: the wrapper, the command's shell, its first
 * child), and ends after two rounds in a row find nothing.
 * Why the group too, and the second empty round: a process in the middle of
 * an exec shows an empty /proc/PID/environ for a moment, so a sweep can miss
 * the command's shell while it starts. Killing each found process's group
 * (the wrapper leads the command's) takes it anyway; the second round
 * catches one that had left the group.
 */
export const SWEEP_ROUNDS = "1 2 3 4 5 6 7";
/** One round of a sweep, in sh: kills the pids in `$k` with the groups they lead, and those in `$j` alone. */
export const SWEEP_KILL = `k=$(echo $k) j=$(echo $j)
  if [ -z "$k$j" ]; then [ -n "$idle" ] && break; idle=1; continue; fi
  idle=
  for p in $k; do kill -9 -"$p" 2>/dev/null; done
  kill -9 $k $j 2>/dev/null`;

/**
 * `sh -c KILL_SCRIPT strata <pgid> <marker>`: kills the group, then (given a
 * marker) leaves the STOPPED_PREFIX mark and kills every process whose
 * environment carries the marker, with the group it leads, if any (see
 * SWEEP_KILL). Only shell builtins run before the first kill, so it works
 * even when a fork bomb has used up the process limit. Marks older than an
 * hour go (a start that late is not on its way).
 */
export const KILL_SCRIPT = `[ -n "$1" ] && kill -9 -"$1" 2>/dev/null
[ -n "$2" ] || exit 0
: > "${STOPPED_PREFIX}$2" 2>/dev/null
idle= j=
for _ in ${SWEEP_ROUNDS}; do
  k=$(grep -l -z -F "${MARKER_VARIABLE}=$2" /proc/[0-9]*/environ 2>/dev/null | sed 's|^/proc/||; s|/environ$||')
  ${SWEEP_KILL}
done
find /tmp -maxdepth 1 -name '${STOPPED_PREFIX.slice("/tmp/".length)}*' -mmin +60 -exec rm -f {} + 2>/dev/null
exit 0`;

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** Validates a command and its environment the same way for every remote sandbox. */
export function checkCommand(command: string, env: Record<string, string> | undefined): void {
  if (typeof command !== "string") throw errors.invalidArgument("command must be a string");
  if (Buffer.byteLength(command) > MAX_COMMAND_BYTES) {
    throw errors.invalidArgument(`the command is longer than ${MAX_COMMAND_BYTES} bytes; put it in a file and run that`);
  }
  if (command.includes("\0")) throw errors.invalidArgument("the command contains a NUL byte");
  for (const [name, value] of Object.entries(env ?? {})) {
    if (!ENV_NAME.test(name)) throw errors.invalidArgument(`'${name}' is not a valid environment variable name`);
    if (typeof value !== "string" || value.includes("\0")) {
      throw errors.invalidArgument(`environment variable '${name}' must be a string without NUL bytes`);
    }
  }
}

/** A fresh marker value for one run. */
export function newMarker(): string {
  return nodeCrypto().randomUUID();
}

export interface RemoteRunOptions {
  /** The working directory as the caller named it (virtual), for the error when it is missing. */
  cwd: string;
  /** Seconds. */
  timeout: number;
  maxOutputBytes: number;
  /** Output past this many bytes kills the command: endless output is stopped, not drained forever. */
  killAfterBytes: number;
  onOutput?: (chunk: string) => void;
  onData?: (chunk: Uint8Array, stream: "stdout" | "stderr") => void;
  signal?: AbortSignal;
  /** Kills the command's group and, with `sweep`, every process of the run, from a second command. Must not throw. */
  kill: (pgid: number | undefined, sweep: boolean) => Promise<void>;
  /** Closes the transport's stream, giving up on output still in flight. */
  abandon: () => void;
}

/**
 * The state of one wrapped command: the transport feeds it stdout and
 * stderr chunks and tells it when the stream ended; `result` settles then.
 */
export class RemoteRun {
  readonly result: Promise<ExecuteResponse>;
  private readonly output: OutputCollector;
  private resolve!: (response: ExecuteResponse) => void;
  private reject!: (error: unknown) => void;
  private settled = false;
  private pgid: number | undefined;
  private exitStatus: number | undefined;
  private missingCwd = false;
  private timedOut = false;
  private overflowed = false;
  private stderrLine = "";
  private readonly timers: NodeJS.Timeout[] = [];
  /** Whether the run has its answer (an abort, a timeout, a failure): a command not started yet must not be. */
  get finished(): boolean {
    return this.settled;
  }

  private readonly onAbort = () => {
    void this.options.kill(this.pgid, true);
    this.options.abandon();
    this.settle(() => this.reject(this.options.signal!.reason));
  };

  constructor(private readonly options: RemoteRunOptions) {
    this.output = new OutputCollector(options.maxOutputBytes, options.onOutput, options.onData);
    this.result = new Promise((resolve, reject) => {
      this.resolve = resolve;
      this.reject = reject;
    });
    this.timers.push(
      setTimeout(() => {
        this.timedOut = true;
        this.killNow(true);
      }, options.timeout * 1000),
    );
    if (options.signal?.aborted) this.onAbort();
    else options.signal?.addEventListener("abort", this.onAbort, { once: true });
  }

  stdout(chunk: Uint8Array): void {
    this.output.push(chunk, "stdout");
    if (!this.overflowed && this.output.totalBytes > this.options.killAfterBytes) {
      this.overflowed = true;
      this.killNow(true);
    }
  }

  /** The wrapper's reports, one per line; anything else (the shell failing to start, say) is output. */
  stderr(chunk: Uint8Array): void {
    const lines = (this.stderrLine + Buffer.from(chunk).toString("utf8")).split("\n");
    this.stderrLine = lines.pop() ?? "";
    for (const line of lines) {
      const [word, value] = line.split(" ");
      if (word === "strata-pgid") this.pgid = Number(value) || undefined;
      else if (word === "strata-exit") this.commandExited(Number(value));
      else if (word === "strata-nocwd") this.missingCwd = true;
      else this.output.push(Buffer.from(`${line}\n`), "stderr");
    }
  }

  /**
   * The stream ended. `fallbackExitCode` asks the transport when the wrapper
   * reported none (it was killed); it rejects with a StrataError when the
   * transport knows the command's fate is unknown (the connection was lost),
   * which the call then reports instead of an exit code.
   */
  end(fallbackExitCode: () => Promise<number | null>): void {
    if (this.settled) return;
    if (this.stderrLine !== "") this.stderr(Buffer.from("\n"));
    if (this.missingCwd) {
      this.settle(() => this.reject(errors.notFound(this.options.cwd)));
      return;
    }
    if (this.timedOut || this.exitStatus !== undefined) {
      this.finish(this.exitStatus ?? null);
      return;
    }
    fallbackExitCode().then(
      (code) => this.finish(code),
      (error: unknown) => (error instanceof StrataError ? this.fail(error) : this.finish(null)),
    );
  }

  /** The transport failed (the container vanished, the connection dropped). */
  fail(error: unknown): void {
    this.settle(() =>
      this.reject(error instanceof StrataError ? error : new StrataError("unavailable", "The sandbox stopped answering during the command", { cause: error })),
    );
  }

  private commandExited(status: number): void {
    this.exitStatus = status;
    // A background child still holding the output open is killed after a grace period, as LocalSandbox does;
    // one that also left the group is not waited for.
    this.timers.push(setTimeout(() => void this.options.kill(this.pgid, false), SANDBOX_DEFAULTS.killGraceMs));
    this.timers.push(
      setTimeout(() => {
        this.options.abandon();
        this.finish(status);
      }, SANDBOX_DEFAULTS.killGraceMs + KILL_DEADLINE_MS),
    );
  }

  private killNow(sweep: boolean): void {
    void this.options.kill(this.pgid, sweep);
    this.timers.push(
      setTimeout(() => {
        this.options.abandon();
        this.finish(null);
      }, KILL_DEADLINE_MS),
    );
  }

  private finish(code: number | null): void {
    this.settle(() => {
      let text = this.output.text();
      let exitCode = code;
      if (this.timedOut) {
        text += timeoutMessage(this.options.timeout);
        exitCode = TIMEOUT_EXIT_CODE;
      } else if (this.overflowed) {
        text += `\n[Command killed: it wrote more than ${this.options.killAfterBytes} bytes of output]`;
      }
      this.resolve({ output: text, exitCode, truncated: this.output.truncated });
    });
  }

  private settle(action: () => void): void {
    if (this.settled) return;
    this.settled = true;
    for (const timer of this.timers) clearTimeout(timer);
    this.options.signal?.removeEventListener("abort", this.onAbort);
    action();
  }
}
