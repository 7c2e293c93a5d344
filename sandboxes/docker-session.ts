/**
 * Reused exec sessions for DockerSandbox. Creating an exec, starting it,
 * attaching and inspecting it are four daemon requests (about 50 ms on a
 * loaded machine); a command run by a shell that is already running costs a
 * fork. So a session is one long-lived exec running SUPERVISOR, a small sh
 * loop that reads one request at a time from its stdin and runs it; the
 * sandbox keeps a few idle sessions per user and opens another when all are
 * busy, so concurrent commands never wait for each other.
 *
 * Framing. A request is a line of sh (or a length line and that many bytes
 * when long), built here with every value quoted, never from a caller's
 * text. It runs the command with its stdout and stderr going into a pipe of
 * its own, copied to the session's stdout by `cat`; when `cat` ends (every
 * holder of the pipe has closed it: the command and anything it left
 * running), the supervisor writes an end marker with a random token on
 * stdout and a done line with the same token on stderr. Docker reads the
 * two streams apart, so a request is over when both have arrived. A command
 * cannot end another's output early: it never sees the token of a later
 * request (it is not in any process's argv or environment).
 *
 * What a session does not change: every command still runs under the
 * shared WRAPPER in a process group of its own (setsid), with the same
 * prelude report, so timeouts, aborts and close() kill it exactly as a
 * command of its own exec (from a second exec, KILL in docker.ts). A command
 * that kills the supervisor ends its session: the call still answers (the
 * stream's end is the end), and the next command opens a new session.
 * Stdin reaches a command through `dd` reading exactly its length from the
 * session's stdin; a request whose stdin may not have been read whole (it
 * was killed before the drain) closes its session rather than let the rest
 * be read as the next request.
 *
 * Sessions run as root only, uid 0 (a session shell of an unprivileged user
 * could be reached by that user's processes through /proc/PID/fd); one that
 * drops runs with the user's group (SUPERVISOR). The user's
 * commands are requests on root's sessions that drop to the user for the
 * command alone (docker.ts, droppedBody): the framing, the reports and the
 * status are written by root, and the user's process holds no descriptor
 * of the session's.
 */
import { type Duplex, Writable } from "node:stream";
import type Docker from "dockerode";
import { shellQuote } from "./shell.js";
import { nodeCrypto } from "../stores/lazy-builtins.js";

/** Requests up to this many bytes travel as one line (sh's read takes a byte per call); longer ones as a length and raw bytes read by dd. */
const LINE_REQUEST_BYTES = 2048;
/** Stdin up to this size goes through a session; more (or a stream) takes an exec of its own. */
export const SESSION_STDIN_BYTES = 1024 * 1024;
/** Idle sessions kept per user. Each is one sh process in the container, counted against its process limit. */
const MAX_IDLE = 4;
/** An idle session ends after this long unused (an agent's commands come seconds apart; a forgotten sandbox's go away). */
const IDLE_MS = 30_000;
/** How long a new session's shell may take to say it is ready. */
const OPEN_TIMEOUT_MS = 10_000;

/**
 * `sh -c SUPERVISOR strata-session <wrapper> [<uid> <gid>]`: says whether it
 * can run commands (setsid is how each gets a process group of its own)
 * and, given the ids of an unprivileged user, how it drops to that user per
 * request, and the home directory Docker would give that uid (its first
 * /etc/passwd entry's, "/" without one); then runs requests until its stdin
 * ends. A dropping session is an exec of "0:<gid>", so Docker already gave
 * it the user's group and groups, as an exec of "uid:gid" gets them: the
 * drop is setpriv with --reuid (util-linux's; it sets the groups again), or
 * else BusyBox's `nsenter -S` (setuid alone: BusyBox's setpriv has no
 * --reuid, and nsenter -G would clear the supplementary groups). A way is
 * taken only once a shell it started reported, from /proc/self/status,
 * exactly the user's ids, the group as the only supplementary one and no
 * effective capability. Fd 3 is the session's stderr, where the requests'
 * reports go (a request's own stderr may be silenced). Ready line:
 * "strata-session ready" or "strata-session ready <setpriv|nsenter> <home>".
 */
