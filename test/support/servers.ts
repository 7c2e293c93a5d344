/**
 * Real servers for the store tests: the shared ones the service scripts
 * start (read from the environment), and private ones a test may stop,
 * freeze and restart without disturbing other test files.
 */
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { chownSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);

/**
 * The URL of a shared service. Missing means the service scripts did not run:
 * that fails the test file (never a skip), whether or not
 * STRATA_SERVICES_REQUIRED=1 is set, with what to run.
 */
export function serviceUrl(variable: "STRATA_POSTGRES_URL" | "STRATA_REDIS_URL"): string {
  const url = process.env[variable];
  if (url) return url;
  const script = variable === "STRATA_POSTGRES_URL" ? "10-postgres.sh" : "11-redis.sh";
  throw new Error(
    `${variable} is not set${process.env.STRATA_SERVICES_REQUIRED === "1" ? " (STRATA_SERVICES_REQUIRED=1)" : ""}: ` +
      `run \`bash scripts/services/${script} && source .services/env\` first (npm test does this for you)`,
  );
}

/** A TCP port nobody is listening on right now. */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => (typeof address === "object" && address ? resolve(address.port) : reject(new Error("no port"))));
    });
  });
}

/** Polls until `check` resolves, or fails after `seconds`. */
export async function eventually<T>(check: () => Promise<T>, seconds: number, intervalMs = 200): Promise<T> {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    try {
      return await check();
    } catch (error) {
      if (Date.now() > deadline) throw error;
      await new Promise((resolve) => setTimeout(resolve, intervalMs));
    }
  }
}

const isRoot = process.getuid?.() === 0;

/** A PostgreSQL cluster of the test's own, in a temporary folder, on a free loopback port. */
export class PrivatePostgres {
  private constructor(
    private readonly bin: string,
    private readonly dir: string,
    readonly port: number,
  ) {}

  get url(): string {
    return `postgres://postgres@127.0.0.1:${this.port}/postgres`;
  }

  static async create(): Promise<PrivatePostgres> {
    const bin = process.env.STRATA_POSTGRES_BIN ?? newestPostgresBin();
    const dir = mkdtempSync(join(tmpdir(), "strata-pg-"));
    // The server refuses to run as root; as root, the cluster belongs to the postgres user.
    if (isRoot) {
      const [uid, gid] = await Promise.all([run("id", ["-u", "postgres"]), run("id", ["-g", "postgres"])]);
      chownSync(dir, Number(uid.stdout), Number(gid.stdout));
    }
    const server = new PrivatePostgres(bin, dir, await freePort());
    await server.asPostgres("initdb", ["-D", server.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale"]);
    await server.start();
    return server;
  }

  private get data(): string {
    return join(this.dir, "data");
  }

  async start(): Promise<void> {
    const settings = `-c port=${this.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories=${this.dir} -c fsync=off`;
    await this.asPostgres("pg_ctl", ["-D", this.data, "-l", join(this.dir, "log"), "-o", settings, "-w", "-t", "60", "start"]);
  }

  /** `immediate` is a crash as far as clients can tell: every backend dies at once. */
  async stop(mode: "fast" | "immediate" = "immediate"): Promise<void> {
    await this.asPostgres("pg_ctl", ["-D", this.data, "-m", mode, "-w", "-t", "60", "stop"]);
  }

  /** Stops (SIGSTOP) or resumes (SIGCONT) every process of the cluster: a server that hangs. */
  async signal(signal: "SIGSTOP" | "SIGCONT"): Promise<void> {
    const postmaster = Number(readFileSync(join(this.data, "postmaster.pid"), "utf8").split("\n")[0]);
    for (const pid of [postmaster, ...childrenOf(postmaster)]) {
      try {
        process.kill(pid, signal);
      } catch (error) {
        // A backend listed a moment ago may have exited since (ESRCH): it has nothing left to stop or resume.
        if ((error as NodeJS.ErrnoException).code !== "ESRCH" || pid === postmaster) throw error;
      }
    }
  }

  async dispose(): Promise<void> {
    await this.stop("immediate").catch(() => {});
    rmSync(this.dir, { recursive: true, force: true });
  }

  private async asPostgres(program: string, args: string[]): Promise<void> {
    const command = join(this.bin, program);
    await (isRoot ? run("runuser", ["-u", "postgres", "--", command, ...args]) : run(command, args));
  }
}

/** A Redis server of the test's own, in the foreground (no persistence), on a free loopback port. */
export class PrivateRedis {
  private process: ChildProcess | undefined;

  private constructor(readonly port: number) {}

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  static async create(): Promise<PrivateRedis> {
    const server = new PrivateRedis(await freePort());
    await server.start();
    return server;
  }

  async start(): Promise<void> {
    const child = spawn("redis-server", ["--port", String(this.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], {
      stdio: "ignore",
    });
    this.process = child;
    await eventually(async () => {
      if (child.exitCode !== null) throw new Error(`redis-server exited with ${child.exitCode}`);
      const { stdout } = await run("redis-cli", ["-h", "127.0.0.1", "-p", String(this.port), "ping"]);
      if (stdout.trim() !== "PONG") throw new Error("redis not ready");
    }, 20);
  }

  /** Kills the server outright (SIGKILL), as a crash would. */
  async stop(): Promise<void> {
    const child = this.process;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((resolve) => child.once("exit", resolve));
    child.kill("SIGKILL");
    await exited;
  }

  signal(signal: "SIGSTOP" | "SIGCONT"): void {
    this.process?.kill(signal);
  }

  async dispose(): Promise<void> {
    this.signal("SIGCONT");
    await this.stop();
  }
}

function newestPostgresBin(): string {
  const versions = readdirSync("/usr/lib/postgresql").sort((a, b) => Number(b) - Number(a));
  if (!versions[0]) throw new Error("PostgreSQL server binaries not found: run scripts/services/10-postgres.sh");
  return `/usr/lib/postgresql/${versions[0]}/bin`;
}

function childrenOf(pid: number): number[] {
  const children = readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim();
  return children === "" ? [] : children.split(/\s+/).map(Number);
}

/** The exact content the crash-writer child writes to file `i`: long, and different for every file. */
export function crashContent(i: number): string {
  const line = `file ${i}: ${"the quick brown fox jumps over the lazy dog ".repeat(4)}\n`;
  return `${line.repeat(120)}end of file ${i}\n`;
}