const SUPERVISOR = `NL='
'
WRAP=$1
exec 3>&2
command -v setsid >/dev/null 2>&1 || { echo "strata-session nosetsid" >&2; exit 0; }
D=
if [ -n "$2" ]; then
  C='while read -r k a b c d; do case $k in Uid:) u="$a $b $c $d";; Gid:) g="$a $b $c $d";; Groups:) G="$a|$b";; CapEff:) e=$a;; esac; done </proc/self/status
[ "$u" = "$1 $1 $1 $1" ] && [ "$g" = "$2 $2 $2 $2" ] && [ "$G" = "$2|" ] && [ "$e" = 0000000000000000 ]'
  if setpriv --reuid="$2" --regid="$3" --groups="$3" -- /bin/sh -c "$C" strata "$2" "$3" </dev/null >/dev/null 2>&1; then D=setpriv
  elif nsenter -F -S "$2" -- /bin/sh -c "$C" strata "$2" "$3" </dev/null >/dev/null 2>&1; then D=nsenter
  fi
fi
if [ -n "$D" ]; then
  H=/
  if [ -r /etc/passwd ]; then while IFS=: read -r _ _ u _ _ h _; do [ "$u" = "$2" ] && { H=$h; break; }; done </etc/passwd; fi
  echo "strata-session ready $D $H" >&2
else
  echo "strata-session ready" >&2
fi
unset C D H u h
while IFS= read -r q; do
  case $q in
    N*) q=$(dd bs="\${q#N}" count=1 iflag=fullblock 2>/dev/null) ;;
    *) q=\${q#L} ;;
  esac
  eval "$q"
done`;

/** A value quoted for sh without a raw newline, so a request stays one line ("$NL" is a newline in the supervisor). */
export function lineQuote(value: string): string {
  return shellQuote(value).replace(/\n/g, `'"$NL"'`);
}

/** The program a root session drops to the user with (SUPERVISOR). */
export type DropTool = "setpriv" | "nsenter";

/** What one request reports back, beside its stdout. */
export interface RequestHandlers {
  stdout(chunk: Uint8Array): void;
  /** A stderr line that is not the session's own (the wrapper's reports and anything else the command's shell wrote there). */
  stderrLine(line: string): void;
  /**
   * The request is over: `status` is the exit status the supervisor saw
   * (undefined when the session ended first); `received` tells whether any
   * byte of the request's came back (if not, it never started).
   */
  end(outcome: { status: number | undefined; received: boolean; sessionEnded: boolean }): void;
}

/** One long-lived exec running SUPERVISOR. */
export class ExecSession {
  /** False once the stream ended or was destroyed, or a request left it unusable. */
  usable = true;
  /** Ends the session when it stayed idle too long. */
  idleTimer: NodeJS.Timeout | undefined;
  private current: { token: string; marker: Buffer; handlers: RequestHandlers; sawMarker: boolean; sawDone: boolean; status?: number; received: boolean } | undefined;
  private tail: Buffer = Buffer.alloc(0);
  private stderrPartial = "";
  /** Set until the supervisor's first line: true ready, false no setsid, undefined it never answered. */
  private ready: ((ok: boolean | undefined) => void) | undefined;
  /**
   * How a root session drops to the user it was opened for (`open`'s
   * `drop`) and the home directory Docker gives that user; undefined when it
   * cannot drop (the user's work then takes an exec each).
   */
  drop: { via: DropTool; home: string } | undefined;

  private constructor(private readonly stream: Duplex) {}

  /**
   * Opens a session as `user`: "unsupported" when the image cannot run one
   * (no setsid); throws when the exec cannot start or its shell does not
   * answer (a full process table, a stopped container). With `drop`, `user`
   * is "0:<drop.gid>" (see SUPERVISOR).
   */
  static async open(
    client: Docker,
    container: Docker.Container,
    user: string,
    wrapper: string,
    drop?: { uid: string; gid: string },
  ): Promise<ExecSession | "unsupported"> {
    const exec = await container.exec({
      Cmd: ["/bin/sh", "-c", SUPERVISOR, "strata-session", wrapper, ...(drop === undefined ? [] : [drop.uid, drop.gid])],
      User: user,
      AttachStdin: true,
      AttachStdout: true,
      AttachStderr: true,
      Tty: false,
    });
    const stream = await exec.start({ hijack: true, stdin: true });
    const session = new ExecSession(stream);
    const ready = new Promise<boolean | undefined>((resolve) => (session.ready = resolve));
    client.modem.demuxStream(stream, sink((chunk) => session.onStdout(chunk)), sink((chunk) => session.onStderr(chunk)));
    const ended = () => session.onEnd();
    stream.on("end", ended).on("close", ended).on("error", ended);
    const timer = setTimeout(() => session.ready?.(undefined), OPEN_TIMEOUT_MS);
    const answer = await ready;
    clearTimeout(timer);
    if (answer === true) {
      // An idle session must not keep the process alive (a program that forgets close()); a request in flight does.
      session.hold(false);
      return session;
    }
    session.destroy();
    if (answer === false) return "unsupported";
    throw new Error("the session's shell did not start");
  }

  get busy(): boolean {
    return this.current !== undefined;
  }

  /**
   * Sends one request: `body(token)` is the sh to run, which must end by
   * printing the end marker (`endMarker(token)`), then the done line
   * (`doneLine(token)`). `stdin` follows the request on the session's stdin
   * (the body reads exactly its length).
   */
  send(body: (token: string) => string, handlers: RequestHandlers, stdin?: Uint8Array): void {
    const token = nodeCrypto().randomUUID().replace(/-/g, "");
    const script = body(token);
    this.current = { token, marker: Buffer.from(`\0E${token}\n`, "latin1"), handlers, sawMarker: false, sawDone: false, received: false };
    this.tail = Buffer.alloc(0);
    const length = Buffer.byteLength(script);
    const header = length <= LINE_REQUEST_BYTES && !script.includes("\n") ? `L${script}\n` : `N${length}\n${script}`;
    if (!this.usable) {
      queueMicrotask(() => this.onEnd());
      return;
    }
    this.hold(true);
    this.stream.write(header);
    if (stdin && stdin.length > 0) this.stream.write(stdin);
  }

  /** Refs or unrefs the connection: only a session with a request in flight keeps the process alive. */
  hold(busy: boolean): void {
    const socket = this.stream as Duplex & { ref?: () => void; unref?: () => void };
    if (busy) socket.ref?.();
    else socket.unref?.();
  }

  /** Keeps the session from being reused (its stdin may hold bytes a request did not read). */
  retire(): void {
    this.usable = false;
  }

  /** Stops using the session: its stream is closed, which ends the supervisor (and, through its stdin, nothing else). */
  destroy(): void {
    this.usable = false;
    this.stream.destroy();
  }

  /** Ends the supervisor by closing its stdin (an idle session let go). */
  close(): void {
    this.usable = false;
    this.stream.end();
    setTimeout(() => this.stream.destroy(), 1000).unref();
  }

  private onStdout(chunk: Uint8Array): void {
    const request = this.current;
    if (!request || request.sawMarker) return; // Output of no request in flight: a straggler of an earlier command, dropped.
    request.received = true;
    const data = this.tail.length > 0 ? Buffer.concat([this.tail, chunk]) : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    const at = data.indexOf(request.marker);
    if (at !== -1) {
      if (at > 0) request.handlers.stdout(data.subarray(0, at));
      this.tail = Buffer.alloc(0);
      request.sawMarker = true;
      this.maybeDone();
      return;
    }
    // Keep back a tail that could be the start of the marker (it begins with a NUL, rare in text).
    let keep = 0;
    const from = Math.max(0, data.length - request.marker.length + 1);
    for (let i = data.indexOf(0, from); i !== -1; i = data.indexOf(0, i + 1)) {
      if (request.marker.subarray(0, data.length - i).equals(data.subarray(i))) {
        keep = data.length - i;
        break;
      }
    }
    if (data.length > keep) request.handlers.stdout(data.subarray(0, data.length - keep));
    this.tail = keep > 0 ? Buffer.from(data.subarray(data.length - keep)) : Buffer.alloc(0);
  }

  private onStderr(chunk: Uint8Array): void {
    const lines = (this.stderrPartial + Buffer.from(chunk).toString("utf8")).split("\n");
    this.stderrPartial = lines.pop() ?? "";
    for (const line of lines) this.stderrLine(line);
  }

  private stderrLine(line: string): void {
    if (this.ready) {
      if (line.startsWith("strata-session ")) {
        const ready = this.ready;
        this.ready = undefined;
        const dropping = /^strata-session ready (setpriv|nsenter) (.*)$/.exec(line);
        if (dropping) this.drop = { via: dropping[1] as DropTool, home: dropping[2]! };
        ready(line === "strata-session ready" || dropping !== null);
      }
      return;
    }
    const request = this.current;
    if (!request) return;
    request.received = true;
    if (line.startsWith("strata-status ")) {
      request.status = Number(line.slice(14));
    } else if (line === `strata-done ${request.token}`) {
      request.sawDone = true;
      this.maybeDone();
    } else {
      request.handlers.stderrLine(line);
    }
  }

  private maybeDone(): void {
    const request = this.current;
    if (!request || !request.sawMarker || !request.sawDone) return;
    this.current = undefined;
    this.hold(false);
    request.handlers.end({ status: request.status, received: true, sessionEnded: false });
  }

  private onEnd(): void {
    this.usable = false;
    if (this.ready) {
      const ready = this.ready;
      this.ready = undefined;
      ready(undefined);
    }
    const request = this.current;
    this.current = undefined;
    if (!request) return;
    if (this.tail.length > 0) request.handlers.stdout(this.tail);
    this.tail = Buffer.alloc(0);
    if (this.stderrPartial !== "") {
      const line = this.stderrPartial;
      this.stderrPartial = "";
      if (!line.startsWith("strata-")) request.handlers.stderrLine(line);
    }
    request.handlers.end({ status: request.status, received: request.received, sessionEnded: true });
  }
}

/** The sh that ends a request: the end marker on stdout (after everything the request wrote there). */
export function endMarker(token: string): string {
  return `printf '\\000E%s\\n' ${token}`;
}

/** The done line on stderr (after every report the request wrote there). */
export function doneLine(token: string): string {
  return `echo "strata-done ${token}" >&3`;
}

/** Idle sessions of one user, and a way to open more. */
export class SessionPool {
  private readonly idle: ExecSession[] = [];
  private readonly all = new Set<ExecSession>();
  /** Set once the image turned out unable to run a session: every run takes an exec of its own. */
  unsupported = false;

  constructor(private readonly open: () => Promise<ExecSession | "unsupported">) {}

  /** An idle session, or a new one; undefined when sessions cannot run in this container. Throws when a new one cannot start. */
  async acquire(): Promise<ExecSession | undefined> {
    for (let session = this.idle.pop(); session; session = this.idle.pop()) {
      clearTimeout(session.idleTimer);
      if (session.usable) return session;
      this.all.delete(session);
    }
    if (this.unsupported) return undefined;
    const session = await this.open();
    if (session === "unsupported") {
      this.unsupported = true;
      return undefined;
    }
    this.all.add(session);
    return session;
  }

  /** Hands a session back after its request: kept if still usable and there is room, else ended. */
  release(session: ExecSession): void {
    if (!session.usable || session.busy) {
      if (session.usable) session.destroy();
      this.all.delete(session);
      return;
    }
    if (this.idle.length >= MAX_IDLE) {
      session.close();
      this.all.delete(session);
      return;
    }
    this.idle.push(session);
    session.idleTimer = setTimeout(() => {
      const at = this.idle.indexOf(session);
      if (at !== -1) this.idle.splice(at, 1);
      this.all.delete(session);
      session.close();
    }, IDLE_MS).unref();
  }

  /** Ends every session (close()). */
  destroyAll(): void {
    for (const session of this.all) {
      clearTimeout(session.idleTimer);
      session.destroy();
    }
    this.all.clear();
    this.idle.length = 0;
  }
}

/** A Writable that hands each chunk to `write`. */
function sink(write: (chunk: Uint8Array) => void): Writable {
  return new Writable({
    write(chunk: Uint8Array, _encoding, done) {
      write(chunk);
      done();
    },
  });
}
